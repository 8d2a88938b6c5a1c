"""examples/train_cpu.py inside a real CLI against the real vLLM: a few steps of its on-policy loop.

The loop `bench/learning.py --harness pi --vllm-url ...` runs: Pi rollouts in this process through
the capture proxy, SmolLM2-135M-Instruct served by the suite's vLLM (tests/vllm_engine.py), TRL's
GRPOTrainer, and the trainer's weights loaded into vLLM through its own reload before every
generation step under the version k (the optimiser steps so far). Checked:

- every captured turn of generation step k records version k (the label the rollouts are given),
  which vLLM itself reports before and after the step's rollouts;
- vLLM's logprobs move with the pushes: its first-token logprobs for the same request differ from
  one step to the next;
- the captured logprobs are the trainer's own: teacher-forcing the sampled tokens through the
  trainer's model gives the same logprobs (float32 engine against float32 transformers).

Each group's two rollouts are graded 1 and 0 whatever they do, so every step changes the weights.
Afterwards vLLM gets its own weights back (the suite's other tests share it).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from examples import train_cpu
from harness_env.client.vllm_weights import VllmWeightSync
from tests.envs.harnesses import installed
from tests.examples.test_train_cpu import few_steps, probe_shift, train_graded_one_then_zero
from tests.vllm_engine import model_dir

pytestmark = [pytest.mark.real_model, pytest.mark.e2e, pytest.mark.timeout(1200)]

# Two: step 1 is the first sampled from trained weights, what every check is about; a third step
# only repeated it, for a minute of CPU.
STEPS = 2
# float32 vLLM on CPU against float32 transformers, the same weights, sampled tokens at T=0.7
GAP = 1e-2


@pytest.fixture(scope="module")
def pi_run(vllm_server) -> Iterator[train_cpu.Run]:
    installed("pi")
    serving = ["--harness", "pi", "--vllm-url", vllm_server.root_url, "--model-dir", str(model_dir()), "--model-name", vllm_server.model]
    args = train_cpu.parse_args(serving + few_steps(STEPS, max_tokens=24, max_turns=1))
    try:
        yield train_graded_one_then_zero(args, train_cpu.make_tasks("plain_file", "train")[0])
    finally:
        with VllmWeightSync(vllm_server.root_url) as sync:
            sync.load_directory(model_dir(), "default")
            assert sync.version() == "default"


def test_every_turn_of_step_k_inside_pi_records_the_version_vllm_serves(pi_run: train_cpu.Run) -> None:
    records = pi_run.records
    assert [r.step for r in records] == list(range(STEPS))
    for k, rec in enumerate(records):
        # vLLM's own word before and after the rollouts; the turns' versions are the label the rollouts were
        # given from it, so the logprob checks below are what shows vLLM really served the step's weights
        assert (rec.synced, rec.served_version, rec.served_version_after) == (True, k, k)
        assert rec.unmatched_turns == 0, f"step {k}: a captured turn recorded no version"
        assert rec.turn_versions == [[k], [k]], (k, rec.turn_versions, rec.errors)  # one model call per rollout
        assert rec.rewards == [1.0, 0.0], (rec.rewards, rec.errors)
    assert all(r.rollout_type == "train" and r.harness == "pi" for r in pi_run.rollout_func.last_results)
    losses = [h["loss"] for h in pi_run.log_history if "loss" in h]
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)


def test_vllm_s_logprobs_follow_the_pushed_weights_and_are_the_trainer_s(pi_run: train_cpu.Run) -> None:
    records = pi_run.records
    shifts = [probe_shift(a.probe_top_logprobs, b.probe_top_logprobs) for a, b in zip(records, records[1:])]
    assert min(shifts) > 1e-2, shifts  # step k+1's vLLM serves other weights than step k's
    gaps = [r.logp_gap_max for r in records]
    assert all(g is not None and g < GAP for g in gaps), gaps  # and each step sampled from the trainer's own weights
    assert all(r.constrained_gap_max is None for r in records)  # nothing constrained here
    kls = [r.kl for r in records]
    assert kls[0] is not None and kls[0] < 1e-3 and kls[-1] > kls[0], kls  # step 0 samples the initial weights
