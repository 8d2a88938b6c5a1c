"""End to end: the real Claude Code, Codex and Gemini CLIs, in the real sandbox, through the capture proxy's
pass-through to a scripted upstream that speaks their API itself (black_box mode)."""

import json

import pytest

from harness_env import Endpoint, RolloutRequest, Task, run_rollout
from tests.envs.harnesses import installed
from tests.envs.test_e2e import _no_process_left
from tests.fakes.gemini_upstream import FakeGeminiServer, FakeGeminiUpstream
from tests.fakes.messages_upstream import FakeMessagesServer, FakeMessagesUpstream
from tests.fakes.responses_upstream import FakeResponsesServer, FakeResponsesUpstream

KEY = "sk-native-e2e-5d6c7b"
pytestmark = pytest.mark.e2e
# Every file of the rollout (.. is the rollout directory), its environment and every command line
# are searched for the key; the pattern is written so that it does not itself contain the key.
SPY = (
    "echo hello > hello.txt; env > env.txt; cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' ' > cmdlines.txt; "
    "(grep -rlE 'sk-native-e2e-5d6c7[b]' .. ~ $TMPDIR 2>/dev/null || true) > grep.txt"
)
# harness -> (wire_api, the native upstream and its server, its shell tool, the header the key must arrive in, its value)
NATIVE = {
    "claude-code": ("messages", FakeMessagesUpstream, FakeMessagesServer, "Bash", "x-api-key", KEY),
    "codex": ("responses", FakeResponsesUpstream, FakeResponsesServer, "exec_command", "authorization", f"Bearer {KEY}"),
    "gemini-cli": ("gemini", FakeGeminiUpstream, FakeGeminiServer, "run_shell_command", "x-goog-api-key", KEY),
}


@pytest.fixture(params=sorted(NATIVE))
def harness(request):
    return installed(request.param)


async def test_a_harness_against_an_upstream_that_speaks_its_api(harness):
    wire_api, upstream_cls, server_cls, shell_tool, key_header, key_value = NATIVE[harness]
    upstream = upstream_cls(key=KEY, scripts={"native-m": [{"bash": SPY}, {"text": "Created it."}]})
    with server_cls(upstream) as server:
        endpoint = Endpoint(base_url=server.base_url, api_key=KEY, model="native-m", wire_api=wire_api)
        task = Task(instruction="Create hello.txt containing hello.", verify=["grep -qx hello hello.txt"], task_id="native")
        res = await run_rollout(RolloutRequest(task=task, endpoint=endpoint, harness=harness, mode="black_box", agent_timeout_s=90))
    assert res.error is None, (res.error, res.agent_log_tail)
    assert res.reward == 1.0 and res.agent_final_text == "Created it."
    # The upstream got the harness's own requests, with the real key in its API's header only.
    assert "hecap-" not in json.dumps([upstream.requests, upstream.headers, upstream.paths])  # nor the capture key
    policy_calls = upstream.tool_requests()
    assert len(policy_calls) == 2 and all(h.get(key_header) == key_value for h in upstream.headers)
    tools = [d for t in policy_calls[0]["tools"] for d in t.get("functionDeclarations", [t])]  # Gemini's are grouped
    assert any(t.get("name") == shell_tool for t in tools)
    # Turns are recorded from the native answers (no token ids: none exist here).
    turns = [t for t in res.proxy_turns if t.purpose == "policy"]
    assert [t.upstream_status for t in turns] == [200, 200] and all(t.stream for t in turns)
    assert turns[0].tool_calls[0]["function"]["name"] == shell_tool
    assert turns[1].completion_text == "Created it." and turns[1].usage and turns[1].completion_token_ids == []
    # The key never reached the sandbox: not in its environment, a command line, a file, or the result.
    assert {"env.txt", "cmdlines.txt"} <= set(res.files) and harness.split("-")[0] in res.files["cmdlines.txt"]
    assert res.files["grep.txt"].strip() == "" and KEY not in res.model_dump_json()
    _no_process_left(res)
