"""End to end, one suite for every harness: the real CLI (or the white-box loop), in the real
sandbox, through the capture proxy, against the scripted fake policy."""

import json
import os

import pytest

from harness_env import Endpoint, RolloutRequest, Task, run_rollout, run_rollout_sync
from harness_env.core.sandbox.backends import SandboxSettings
from harness_env.core.sandbox.local import _marked_pids
from harness_env.rollout import local_sandboxes, loopback_proxy, run_many_sync
from tests.envs.harnesses import CLI_HARNESSES, HARNESSES, installed
from tests.fakes.policy import _text_of, compact_arguments

UPSTREAM_KEY = "sk-upstream-e2e-9f8e7d"
SHELL_TOOL = {"codex": "exec_command", "claude-code": "Bash", "gemini-cli": "run_shell_command"}  # the harness's own shell tool, where it is not "bash"
pytestmark = pytest.mark.e2e


@pytest.fixture(params=HARNESSES)
def harness(request):
    return installed(request.param)


@pytest.fixture
def make_request(policy_server, harness):
    def make(script, *, verify=(), setup=(), files=None, **kw):
        policy_server.policy.scripts["policy-m"] = script
        task = Task(instruction="Create hello.txt containing hello.", verify=list(verify), setup=list(setup), files=files or {}, task_id="t1")
        kw.setdefault("agent_timeout_s", 60)
        endpoint = Endpoint(base_url=policy_server.base_url, api_key=UPSTREAM_KEY, model="policy-m")
        return RolloutRequest(task=task, endpoint=endpoint, harness=harness, **kw)

    return make


def _policy_requests(srv):
    """What the harness asked the policy with tools (OpenCode also asks for a title without)."""
    return srv.policy.tool_requests()


def _no_process_left(result):
    assert result.sandbox_id
    assert _marked_pids(result.sandbox_id) == []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            except OSError:
                continue
            assert result.sandbox_id.encode() not in cmd, cmd


async def test_agent_doing_the_work_gets_reward_1_and_exact_tokens(policy_server, make_request, harness):
    events = []
    req = make_request([{"bash": "echo hello > hello.txt"}, {"text": "Created it."}], verify=["grep -qx hello hello.txt"], top_logprobs=2)
    res = await run_rollout(req, on_event=events.append)
    assert res.error is None, res.error
    assert res.reward == 1.0 and res.reward_source == "verify_ratio"
    assert res.agent_exit_code == 0 and res.agent_tool_calls == 1 and res.agent_final_text == "Created it."
    assert res.files["hello.txt"] == "hello\n"
    assert res.capture_level == "tokens" and res.harness == harness and res.task_id == "t1"
    # The captured turns carry exactly what the engine sent.
    sent = [s for s in policy_server.policy.sent if s.request.get("tools")]
    policy_turns = [t for t in res.proxy_turns if t.purpose == "policy"]
    assert len(policy_turns) == len(sent) == 2
    auxiliary = [t for t in res.proxy_turns if t.purpose == "auxiliary"]
    assert len(auxiliary) == (1 if harness == "opencode" else 0)  # OpenCode's title request, kept in the trace
    for turn, s in zip(policy_turns, sent):
        assert turn.prompt_token_ids == s.prompt_token_ids and turn.prompt_token_ids
        assert turn.completion_token_ids == s.completion_token_ids and turn.completion_token_ids
        assert turn.per_token_logps == s.logprobs
        assert turn.stream is (harness in CLI_HARNESSES) and (turn.ttft_s is not None) == turn.stream
    assert policy_turns[0].tool_calls[0]["function"]["name"] == SHELL_TOOL.get(harness, "bash")
    # Training rows hold the policy turns only: the auxiliary title turn stays out.
    rows = res.training_rows()
    assert rows and all(r.trainable and r.reward == 1.0 for r in rows)
    assert sorted(i for r in rows for i in r.turn_indices) == [t.index for t in policy_turns]
    assert res.graph.auxiliary_turns == len(auxiliary) and res.graph.branches == len(rows)
    assert res.graph.trainable_tokens == res.graph.sampled_tokens == sum(len(t.completion_token_ids) for t in policy_turns)
    assert res.graph.trained_share == 1.0 and res.graph.auxiliary_tokens == sum(len(t.completion_token_ids) for t in auxiliary)
    # Phases happened in order and were emitted live, before the end.
    assert [p.name for p in res.phases] == ["endpoint", "sandbox", "setup", "agent", "verify", "collect"]
    started = [e.phase for e in events if e.status == "started"]
    assert started == ["endpoint", "sandbox", "setup", "agent", "verify", "collect"]
    assert any(e.phase == "agent" and e.status == "info" for e in events)
    assert events[-1].phase == "done"
    _no_process_left(res)


