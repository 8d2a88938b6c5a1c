"""The token contract against a real engine for one Harbor agent: Harbor's Pi agent (it speaks
chat completions, the engine's own API, and the local sandbox runs it from `harness-env install`)
in Harbor's Trial, through the capture proxy and the recording tap, against the real vLLM; the
same assertions as the native harnesses' (tests/envs/test_vllm_contract.py)."""

from __future__ import annotations

import json

import pytest

from harness_env import Endpoint, RolloutRequest, Task, run_rollout
from harness_env.envs.harbor.options import HarborOptions
from tests.envs.test_vllm_contract import check_contract, tool_call_regex

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.usefixtures("needs_bwrap"),
    pytest.mark.timeout(1200),  # may start the engine first (tests/envs/test_vllm_contract.py)
]

AGENT = "pi"


async def test_every_captured_turn_of_a_harbor_agent_is_what_the_real_engine_saw_and_sampled(vllm_server, tap):
    req = RolloutRequest(
        task=Task(instruction="List the files in this directory, then say what you found.", task_id="contract", verify=["true"]),
        endpoint=Endpoint(base_url=tap.base_url, api_key="", model=vllm_server.model),
        harness="harbor",
        harbor=HarborOptions(agent=AGENT),
        top_logprobs=2,
        temperature=1.0,
        max_turns=3,
        max_tokens_cap=64,
        structured_regex=tool_call_regex(AGENT),
        agent_timeout_s=900,
    )
    res = await run_rollout(req)
    assert res.run_info.agent == AGENT, res.run_info
    check_contract(vllm_server, tap, res, f"harbor/{AGENT}")
    # Harbor's own record (the ATIF trajectory) has the calls the engine wrote, and no others.
    written = [(name, json.loads(args)) for name, args in tap.policy_tool_calls()]
    recorded = [(c["function_name"], c["arguments"]) for step in res.agent_trajectory["steps"] for c in step.get("tool_calls") or []]
    assert recorded == written and res.agent_tool_calls == len(written), (recorded, written)
