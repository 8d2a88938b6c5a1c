"""examples/train_cpu.py is on-policy: a few optimiser steps of its loop, run for real on CPU.

The example's own `train()`: TRL's GRPOTrainer with the project's rollout function, white-box
rollouts in-process through the capture proxy, SmolLM2-135M-Instruct served by
tests/cpu_policy/ with the trainer's weights loaded before every generation step. Checked:

- every captured turn of generation step k was sampled from weight version k (the weights after k
  optimiser steps): the turns are joined to the server's answers on their exact token ids, and
  the answers carry the version of the weights that sampled them; no captured turn is left
  unmatched;
- the served model's logprobs move with training: the first-token logprobs of the same request,
  asked over HTTP after each sync, differ from one step to the next;
- the captured logprobs are the trainer's own: teacher-forcing the sampled tokens through the
  trainer's model gives the same logprobs (float32 summation order apart), what TRL reports as
  `sampling/sampling_logp_difference/max` in vLLM mode.

The control is the same loop with the weight load switched off (the off-policy mistake): the
versions and the served logprobs stand still while the trainer's weights move away from them.

Each group's two rollouts are graded 1 and 0 whatever they do (the 135M model's own success is
too rare to be sure of a signal in 2 rollouts), so every step has a non-zero advantage and changes
the weights. Minutes: a handful of rollouts and backward passes over ~1,100-token rows.
"""

from __future__ import annotations

import argparse
import itertools
import math
from typing import Any

import pytest

from examples import train_cpu

pytestmark = [pytest.mark.real_model, pytest.mark.timeout(1200)]

# Two: step 1 is the first sampled from trained weights, what every check is about; a third step
# only repeated it, for a minute of CPU.
STEPS = 2


def few_steps(steps: int, *, max_tokens: int, max_turns: int) -> list[str]:
    """train_cpu's flags for a few small steps: one task a step, one group of two rollouts, no
    evaluation, every rollout checked, the top two blocks trained (what moves is checked, not how
    far: six cost the backward pass three times the CPU)."""
    return [
        *("--steps", str(steps), "--tasks-per-step", "1", "--num-generations", "2", "--train-layers", "2"),
        *("--max-tokens", str(max_tokens), "--max-turns", str(max_turns)),
        *("--eval-attempts", "0", "--check-rollouts", "1", "--learning-rate", "2e-4", "--concurrency", "2"),
    ]


def train_graded_one_then_zero(args: argparse.Namespace, task: dict[str, Any]) -> train_cpu.Run:
    """train_cpu's loop on `task` alone, each group's two rollouts graded 1 and 0 whatever they do:
    a signal at every step."""
    verdicts = itertools.cycle([["true"], ["false"]])

    def task_for_prompt(prompt: list[dict[str, Any]]) -> dict[str, Any]:
        assert prompt[-1]["content"] == task["instruction"]
        return {**task, "verify": next(verdicts)}

    return train_cpu.train(args, tasks=[task], heldout=[], task_for_prompt=task_for_prompt, log=lambda line: None)


def run(steps: int, *, sync: bool, turns: int = 2, tokens: int = 24) -> train_cpu.Run:
    args = train_cpu.parse_args(few_steps(steps, max_tokens=tokens, max_turns=turns) + ([] if sync else ["--no-sync"]))
    return train_graded_one_then_zero(args, train_cpu.make_tasks("write_call", "train")[0])


def probe_shift(a: dict[int, float], b: dict[int, float]) -> float:
    """The largest change of a first-token logprob between two probes (tokens in both top-20s)."""
    common = a.keys() & b.keys()
    assert common
    return max(abs(a[t] - b[t]) for t in common)


@pytest.fixture(scope="module")
def synced() -> train_cpu.Run:
    return run(STEPS, sync=True)


def test_every_turn_of_step_k_was_sampled_from_weights_version_k(synced: train_cpu.Run) -> None:
    records = synced.records
    assert [r.step for r in records] == list(range(STEPS))  # one generation per optimiser step
    for k, rec in enumerate(records):
        assert rec.synced and rec.served_version == k and rec.probe_version == k
        assert rec.unmatched_turns == 0, f"step {k}: a captured turn matches no answer of the server"
        assert len(rec.turn_versions) == 2 and all(rec.turn_versions), rec.turn_versions  # every rollout made model calls
        assert {v for vs in rec.turn_versions for v in vs} == {k}, (k, rec.turn_versions)
        assert rec.rewards == [1.0, 0.0], (rec.rewards, rec.errors)
    assert all(r.rollout_type == "train" for r in synced.rollout_func.last_results)
    losses = [h["loss"] for h in synced.log_history if "loss" in h]
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)


def test_the_served_logprobs_follow_the_trained_weights(synced: train_cpu.Run) -> None:
    records = synced.records
    shifts = [probe_shift(a.probe_top_logprobs, b.probe_top_logprobs) for a, b in zip(records, records[1:])]
    assert min(shifts) > 1e-2, shifts  # step k+1's served model is not step k's (about 0.3-0.7 here)
    gaps = [r.logp_gap_max for r in records]
    assert all(g is not None and g < 1e-3 for g in gaps), gaps  # and every step sampled from the trainer's own weights
    kls = [r.kl for r in records]
    assert kls[0] is not None and kls[0] < 1e-6 and kls[-1] > kls[0], kls  # step 0 samples the initial weights


def test_without_the_weight_load_the_rollouts_drift_off_policy() -> None:
    """The control: the server keeps the initial weights while the trainer's move."""
    control = run(2, sync=False, turns=1, tokens=16).records  # what it samples does not matter, only from which weights
    assert [r.served_version for r in control] == [0, 0]
    assert {v for vs in control[1].turn_versions for v in vs} == {0}  # step 1 sampled from version 0, not 1
    assert probe_shift(control[0].probe_top_logprobs, control[1].probe_top_logprobs) < 1e-3  # nothing served moved (float noise, ~2e-5)
    assert control[0].logp_gap_max < 1e-3 < 1e-2 < control[1].logp_gap_max  # the trainer's weights did (about 0.6 here)