@pytest.mark.parametrize("dump", [compact_arguments, json.dumps], ids=["compact", "spaced"])
async def test_a_multi_call_rollout_with_compact_arguments_is_one_branch(policy_server, make_request, harness, dump):
    """Issue 26 (item 2): a model that writes its tool arguments compactly, in raw UTF-8 (as models
    do; json.dumps would space and escape them), gets them back byte for byte in every later prompt,
    whatever the harness does with them (Claude Code and Gemini CLI hold them as objects): three
    model calls are one branch, one training row, not one per call. And the other way round: Pi and
    OpenCode parse the engine's spaced, escaped arguments and write them back compact."""
    policy_server.policy.dump_arguments = dump
    script = [{"bash": "echo héllo > hello.txt"}, {"bash": "cat hello.txt"}, {"text": "Wrote it."}]
    res = await run_rollout(make_request(script, verify=["grep -qx héllo hello.txt"]))
    assert res.error is None and res.reward == 1.0, (res.error, res.agent_log_tail[-1500:], res.proxy_log_tail[-3000:])
    sampled = [c["function"]["arguments"] for s in policy_server.policy.sent for c in s.tool_calls]
    assert len(sampled) == 2 and all(a == dump(json.loads(a)) for a in sampled), sampled
    policy_turns = [t for t in res.proxy_turns if t.purpose == "policy"]
    assert len(policy_turns) == 3 and [t.branch for t in policy_turns] == [0, 0, 0], [(t.index, t.branch, t.parent) for t in policy_turns]
    assert res.graph.branches == 1 and [r.branch for r in res.training_rows()] == [0]
    replayed = [c["function"]["arguments"] for m in policy_turns[-1].request_messages for c in m.get("tool_calls") or ()]
    assert replayed == sampled  # byte for byte what the engine wrote


async def test_agent_not_doing_the_work_gets_0(policy_server, make_request):
    res = await run_rollout(make_request([{"text": "I will not."}], verify=["test -f hello.txt"]))
    assert res.error is None and res.reward == 0.0 and res.agent_tool_calls == 0


async def test_agent_cannot_forge_the_reward_file(policy_server, make_request):
    forge = (
        "for f in ../verifier/reward.txt /logs/verifier/reward.txt /root/logs/verifier/reward.txt; do mkdir -p $(dirname $f); echo 1.0 > $f; done; echo forged"
    )
    res = await run_rollout(make_request([{"bash": forge}, {"text": "done"}], verify=["test -f hello.txt"]))
    assert res.error is None
    assert res.reward == 0.0 and res.reward_source == "verify_ratio"


async def test_verify_written_reward_at_pi_env_and_harbor_paths(policy_server, make_request):
    verify = ["test -f hello.txt && echo 0.25 > /root/logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt"]
    res = await run_rollout(make_request([{"bash": "touch hello.txt"}, {"text": "ok"}], verify=verify))
    assert res.sandbox_backend == "bwrap"
    assert res.reward == 0.25 and res.reward_source == "reward_file"


async def test_hanging_policy_hits_the_agent_timeout_and_leaves_nothing(policy_server, make_request):
    res = await run_rollout(make_request([{"hang": 120}], verify=["true"], agent_timeout_s=4))
    assert res.error_kind == "agent_timeout" and res.reward is None
    assert res.verify_results == []  # verify does not run after an infrastructure failure
    _no_process_left(res)  # the conftest also checks the rollout directory is gone


async def test_unreachable_endpoint_gives_endpoint_error(policy_server, make_request):
    req = make_request([], verify=["true"])
    req.endpoint.base_url = "http://127.0.0.1:9/v1"
    res = await run_rollout(req)
    assert res.error_kind == "endpoint" and res.reward is None and "unreachable" in res.error


