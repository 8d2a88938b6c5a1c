"""examples/train_cpu_check.py: the on-policy check scores a multi-turn row in one pass per model.

A tiny random Llama stands in for the policy (its numbers are what is compared, not their sense):
a rollout of four policy turns, three on the main branch (one of them constrained) and one on a
branch of its own (a fresh prompt). The gaps and KL terms of the one pass over the main row, split
by turn, are the ones of a teacher-forced pass per turn over its own prompt (float32 summation
order apart), the other branch's turn is left out, and each model runs once.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import torch
import transformers

from examples.train_cpu_check import check_rollouts, check_row
from harness_env.client.trl import main_row
from harness_env.models import RolloutResult, Turn
from tests.cpu_policy import teacher_forced_logprobs

TEMPERATURE = 0.7
VOCAB = 64
TOL = 1e-5


def tiny_llama(seed: int) -> Any:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256
    )
    return transformers.LlamaForCausalLM(config).eval()


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def rollout(sampler: Any) -> RolloutResult:
    """Turns 0, 2 and 3 on branch 0 (each prompt extends the one before with its completion and a
    tool result; turn 2 constrained), turn 1 on branch 1. The captured logprobs are `sampler`'s."""
    rng = random.Random(0)

    def turn(index: int, branch: int, prompt: list[int], n: int, constrained: bool = False) -> Turn:
        completion = tokens(rng, n)
        logps = teacher_forced_logprobs(sampler, prompt, completion, TEMPERATURE)
        return Turn(
            index=index,
            branch=branch,
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            per_token_logps=logps,
            constrained=constrained,
            capture_level="tokens",
        )

    t0 = turn(0, 0, tokens(rng, 30), 7)
    t1 = turn(1, 1, tokens(rng, 12), 5)
    t2 = turn(2, 0, t0.prompt_token_ids + t0.completion_token_ids + tokens(rng, 6), 8, constrained=True)
    t3 = turn(3, 0, t2.prompt_token_ids + t2.completion_token_ids + tokens(rng, 4), 6)
    return RolloutResult(reward=1.0, proxy_turns=[t0, t1, t2, t3])


def per_turn(res: RolloutResult, model: Any, reference: Any) -> dict[int, tuple[list[float], list[float]]]:
    """The former check: a teacher-forced pass per main-branch turn over its own prompt."""
    row, _ = main_row(res)
    out = {}
    for t in res.proxy_turns:
        if t.branch != row.branch:
            continue
        mine = teacher_forced_logprobs(model, t.prompt_token_ids, t.completion_token_ids, TEMPERATURE)
        gaps = [abs(a - b) for a, b in zip(t.per_token_logps, mine)]
        kls = []
        if not t.constrained:
            ref = teacher_forced_logprobs(reference, t.prompt_token_ids, t.completion_token_ids, TEMPERATURE)
            kls = [math.exp(r - c) - (r - c) - 1 for r, c in zip(ref, t.per_token_logps)]
        out[t.index] = (gaps, kls)
    return out


def passes(model: Any) -> list[int]:
    """A counter of the model's forward passes."""
    calls: list[int] = []
    model.register_forward_hook(lambda *_: calls.append(1))
    return calls


def test_one_pass_over_the_row_gives_each_turn_s_gaps_and_kl() -> None:
    sampler, model, reference = tiny_llama(1), tiny_llama(2), tiny_llama(3)
    res = rollout(sampler)
    row, _ = main_row(res)
    assert row is not None and row.trainable and row.turn_indices == [0, 2, 3]
    expected = per_turn(res, model, reference)
    model_passes, reference_passes = passes(model), passes(reference)

    checks = check_row(row, res.proxy_turns, model, reference, TEMPERATURE)

    assert len(model_passes) == 1 and len(reference_passes) == 1  # one each, whatever the turns
    assert [(c.index, c.constrained) for c in checks] == [(0, False), (2, True), (3, False)]  # turn 1 is another branch's
    for check in checks:
        gaps, kls = expected[check.index]
        assert len(check.gaps) == len(gaps) and max(abs(a - b) for a, b in zip(check.gaps, gaps)) < TOL
        assert len(check.kls) == len(kls) and all(abs(a - b) < TOL for a, b in zip(check.kls, kls))
    assert min(max(c.gaps) for c in checks) > 1e-2  # another model's logprobs: the gaps are real
    assert checks[1].kls == [] and checks[0].kls and checks[2].kls  # no KL on the constrained turn


def test_check_rollouts_reports_the_largest_gaps_and_the_mean_kl() -> None:
    sampler, model, reference = tiny_llama(1), tiny_llama(2), tiny_llama(3)
    res = rollout(sampler)
    expected = per_turn(res, model, reference)
    model.train()

    gap, constrained_gap, kl = check_rollouts([res], model, reference, TEMPERATURE, rollouts=1)

    assert model.training  # the check leaves the model as it found it
    assert gap == pytest.approx(max(max(expected[i][0]) for i in (0, 3)), abs=TOL)
    assert constrained_gap == pytest.approx(max(expected[2][0]), abs=TOL)
    assert kl == pytest.approx(sum(expected[0][1] + expected[3][1]) / len(expected[0][1] + expected[3][1]), abs=TOL)
    assert check_rollouts([res], sampler, reference, TEMPERATURE, rollouts=1)[0] < TOL  # the sampler's own: no gap
    assert check_rollouts([res], model, None, TEMPERATURE, rollouts=0) == (None, None, None)
