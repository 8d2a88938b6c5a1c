"""Issue 18's white-box attacks through whole rollouts: the scripted policy (tests/fakes/policy.py)
makes FIFOs, links and floods of output with the bash tool, then aims the file tools at them. The
rollouts must end normally and quickly, reveal nothing from outside the workspace, and leave the
engine able to run more rollouts."""

import asyncio
import json

import pytest

from harness_env import Endpoint, RolloutRequest, Task, run_rollout

pytestmark = pytest.mark.e2e


def call(name, **args):
    return {"call": name, "arguments": json.dumps(args)}


@pytest.fixture
def make_request(policy_server):
    def make(script, *, model="wb", **kw):
        policy_server.policy.scripts[model] = script
        kw.setdefault("agent_timeout_s", 60)
        return RolloutRequest(
            task=Task(instruction="Create hello.txt.", verify=["test -f hello.txt"]),
            endpoint=Endpoint(base_url=policy_server.base_url, api_key="k", model=model),
            harness="whitebox",
            **kw,
        )

    return make


def tool_replies(policy_server, model):
    last = [r for r in policy_server.policy.tool_requests() if r["model"] == model][-1]
    return [m["content"] for m in last["messages"] if m["role"] == "tool"]


async def test_fifo_rollouts_end_and_the_next_rollout_still_runs(policy_server, make_request):
    # Eight rollouts read and write a FIFO at once (more than the default executor's worker
    # threads on a small machine); then one more rollout must run as usual.
    script = [
        {"bash": "mkfifo pipe && touch hello.txt"},
        call("read", path="pipe"),
        call("write", path="pipe", content="x"),
        call("edit", path="pipe", old_string="a", new_string="b"),
        {"text": "done"},
    ]
    # A tool blocked on the FIFO shows in its reply (a timeout, not the refusal); wait_for bounds a hang.
    results = await asyncio.wait_for(asyncio.gather(*(run_rollout(make_request(script, model=f"fifo{i}")) for i in range(8))), 90)
    for i, res in enumerate(results):
        assert res.error is None and res.reward == 1.0 and res.agent_tool_calls == 4, res.error
        replies = tool_replies(policy_server, f"fifo{i}")
        assert all("pipe is not a regular file (FIFO)" in r for r in replies[1:]), replies
    after = await asyncio.wait_for(run_rollout(make_request([{"bash": "touch hello.txt"}, {"text": "ok"}], model="after")), 30)
    assert after.error is None and after.reward == 1.0


async def test_links_made_by_the_policy_lead_nowhere(policy_server, make_request, tmp_path):
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret.txt").write_text("host secret\n")
    script = [
        {"bash": f"ln -s {host} h && ln -s / root && ln -s /proc p && ln -s {host}/secret.txt s.txt && touch hello.txt"},
        call("glob", pattern="**"),
        call("glob", pattern="root/*"),
        call("read", path="h/secret.txt"),
        call("read", path="s.txt"),
        call("ls", path="p"),
        call("write", path="s.txt", content="forged\n"),
        {"text": "done"},
    ]
    res = await run_rollout(make_request(script))
    assert res.error is None and res.reward == 1.0
    replies = tool_replies(policy_server, "wb")
    assert replies[1].splitlines() == ["h", "hello.txt", "p", "root", "s.txt"]
    assert replies[2] == "no files match"
    assert all("is a symbolic link; the file tools do not follow links" in r for r in replies[3:]), replies
    assert not any("host secret" in r for r in replies)
    assert (host / "secret.txt").read_text() == "host secret\n"


async def test_huge_output_and_huge_files_reach_the_model_bounded_and_counted(policy_server, make_request):
    script = [
        {"bash": "yes aaaaaaaaa | head -c 300000000; touch hello.txt"},
        {"bash": "head -c 209715200 /dev/zero | tr '\\0' a > big.txt"},
        call("read", path="big.txt"),
        {"text": "done"},
    ]
    res = await run_rollout(make_request(script))
    assert res.error is None and res.reward == 1.0
    flood, _, page = tool_replies(policy_server, "wb")
    assert flood.startswith(f"[... {300_000_000 - 16 * 1024} bytes cut ...]\n") and flood.endswith("aaaaaaaaa\n[exit code 0]")
    assert len(page.encode()) < 16 * 1024 + 500
    assert "line cut: over 8388608 bytes" in page and "big.txt is 209715200 bytes" in page