async def test_failing_endpoint_is_an_endpoint_error_with_no_reward(policy_server, make_request):
    res = await run_rollout(make_request([{"status": 500}], verify=["true"], agent_timeout_s=60))
    assert res.error_kind == "endpoint" and res.reward is None and res.verify_results == []
    assert any(t.upstream_status == 500 for t in res.proxy_turns)


async def test_policy_request_rejected_by_the_endpoint_is_an_agent_error(policy_server, make_request):
    # Every call rejected: nothing of the policy's exists, so there is nothing to grade yet.
    res = await run_rollout(make_request([{"status": 400}] * 10, verify=["true"], agent_timeout_s=60))
    assert res.error_kind == "agent_error" and res.reward is None and "400" in res.error


async def test_failed_setup_stops_before_the_agent(policy_server, make_request):
    res = await run_rollout(make_request([{"bash": "true"}], setup=["echo preparing", "exit 3"], verify=["true"]))
    assert res.error_kind == "setup" and res.reward is None
    assert [r.exit_code for r in res.setup_results] == [0, 3]
    assert _policy_requests(policy_server) == []


async def test_turn_limit_ends_the_agent_and_still_verifies(policy_server, make_request):
    script = [{"bash": "echo hello > hello.txt"}, {"bash": "echo again"}, {"bash": "echo more"}, {"text": "done"}]
    res = await run_rollout(make_request(script, verify=["test -f hello.txt"], max_turns=1))
    assert res.turn_limit_hit and res.reward == 1.0
    assert len(_policy_requests(policy_server)) == 1


@pytest.mark.parametrize("use_bwrap", [True, False])
async def test_upstream_key_never_reaches_the_sandbox(policy_server, make_request, monkeypatch, use_bwrap, harness):
    monkeypatch.setenv("OPENAI_API_KEY", "host-env-secret-1234")
    # Every file of the rollout (.. is the rollout directory) is searched; the pattern is written
    # so that it does not itself contain the key.
    spy = (
        "env > env.txt; ps -eo args > ps.txt; cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' ' > cmdlines.txt; "
        "(grep -rlE 'sk-upstream-e2e-9f8e7[d]' .. ~ $TMPDIR 2>/dev/null || true) > grep.txt"
    )
    sandboxes = local_sandboxes(SandboxSettings(use_bwrap=use_bwrap))
    res = await run_rollout(make_request([{"bash": spy}, {"text": "looked"}], verify=["true"]), sandbox_factory=sandboxes)
    assert res.error is None, res.error
    assert {"env.txt", "ps.txt", "cmdlines.txt"} <= set(res.files)
    agent_lines = [
        ln
        for ln in res.files["ps.txt"].splitlines()
        if ln.strip() == "pi" or "cli.js" in ln or "opencode run" in ln or "codex exec" in ln or "claude -p" in ln or "gemini.js" in ln
    ]
    if harness in CLI_HARNESSES:
        assert agent_lines, res.files["ps.txt"]  # the agent's own process was visible to the spy
    everything = res.model_dump_json()
    assert UPSTREAM_KEY not in everything
    assert "host-env-secret-1234" not in everything
    assert res.files["grep.txt"].strip() == ""


def test_sync_twin_and_dict_input(policy_server, make_request):
    req = make_request([{"bash": "echo hello > hello.txt"}, {"text": "ok"}], verify=["test -f hello.txt"])
    res = run_rollout_sync(req.model_dump(mode="json") | {"endpoint": {"base_url": policy_server.base_url, "api_key": "k", "model": "policy-m"}})
    assert res.reward == 1.0


def test_in_process_rollouts_record_the_weight_version_they_are_given(policy_server) -> None:
    """A trainer running rollouts in its own process names the version its policy serves (as PUT
    /policy/weights tells a server): every model call of the batch records it; unnamed, none."""
    policy_server.policy.scripts["policy-m"] = [{"bash": "echo hello > hello.txt"}, {"text": "ok"}]
    task = Task(instruction="Create hello.txt containing hello.", verify=["test -f hello.txt"])
    req = RolloutRequest(task=task, endpoint=Endpoint(base_url=policy_server.base_url, model="policy-m"), harness="whitebox")

    def versions(results) -> list[list[int | None]]:
        assert all(r.reward == 1.0 for r in results), [r.error for r in results]
        return [[t.weight_version for t in r.proxy_turns if t.purpose == "policy"] for r in results]

    assert versions(run_many_sync([req, req], concurrency=2, weight_version=3)) == [[3, 3], [3, 3]]
    assert versions(run_many_sync([req])) == [[None, None]]


