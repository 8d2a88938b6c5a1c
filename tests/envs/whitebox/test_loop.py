"""The white-box loop end to end: through the capture proxy, against the scripted fake policy whose
stand-in chat template only appends (tests/fakes/policy.py)."""

import json

import pytest

from harness_env import Endpoint, RolloutRequest, Task, run_rollout
from tests.envs.test_e2e import _no_process_left

pytestmark = pytest.mark.e2e


@pytest.fixture
def make_request(policy_server):
    def make(script, *, verify=("test -f hello.txt",), **kw):
        policy_server.policy.scripts["wb"] = script
        kw.setdefault("agent_timeout_s", 30)
        return RolloutRequest(
            task=Task(instruction="Create hello.txt.", verify=list(verify)),
            endpoint=Endpoint(base_url=policy_server.base_url, api_key="k", model="wb"),
            harness="whitebox",
            **kw,
        )

    return make


async def test_history_is_verbatim_and_the_trajectory_one_branch(policy_server, make_request):
    odd = '{ "command" :  "echo hello > hello.txt" }'  # spacing a re-serialiser would change
    res = await run_rollout(make_request([{"call": "bash", "arguments": odd}, {"bash": "cat hello.txt"}, {"text": "Done."}]))
    assert res.error is None and res.reward == 1.0 and res.agent_tool_calls == 2 and res.agent_final_text == "Done."
    second = policy_server.policy.tool_requests()[1]["messages"]
    assert second[2]["role"] == "assistant" and second[2]["tool_calls"][0]["function"]["arguments"] == odd
    assert second[3]["role"] == "tool" and second[3]["tool_call_id"] == second[2]["tool_calls"][0]["id"]
    turns = res.proxy_turns
    assert [t.branch for t in turns] == [0, 0, 0] and [t.parent for t in turns] == [None, 0, 1]
    for prev, t in zip(turns, turns[1:]):
        seq = prev.prompt_token_ids + prev.completion_token_ids
        assert t.prompt_token_ids[: len(seq)] == seq
    (row,) = res.training_rows()
    assert row.trainable and row.reward == 1.0 and row.turn_indices == [0, 1, 2]
    assert row.token_ids[: row.prompt_length] == turns[0].prompt_token_ids
    sampled = [tid for tid, m in zip(row.token_ids, row.loss_mask) if m]
    assert sampled == [tid for t in turns for tid in t.completion_token_ids]
    assert [lp for lp, m in zip(row.logprobs, row.loss_mask) if m] == [lp for t in turns for lp in t.per_token_logps]
    assert len(row.token_ids) == len(turns[-1].prompt_token_ids) + len(turns[-1].completion_token_ids)
    assert res.graph.branches == 1 and res.graph.trainable_tokens == len(sampled)


async def test_a_bad_tool_call_is_told_to_the_model_and_the_loop_goes_on(policy_server, make_request):
    script = [{"call": "python", "arguments": "{}"}, {"call": "bash", "arguments": "not json"}, {"bash": "touch hello.txt"}, {"text": "ok"}]
    res = await run_rollout(make_request(script))
    assert res.error is None and res.reward == 1.0 and res.agent_tool_calls == 3
    tool_replies = [m["content"] for m in policy_server.policy.tool_requests()[-1]["messages"] if m["role"] == "tool"]
    assert tool_replies[0].startswith("error: there is no tool 'python'")
    assert tool_replies[1].startswith("error: the arguments of bash are not valid JSON")
    assert tool_replies[2] == "[exit code 0]"


async def test_submit_ends_the_loop_with_the_answer(policy_server, make_request):
    script = [{"bash": "touch hello.txt"}, {"call": "submit", "arguments": json.dumps({"answer": "made it"})}, {"bash": "rm hello.txt"}]
    res = await run_rollout(make_request(script, reward_mode="tool_efficiency"))
    assert res.agent_final_text == "made it" and res.agent_tool_calls == 1  # submit is the answer, not a tool use
    assert len(policy_server.policy.tool_requests()) == 2
    assert res.reward == pytest.approx(1.09375)


async def test_the_deadline_stops_a_long_command_and_leaves_nothing(policy_server, make_request):
    res = await run_rollout(make_request([{"bash": "sleep 300 & sleep 300"}], agent_timeout_s=3))
    assert res.error_kind == "agent_timeout" and res.reward == 0.0 and res.reward_source == "verify_ratio"  # graded, not left out
    assert "deadline" in res.agent_log_tail
    _no_process_left(res)  # the sleeps were killed, not waited out


async def test_tool_limits_come_from_harness_config(policy_server, make_request):
    script = [{"bash": "seq 1 100000 > big.txt; cat big.txt; touch hello.txt"}, {"text": "ok"}]
    await run_rollout(make_request(script, harness_config={"max_tool_output_bytes": 300}))
    tool_reply = [m for m in policy_server.policy.tool_requests()[1]["messages"] if m["role"] == "tool"][0]["content"]
    assert "bytes cut" in tool_reply and tool_reply.endswith("100000\n[exit code 0]") and len(tool_reply) < 400
    bad = await run_rollout(make_request(script, harness_config={"tool_timeout": 1}))
    assert bad.error_kind == "invalid_request" and "tool_timeout_s" in bad.error


async def test_every_call_carries_a_completion_cap_that_the_option_sets(policy_server, make_request):
    """Issue 26 (3): with no max_tokens one call on a real vLLM sampled until the context was full."""
    from harness_env.envs.whitebox.options import DEFAULT_MAX_TOKENS

    script = [{"bash": "touch hello.txt"}, {"text": "ok"}]
    res = await run_rollout(make_request(script))
    assert res.error is None and res.reward == 1.0
    assert [r.get("max_tokens") for r in policy_server.policy.tool_requests()] == [DEFAULT_MAX_TOKENS] * 2
    n = len(policy_server.policy.tool_requests())
    res = await run_rollout(make_request(script, harness_options={"max_tokens": 300}))
    assert res.error is None and [r.get("max_tokens") for r in policy_server.policy.tool_requests()[n:]] == [300, 300]
    n = len(policy_server.policy.tool_requests())
    res = await run_rollout(make_request(script, harness_options={"max_tokens": 300}, max_tokens_cap=100))  # the rollout's cap still wins
    assert res.error is None and [r.get("max_tokens") for r in policy_server.policy.tool_requests()[n:]] == [100, 100]
