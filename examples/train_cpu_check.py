"""The on-policy check of examples/train_cpu.py: the captured logprobs against the trainer's own.

Over the sampled tokens of a rollout's main branch (`main_row`): the largest |captured - trainer|
logprob (TRL logs the same as `sampling/sampling_logp_difference/max` in vLLM mode), kept apart for
turns sampled under structured outputs (their logprobs are the grammar-masked sampler's, which the
model alone does not give), and the KL of the sampling policy to the initial weights (TRL's k3
estimator, as its `kl` metric) on the unconstrained tokens.

One teacher-forced pass per model over the whole row, not one per turn over its whole prompt (a
cost that grew with the square of the turns): the row is the branch's turns laid end to end, each
turn's prompt a prefix of it, so a causal model's logprob of a turn's sampled token is the one at
that token's position in the row. The per-position logprobs are split by turn afterwards.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness_env.client.trl import main_row
from harness_env.models import RolloutResult, TrainingRow, Turn
from tests.cpu_policy import token_logprobs


@dataclass
class TurnCheck:
    """One policy turn of a checked row: |captured - trainer| per sampled token, and the k3 terms
    of the KL to the reference (unconstrained turns, with a reference)."""

    index: int
    constrained: bool
    gaps: list[float] = field(default_factory=list)
    kls: list[float] = field(default_factory=list)


def row_turns(row: TrainingRow, turns: Sequence[Turn]) -> list[tuple[Turn, int]]:
    """The policy turns of the row's branch that sampled tokens, each with the position in the row
    where its completion starts (the length of its prompt, a prefix of the row). A turn of another
    branch is not in this row: it is left out."""
    out = []
    for turn in turns:
        if turn.branch != row.branch or turn.purpose != "policy" or not turn.completion_token_ids:
            continue
        start, end = len(turn.prompt_token_ids), len(turn.prompt_token_ids) + len(turn.completion_token_ids)
        if row.token_ids[:start] != turn.prompt_token_ids or row.token_ids[start:end] != turn.completion_token_ids:
            raise ValueError(f"turn {turn.index} is on branch {row.branch} but its tokens are not the row's at {start}")
        out.append((turn, start))
    return out


def check_row(row: TrainingRow, turns: Sequence[Turn], model: Any, reference: Any, temperature: float) -> list[TurnCheck]:
    """Per policy turn of the row, the gaps and KL terms, from one teacher-forced pass over the row
    through `model` (and one through `reference`, when one is given and a turn is unconstrained)."""
    spans = row_turns(row, turns)
    if not spans:
        return []
    first = min(start for _, start in spans)
    mine = token_logprobs(model, row.token_ids, first, temperature)
    wants_ref = reference is not None and any(not turn.constrained for turn, _ in spans)
    ref = token_logprobs(reference, row.token_ids, first, temperature) if wants_ref else []
    checks = []
    for turn, start in spans:
        at = slice(start - first, start - first + len(turn.completion_token_ids))
        captured = turn.per_token_logps
        check = TurnCheck(turn.index, turn.constrained, [abs(a - b) for a, b in zip(captured, mine[at])])
        if wants_ref and not turn.constrained:
            check.kls = [math.exp(r - c) - (r - c) - 1 for r, c in zip(ref[at], captured)]
        checks.append(check)
    return checks


def check_rollouts(
    results: Sequence[RolloutResult], model: Any, reference: Any, temperature: float, rollouts: int
) -> tuple[float | None, float | None, float | None]:
    """Over the main rows of the first `rollouts` trainable rollouts: the largest gap of the
    unconstrained turns, the same of the constrained ones, and the mean k3 KL to the reference on
    the unconstrained tokens (None where there is nothing to measure)."""
    gaps: dict[bool, list[float]] = {False: [], True: []}
    kls: list[float] = []
    checked = 0
    was_training = model.training
    model.eval()
    try:
        for res in results:
            if checked >= rollouts:
                break
            row, _ = main_row(res)
            if row is None or not row.trainable or res.error is not None:
                continue
            checked += 1
            for check in check_row(row, res.proxy_turns, model, reference, temperature):
                gaps[check.constrained] += check.gaps
                kls += check.kls
    finally:
        model.train(was_training)
    return (max(gaps[False], default=None), max(gaps[True], default=None), statistics.fmean(kls) if kls else None)