async def test_tool_efficiency_reward_uses_the_harness_verified_count(policy_server, make_request):
    req = make_request([{"bash": "echo hello > hello.txt"}, {"text": "ok"}], verify=["test -f hello.txt"], reward_mode="tool_efficiency")
    res = await run_rollout(req)
    assert res.agent_tool_calls == 1 and res.reward == pytest.approx(1.09375)


# vLLM's validation errors quote the input: an agent can make any field's name appear in a 400.
HOSTILE_400 = json.dumps(
    {
        "object": "error",
        "type": "BadRequestError",
        "param": "logprobs",
        "code": 400,
        "message": "[{'type': 'float_parsing', 'loc': ('body', 'temperature'), 'msg': 'Input should be a valid number', "
        "'input': 'logprobs top_logprobs return_token_ids chat_template_kwargs'}]",
    }
)


async def test_one_rollouts_rejected_call_changes_no_rollouts_capture(policy_server, make_request, harness):
    """Issue 25 (critical 3): a 400 quoting the capture fields, answered to one rollout's call,
    leaves the next rollout on the same proxy and endpoint captured at token level."""
    policy = policy_server.policy
    honest = make_request([{"bash": "echo hello > hello.txt"}, {"text": "Created it."}], verify=["grep -qx hello hello.txt"], top_logprobs=2)
    policy.scripts["hostile"] = [{"bash": "echo logprobs"}, {"raw": HOSTILE_400, "status": 400}]
    hostile = honest.model_copy(update={"task": honest.task.model_copy(update={"instruction": "[tag:hostile] " + honest.task.instruction})})
    async with loopback_proxy():  # one proxy for both, as in a server
        first = await run_rollout(hostile)
        n = len(policy.sent)
        second = await run_rollout(honest)
    turns = [(t.purpose, t.upstream_status, (t.upstream_error or "")[:60], str(t.request_messages)[:300]) for t in first.proxy_turns]
    assert any(t.upstream_status == 400 and "float_parsing" in (t.upstream_error or "") for t in first.proxy_turns), (turns, first.error)
    assert second.error is None and second.reward == 1.0 and second.capture_level == "tokens", (
        second.error,
        second.proxy_log_tail[-1500:],
        second.agent_log_tail[-1500:],
    )
    assert not {"logprobs", "top_logprobs", "return_token_ids"} & set(second.dropped_fields)
    asked = [s.request for s in policy.sent[n:] if s.request.get("tools")]
    assert asked and all(r.get("logprobs") and r.get("top_logprobs") == 2 and r.get("return_token_ids") for r in asked)


# Spaces, double and single quotes, a newline, a backslash, a shell variable, a leading "-" and
# non-ASCII text: whatever a command line or a CLI's own argument handling could change.
AWKWARD_INSTRUCTION = "-n Write \"hello world\" to a\\b.txt;\nkeep $HOME and 'single' as they are: café, 日本語 ✓"


def _user_texts(request):
    return [_text_of(m.get("content")) for m in request.get("messages") or [] if m.get("role") == "user"]


async def test_the_instruction_reaches_the_policy_as_written(policy_server, make_request, harness):
    """Issue 26 (1): the task's instruction is in the policy's user message byte for byte: no
    quotes, escapes or spaces added by the harness's command line (its own context may surround it)."""
    req = make_request([{"text": "ok"}])
    req = req.model_copy(update={"task": req.task.model_copy(update={"instruction": AWKWARD_INSTRUCTION})})
    res = await run_rollout(req)
    assert res.error is None, res.error
    users = [t for r in _policy_requests(policy_server) for t in _user_texts(r)]
    assert any(AWKWARD_INSTRUCTION in t for t in users), users
    assert not any(AWKWARD_INSTRUCTION in content for content in res.files.values())  # no copy of it among the task's files
    for t in users:  # nothing glued on either side of it (OpenCode quoted it; Pi prefixed a space)
        at = t.find(AWKWARD_INSTRUCTION)
        if at >= 0:
            before, after = t[:at], t[at + len(AWKWARD_INSTRUCTION) :]
            assert not before.endswith(('"', " ")) and not after.startswith('"'), t
