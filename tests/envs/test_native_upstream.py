"""End to end: the real Claude Code CLI, in the real sandbox, through the capture proxy's
pass-through to a scripted upstream that speaks Anthropic Messages itself (black_box mode)."""

import pytest

from harness_env import Endpoint, RolloutRequest, Task, run_rollout
from harness_env.core.errors import ToolMissingError
from harness_env.envs import get_harness
from tests.envs.test_e2e import _no_process_left
from tests.fakes.messages_upstream import FakeMessagesServer, FakeMessagesUpstream

KEY = "sk-ant-native-e2e-5d6c7b"
pytestmark = pytest.mark.e2e
# Every file of the rollout (.. is the rollout directory), its environment and every command line
# are searched for the key; the pattern is written so that it does not itself contain the key.
SPY = ("echo hello > hello.txt; env > env.txt; cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' ' > cmdlines.txt; "
       "(grep -rlE 'sk-ant-native-e2e-5d6c7[b]' .. ~ $TMPDIR 2>/dev/null || true) > grep.txt")


@pytest.fixture
def claude_code():
    try:
        get_harness("claude-code").check_installed()
    except ToolMissingError as e:
        pytest.fail(f"{e} (./dev test installs it)")


async def test_claude_code_against_a_native_messages_upstream(claude_code):
    upstream = FakeMessagesUpstream(key=KEY, scripts={"claude-native": [{"bash": SPY}, {"text": "Created it."}]})
    with FakeMessagesServer(upstream) as server:
        endpoint = Endpoint(base_url=server.base_url, api_key=KEY, model="claude-native", wire_api="messages")
        task = Task(instruction="Create hello.txt containing hello.", verify=["grep -qx hello hello.txt"], task_id="native")
        res = await run_rollout(RolloutRequest(task=task, endpoint=endpoint, harness="claude-code", mode="black_box", agent_timeout_s=90))
    assert res.error is None, res.error
    assert res.reward == 1.0 and res.agent_final_text == "Created it."
    # The upstream got Claude Code's own requests, with the real key in x-api-key only.
    policy_calls = upstream.tool_requests()
    assert len(policy_calls) == 2 and all(h["x-api-key"] == KEY for h in upstream.headers)
    assert any(t["name"] == "Bash" for t in policy_calls[0]["tools"])
    # Turns are recorded from the native answers (no token ids: none exist here).
    turns = [t for t in res.proxy_turns if t.purpose == "policy"]
    assert [t.upstream_status for t in turns] == [200, 200] and all(t.stream for t in turns)
    assert turns[0].tool_calls[0]["function"]["name"] == "Bash" and turns[0].finish_reason == "tool_use"
    assert turns[1].completion_text == "Created it." and turns[1].usage and turns[1].completion_token_ids == []
    # The key never reached the sandbox: not in its environment, a command line, a file, or the result.
    assert {"env.txt", "cmdlines.txt"} <= set(res.files) and "claude" in res.files["cmdlines.txt"]
    assert res.files["grep.txt"].strip() == "" and KEY not in res.model_dump_json()
    _no_process_left(res)
