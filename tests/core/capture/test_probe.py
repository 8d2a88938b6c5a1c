"""The capture-level probe: what an endpoint gives a trainer, and the rollout's train/eval label."""

import pytest

from harness_env import Endpoint, RolloutRequest, Task, run_rollout
from harness_env.core.capture.probe import classify
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.models import TopLogprob, Turn
from tests.fakes.policy import FakePolicy, FakePolicyServer


def _turn(gap_scale, level="tokens", status=200):
    top = [TopLogprob(token=f"t{k}", logprob=-(0.1 + k) * gap_scale) for k in range(5)]
    return Turn(
        index=0,
        upstream_status=status,
        capture_level=level,
        per_token_logps=[top[0].logprob],
        completion_token_ids=[1] if level == "tokens" else [],
        top_logprobs=[top],
        completion_text="x",
    )


def test_gaps_that_scale_with_1_over_t_are_processed_logprobs():
    r = classify(_turn(1.0), _turn(2.0))
    assert r.trainable and r.processed_logprobs is True and "processed" in r.detail


def test_gaps_that_do_not_move_are_raw_logprobs():
    r = classify(_turn(1.0), _turn(1.0))
    assert not r.trainable and r.processed_logprobs is False and "--logprobs-mode processed_logprobs" in r.detail


def _vllm_turn(gap_scale, sampled_logprob):
    """As vLLM answers: the sampled token first; when it is not among the 5 best, it takes the 5th's
    place (the list is the sampled token and the 4 best)."""
    turn = _turn(gap_scale)
    sampled = TopLogprob(token="sampled", logprob=sampled_logprob)
    turn.top_logprobs = [[sampled, *turn.top_logprobs[0][:4]]]
    turn.per_token_logps = [sampled_logprob]
    return turn


@pytest.mark.parametrize("processed", [True, False])
def test_the_sampled_entry_vllm_adds_outside_the_k_best_is_not_read_as_the_k_th_best(processed):
    """Issue 26 (1): each call samples a different token below the 5 best; only ranked entries count."""
    hot, cold = _vllm_turn(1.0, -9.0), _vllm_turn(2.0 if processed else 1.0, -20.0)
    r = classify(hot, cold)
    assert r.processed_logprobs is processed, r.detail


def test_text_only_and_failed_probes():
    assert classify(_turn(1, "text"), _turn(1, "text")).capture_level == "text"
    failed = classify(_turn(1, status=500), _turn(2))
    assert failed.capture_level == "none" and "failed (500)" in failed.detail
    no_top = _turn(1.0)
    no_top.top_logprobs = []
    assert classify(no_top, no_top).processed_logprobs is None


@pytest.mark.parametrize(
    ("policy", "level", "processed"),
    [
        (FakePolicy(), "tokens", True),
        (FakePolicy(processed_logprobs=False), "tokens", False),
        (FakePolicy(reject_unknown_fields=True), "logprobs", True),  # a hosted API: no token ids
    ],
)
async def test_probe_against_endpoints(policy, level, processed):
    with FakePolicyServer(policy) as upstream:
        proxy = CaptureProxy()
        endpoint = Endpoint(base_url=upstream.base_url, model="m")
        r = await proxy.probe(endpoint)
        assert (r.capture_level, r.processed_logprobs) == (level, processed)
        assert r.trainable is (level == "tokens" and processed)
        n = len(policy.requests)
        assert (await proxy.probe(endpoint)) is r and len(policy.requests) == n  # once per endpoint
        await proxy.aclose()


@pytest.mark.parametrize(
    ("policy_kw", "mode", "rollout_type", "why"),
    [
        ({}, "transparent_proxy", "train", "processed"),
        ({"processed_logprobs": False}, "transparent_proxy", "eval", "raw"),
        ({}, "black_box", "eval", "black_box mode"),
    ],
)
async def test_rollouts_are_labelled_train_only_with_tokens_and_processed_logprobs(policy_kw, mode, rollout_type, why):
    with FakePolicyServer(FakePolicy(scripts={"m": [{"bash": "touch a"}, {"text": "ok"}]}, **policy_kw)) as upstream:
        req = RolloutRequest(
            task=Task(instruction="x", verify=["test -f a"]), harness="whitebox", mode=mode, endpoint=Endpoint(base_url=upstream.base_url, model="m")
        )
        res = await run_rollout(req)
    assert res.reward == 1.0 and res.rollout_type == rollout_type and why in res.rollout_type_reason


async def test_what_an_endpoint_rejects_is_learned_from_the_proxys_own_probe_once():
    """The fields the proxy adds that an endpoint rejects are found with the probe's own request
    (no agent shaped it), once per endpoint, model and set of added fields (issue 25)."""
    from harness_env.core.capture.probe import PROBE_MESSAGES
    from harness_env.core.capture.rewrite import CapturePolicy

    fake = FakePolicy(reject_unknown_fields=True, require_max_completion_tokens=True)
    with FakePolicyServer(fake) as upstream:
        proxy = CaptureProxy()
        endpoint = Endpoint(base_url=upstream.base_url, model="m")
        policy = CapturePolicy(top_logprobs=2, disable_thinking=True)
        await proxy._probe_fields(endpoint, policy)
        quirks = proxy._endpoint_quirks(endpoint)
        assert quirks.dropped == {"return_token_ids", "chat_template_kwargs"} and quirks.use_max_completion_tokens
        n = len(fake.requests)
        await proxy._probe_fields(endpoint, policy)
        assert len(fake.requests) == n == 4 and all(r["messages"] == PROBE_MESSAGES for r in fake.requests)
        other = proxy._endpoint_quirks(Endpoint(base_url=upstream.base_url, model="other"))
        assert other.dropped == set() and not other.use_max_completion_tokens  # per model
        await proxy.aclose()
