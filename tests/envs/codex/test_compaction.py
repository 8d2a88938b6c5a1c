"""Codex compacting its history, through the real CLI and the capture proxy against the real vLLM.

Codex summarises a conversation whose token usage passes `model_auto_compact_token_limit`: it asks
the model for a summary (a call without tools: auxiliary), then goes on from its instructions, the
task and that summary instead of the whole history. The turn after it starts a new branch linked
`compaction`; both branches must reach the trainer whole. The tiny model never calls a tool by
itself: every answer is constrained to a shell call (tests/envs/test_vllm_contract.py).
"""

from __future__ import annotations

import pytest

from harness_env import Endpoint, RolloutRequest, Task, run_rollout
from harness_env.client.trl import rollout_batch
from tests.envs.harnesses import installed
from tests.envs.test_vllm_contract import HARNESS_CONFIG, regex_literal, tool_call_regex

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

# Below the first call's prompt (about 5,800 tokens: Codex's instructions and its tools): Codex
# compacts after every answer that asks for a command.
COMPACT_AT = 4600
SUMMARY = "The files in the workspace were listed with ls; nothing else was done yet."


def summary_only(path: str, body: dict) -> dict:
    """The tiny model's free text never ends within a summary's budget (Codex fails an answer cut at
    max_output_tokens): a call without tools, Codex's summary request, is constrained to SUMMARY."""
    if path.endswith("/chat/completions") and not body.get("tools"):
        return {**body, "structured_outputs": {"regex": regex_literal(SUMMARY)}}
    return body


async def test_a_codex_rollout_that_compacts_links_compaction_and_trains_both_branches(vllm_server, tap):
    harness = installed("codex")
    tap.shape = summary_only
    req = RolloutRequest(
        task=Task(instruction="List the files in this directory, then say what you found.", task_id="compact", verify=["true"]),
        endpoint=Endpoint(base_url=tap.base_url, api_key="", model=vllm_server.model),
        harness=harness,
        temperature=1.0,
        max_turns=3,
        max_tokens_cap=96,
        structured_regex=tool_call_regex(harness),
        agent_timeout_s=900,
        harness_config={**HARNESS_CONFIG.get(harness, {}), "model_auto_compact_token_limit": COMPACT_AT},
    )
    res = await run_rollout(req)
    assert res.capture_level == "tokens" and res.reward == 1.0, (res.error, res.error_kind, res.agent_log_tail)
    turns = sorted(res.proxy_turns, key=lambda t: t.index)
    print(
        "\n"
        + "\n".join(
            f"turn {t.index}: {t.purpose} {t.link} parent {t.parent} branch {t.branch}, "
            f"{len(t.request_messages)} messages, {len(t.prompt_token_ids)} prompt tokens"
            for t in turns
        )
    )
    compacted = [t for t in turns if t.link == "compaction"]
    assert compacted, [(t.index, t.purpose, t.link) for t in turns]
    # The summary Codex asked for is an auxiliary call, and what it answered is in the compacted prompt.
    summary = next(t for t in reversed(turns) if t.purpose == "auxiliary" and t.index < compacted[0].index)
    assert summary.completion_text == SUMMARY and SUMMARY in str(compacted[0].request_messages)
    assert len(compacted[0].request_messages) < len(turns[compacted[0].parent].request_messages) + 2
    # Both branches are trainable rows, and every token the policy sampled is in one of them.
    rows = res.training_rows()
    assert len(rows) == res.graph.branches >= 2 and all(r.trainable for r in rows), [r.untrainable_reason for r in rows]
    assert res.graph.trained_share == 1.0 and res.graph.auxiliary_tokens >= len(summary.completion_token_ids) > 0
    # The TRL adapter gives every branch a row (none dropped), each with the rollout's reward.
    batch = rollout_batch([res], num_generations=1, branch_slots=len(rows))
    assert batch["dropped_branches"] == [0] * len(rows) and sorted(batch["harness_branch"]) == [r.branch for r in rows]
    assert sum(sum(m) for m in batch["env_mask"]) == res.graph.trainable_tokens
    assert batch["harness_reward"] == [res.reward] * len(rows)
