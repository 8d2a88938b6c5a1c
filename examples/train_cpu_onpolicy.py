"""On-policy rollouts for examples/train_cpu.py: the served policy follows the trainer's weights.

`OnPolicyRolloutFunc` is GRPOTrainer's rollout_func. Before each generation step it loads the
trainer's weights into the served model under the version `trainer.state.global_step`, then runs
the rollouts; every captured turn is joined to the server's answer it came from on their exact
token ids (`join_versions`), or, on a vLLM that keeps no record of its answers, read off the
version each turn recorded (`recorded_versions`). `StepRecord` holds what one step sampled, from
which weights, and what it cost; the logprob check is train_cpu_check.py.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from examples.train_cpu_check import check_rollouts
from harness_env.client.trl import HarnessRolloutFunc
from harness_env.models import RolloutResult
from tests.cpu_policy import MODEL_NAME, Answer, ChatCompletionsApp, ChatModel, PolicyServer


@dataclass
class StepRecord:
    """One generation step: what was sampled, from which weights, and what it cost."""

    step: int  # generation steps before this one = the trainer's optimiser steps so far
    served_version: int  # the served weights' version when the rollouts ran
    synced: bool
    served_version_after: int | None = None  # vLLM's, asked again after the rollouts (the example server records every answer's)
    rewards: list[float | None] = field(default_factory=list)
    turn_versions: list[list[int]] = field(default_factory=list)  # per rollout, the version of each captured policy turn
    unmatched_turns: int = 0  # captured turns found in no answer of this step (must be 0)
    probe_top_logprobs: dict[int, float] = field(default_factory=dict)  # the served first-token distribution of a fixed prompt
    probe_version: int | None = None  # as the probe's answer names it (None: vLLM's names none)
    sampled_tokens: int = 0
    sync_s: float = 0.0
    probe_s: float = 0.0
    generation_s: float = 0.0
    check_s: float = 0.0
    logp_gap_max: float | None = None  # captured vs the trainer's own logprobs, sampled tokens of the checked rollouts
    constrained_gap_max: float | None = None  # the same for turns sampled under structured outputs (the grammar's sampler)
    kl: float | None = None  # KL(sampling policy || initial weights), k3 estimator, on the unconstrained tokens
    errors: list[str] = field(default_factory=list)

    @property
    def scored(self) -> list[float]:
        return [r for r in self.rewards if r is not None]

    @property
    def reward_mean(self) -> float | None:
        return statistics.fmean(self.scored) if self.scored else None

    @property
    def success_rate(self) -> float | None:
        return sum(r >= 1.0 for r in self.scored) / len(self.scored) if self.scored else None


class ServedPolicy:
    """The policy server the rollouts sample from, whose weights follow the trainer's."""

    base_url: str  # ends in /v1
    model_name: str
    records_answers: bool  # it records every answer with the version it was sampled from (`answers`)
    answers: list[Answer]

    @property
    def version(self) -> int:
        raise NotImplementedError

    def load_weights(self, model: Any, version: int) -> float:
        raise NotImplementedError


class ExamplePolicy(ServedPolicy):
    """tests/cpu_policy/'s server, in a thread of this process, on a loopback port."""

    records_answers = True

    def __init__(self, served: ChatModel, args: argparse.Namespace) -> None:
        self.served, self.model_name = served, MODEL_NAME
        self.app = ChatCompletionsApp(served, max_tokens_cap=args.max_tokens, default_seed=args.seed * 1_000_003)
        self.answers = self.app.answers
        self._server = PolicyServer(self.app)

    def __enter__(self) -> ExamplePolicy:
        self.base_url = self._server.__enter__().base_url
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)

    @property
    def version(self) -> int:
        return self.served.version

    def load_weights(self, model: Any, version: int) -> float:
        return self.served.load_weights(model, version=version)


class VllmPolicy(ServedPolicy):
    """A vLLM started with VLLM_SERVER_DEV_MODE=1 on `model_dir` (the trainer loads the same
    directory); the trainer's weights reach it through vLLM's own reload (client/vllm_weights.py)."""

    records_answers = False

    def __init__(self, url: str, model_name: str) -> None:
        from harness_env.client.vllm_weights import VllmWeightSync

        self.sync = VllmWeightSync(url)
        self.base_url = self.sync.engine_url + "/v1"
        self.model_name, self.answers = model_name, []

    def __enter__(self) -> VllmPolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sync.close()

    @property
    def version(self) -> int:
        found = self.sync.version()
        return int(found) if found.isdigit() else 0  # "default": the weights it started with

    def load_weights(self, model: Any, version: int) -> float:
        return self.sync.load_weights(model, version=version)


@dataclass
class VersionedRunMany:
    """In-process rollouts (run_many_sync) naming the version of the weights the policy serves,
    which every captured turn records; OnPolicyRolloutFunc sets it after every sync."""

    concurrency: int
    version: int | None = None

    def __call__(self, requests: list[dict[str, Any]]) -> list[RolloutResult]:
        from harness_env.rollout import run_many_sync

        return run_many_sync(requests, concurrency=self.concurrency, weight_version=self.version)


