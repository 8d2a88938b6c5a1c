"""RolloutResult's NeMo-Gym vocabulary: derived from error_kind and error, so it cannot disagree
with them, and in the JSON a client receives."""

import json

import pytest

from harness_env.models import RolloutResult
from harness_env.models.results import AGENT_CAUSED_KINDS


@pytest.mark.parametrize("kind", ["endpoint", "sandbox", "setup", "judge", "internal", "invalid_request", "cancelled"])
def test_an_end_the_agent_did_not_cause_is_masked(kind):
    r = RolloutResult(error=f"{kind} broke", error_kind=kind)
    assert (r.mask_sample, r.failure_kind, r.failure_reason) == (True, kind, f"{kind} broke")
    sent = json.loads(r.model_dump_json())
    assert (sent["mask_sample"], sent["failure_kind"], sent["failure_reason"]) == (True, kind, f"{kind} broke")
    assert RolloutResult.model_validate(sent).mask_sample  # a client reads it back


@pytest.mark.parametrize("kind", sorted(AGENT_CAUSED_KINDS))
def test_an_end_the_agent_caused_is_graded_not_masked(kind):
    r = RolloutResult(reward=0.0, error="the agent's doing", error_kind=kind)
    assert (r.mask_sample, r.failure_kind) == (False, kind)


def test_a_clean_or_unverified_rollout_is_not_masked():
    assert RolloutResult(reward=1.0).model_dump()["mask_sample"] is False
    unverified = RolloutResult(reward=None)  # no verify command: unscored, nothing failed
    assert (unverified.mask_sample, unverified.failure_kind, unverified.failure_reason) == (False, None, None)


def test_a_row_holding_a_turn_past_the_weight_lag_is_stale():
    from harness_env.models import Turn

    def turn(i, prompt, stale):
        return Turn(index=i, prompt_token_ids=prompt, completion_token_ids=[9], per_token_logps=[-0.5], stale=stale, branch=0)

    fresh = RolloutResult(reward=1.0, proxy_turns=[turn(0, [1, 2], False), turn(1, [1, 2, 9, 3], False)])
    late = RolloutResult(reward=1.0, proxy_turns=[turn(0, [1, 2], True), turn(1, [1, 2, 9, 3], False)])
    assert [r.stale for r in fresh.training_rows()] == [False]
    assert [r.stale for r in late.training_rows()] == [True] and late.training_rows()[0].trainable  # flagged, the trainer decides