@dataclass
class OnPolicyRolloutFunc:
    """GRPOTrainer's rollout_func: load the trainer's weights into the served model, then the
    project's HarnessRolloutFunc; record which weights every captured turn was sampled from.

    `sync=False` is the control: the server keeps the weights it has (the off-policy mistake)."""

    inner: HarnessRolloutFunc
    served: ServedPolicy
    temperature: float
    sync: bool = True
    check_rollouts: int = 2
    reference: Any = None  # a frozen copy of the initial weights, for the KL
    probe_body: dict[str, Any] | None = None  # a request re-sent after every sync (its first-token logprobs)
    probe_url: str = ""  # the policy server's /v1
    records: list[StepRecord] = field(default_factory=list)
    last_results: list[RolloutResult] = field(default_factory=list, repr=False)

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        step = int(trainer.state.global_step)
        record = StepRecord(step=step, served_version=self.served.version, synced=self.sync)
        if self.sync:
            record.sync_s = self.served.load_weights(unwrap(trainer), version=step)
            record.served_version = self.served.version
        if isinstance(self.inner.run_many, VersionedRunMany):
            self.inner.run_many.version = record.served_version
        if self.probe_body is not None and self.probe_url:
            started = time.monotonic()
            record.probe_top_logprobs, record.probe_version = self.probe()
            record.probe_s = time.monotonic() - started
        start = len(self.served.answers)
        started = time.monotonic()
        out = self.inner(prompts, trainer)
        record.generation_s = time.monotonic() - started
        self.last_results = results = self.inner.last_results
        if self.served.records_answers:
            answers = self.served.answers[start:]
            record.sampled_tokens = sum(len(a.completion_token_ids) for a in answers)
            record.turn_versions, record.unmatched_turns = join_versions(results, answers)
        else:  # vLLM keeps no record of its answers: the version each turn recorded, and vLLM's own after them
            record.sampled_tokens = sum(len(t.completion_token_ids or []) for r in results for t in r.proxy_turns if t.purpose == "policy")
            record.turn_versions, record.unmatched_turns = recorded_versions(results)
            record.served_version_after = self.served.version
        record.rewards = list(out["harness_reward"])
        record.errors = sorted({e for e in out["harness_error"] if e})
        started = time.monotonic()
        record.logp_gap_max, record.constrained_gap_max, record.kl = self.check(results, unwrap(trainer))
        record.check_s = time.monotonic() - started
        self.records.append(record)
        return out

    def probe(self) -> tuple[dict[int, float], int]:
        """The served model's first-token top logprobs for the probe request, over HTTP as the
        harnesses reach it, and the version the answer says it was sampled from."""
        import httpx

        assert self.probe_body is not None and self.probe_url
        r = httpx.post(self.probe_url.rstrip("/") + "/chat/completions", json=self.probe_body, timeout=600)
        r.raise_for_status()
        body = r.json()
        entry = body["choices"][0]["logprobs"]["content"][0]
        tops = {int(t["token"].removeprefix("token_id:")): float(t["logprob"]) for t in entry["top_logprobs"]}
        fingerprint = body.get("system_fingerprint") or ""  # the example server names the weights; vLLM's answers do not
        return tops, int(fingerprint.removeprefix("weights-v")) if fingerprint.startswith("weights-v") else None

    def check(self, results: Sequence[RolloutResult], model: Any) -> tuple[float | None, float | None, float | None]:
        """The logprob gaps (unconstrained, constrained) and the KL over the first `check_rollouts`
        trainable rollouts (train_cpu_check.check_rollouts)."""
        return check_rollouts(results, model, self.reference, self.temperature, self.check_rollouts)


def unwrap(trainer: Any) -> Any:
    """The trainer's model itself (accelerate may wrap it)."""
    model = trainer.model
    return getattr(model, "module", model)


def recorded_versions(results: Sequence[RolloutResult]) -> tuple[list[list[int]], int]:
    """The weight version each captured policy turn recorded (VersionedRunMany's), per rollout;
    and how many recorded none."""
    versions = [[t.weight_version for t in r.proxy_turns if t.purpose == "policy" and t.completion_token_ids] for r in results]
    return [[v for v in vs if v is not None] for vs in versions], sum(v is None for vs in versions for v in vs)


def join_versions(results: Sequence[RolloutResult], answers: Sequence[Answer]) -> tuple[list[list[int]], int]:
    """The weight version of every captured policy turn, found by its exact prompt and completion
    ids among the server's answers of the same step; and how many turns matched none."""
    by_ids: dict[tuple[tuple[int, ...], tuple[int, ...]], set[int]] = {}
    for a in answers:
        by_ids.setdefault((tuple(a.prompt_token_ids), tuple(a.completion_token_ids)), set()).add(a.weight_version)
    versions: list[list[int]] = []
    unmatched = 0
    for res in results:
        mine: list[int] = []
        for turn in res.proxy_turns:
            if turn.purpose != "policy" or not turn.completion_token_ids:
                continue
            found = by_ids.get((tuple(turn.prompt_token_ids), tuple(turn.completion_token_ids)))
            if not found:
                unmatched += 1
                continue
            mine += sorted(found)
        versions.append(mine)
    return versions, unmatched
