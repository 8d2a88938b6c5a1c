"""TRL adapters: harness rollouts as GRPO training data (the optional `harness-env[train]` extra).

Two shapes, both built on the training rows of a RolloutResult (one row per branch of its turn
graph, loss mask 1 on sampled tokens only):

- `HarnessRolloutFunc`: GRPOTrainer's `rollout_func`. TRL hands it the prompts (each repeated
  `num_generations` times in a row) and takes back exactly one row per entry; it runs one
  rollout per `branch_slots` entries and fills them with the rollout's trainable branches (main
  first, filler rows after), returning `prompt_ids`, `completion_ids`, `logprobs`, `env_mask` and
  the reward and metrics as extra fields.
- `HarnessSessionFactory`: the loop-owning session factory that TRL's AsyncGRPOTrainer
  (`HarnessRolloutWorker`) and OpenEnv's harness protocol use: `create(task, seed, episode_id)`
  starts a rollout; the session's `wait_for_completion`, `fetch_training_trace` /
  `fetch_proxy_trace`, `verify` and `close` hand over its turns (branch by branch: one row each
  in TRL's worker) and reward.

Every row of a rollout carries its reward, hence its advantage. Under a token-level loss (TRL's
default `dapo`, and `bnpo`, `dr_grpo`, `cispo`) each sampled token weighs the same wherever it
lands, so a rollout's rows together weigh as its tokens would in one sequence.

A failed rollout never crashes a step. A masked one (`mask_sample`: an infrastructure failure or
a cancel) gets reward None, which TRL leaves out of its group's mean and std with zero advantage,
and its completion carries no trainable token. Groups are marked (`group_status`): all failed,
too few valid members (`min_valid`, default 2), all tied, ok; a trainer can skip them.

This module imports only the wire types: rollouts run through a `RunMany` callable, either
`remote_runner(HarnessEnv(url))` or, in-process, `harness_env.rollout.run_many_sync`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from harness_env.models import RolloutArgs, RolloutRequest, RolloutResult, TrainingRow

RunMany = Callable[[list[dict[str, Any]]], list[RolloutResult]]  # RolloutRequest dicts -> results, same order
TaskForPrompt = Callable[[Any], dict[str, Any]]
DEFAULT_MIN_VALID = 2  # fewer voting members than this: the group's baseline is too thin to trust
# TRL losses that normalise over tokens, not rows: a rollout's tokens weigh the same whether they
# are one row or several, so its branch rows together weigh as the rollout.
TOKEN_LEVEL_LOSSES = frozenset({"dapo", "bnpo", "dr_grpo", "cispo"})


# -- running rollouts ---------------------------------------------------------------------------
def args_from_request(request: dict[str, Any]) -> dict[str, Any]:
    """A RolloutRequest-shaped dict as the flat arguments the server's /rollout takes. `endpoint`
    may be a catalog name there (vllm, openai, hf_router): the server fills it in."""
    if isinstance(request.get("endpoint"), str):
        flat = {k: v for k, v in request.items() if k != "task"}
        args = RolloutArgs.model_validate({**flat, **request.get("task", {})})
        return args.model_dump(mode="json", exclude_none=True) | {"api_key": args.api_key.get_secret_value()}
    req = RolloutRequest.model_validate(request)
    # Unset fields left out: the flat arguments take no None where a request has one (task_id).
    flat = req.model_dump(mode="json", exclude={"task", "endpoint"}, exclude_none=True)
    task = req.task.model_dump(mode="json", exclude={"metadata"}, exclude_none=True)
    ep = req.endpoint
    return {**flat, **task, "base_url": ep.base_url, "model": ep.model, "api_key": ep.api_key.get_secret_value()}


def remote_runner(client: Any, concurrency: int = 8) -> RunMany:
    """Run through a harness-env server with a `HarnessEnv` client (results keep request order)."""

    def run(requests: list[dict[str, Any]]) -> list[RolloutResult]:
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            return list(pool.map(lambda r: _safe(lambda: client.run_rollout(args_from_request(r)), r), requests))

    return run


def _safe(fn: Callable[[], RolloutResult], request: dict[str, Any]) -> RolloutResult:
    try:
        return fn()
    except Exception as e:  # a refused or broken call is data for the trainer, never a crash
        task = request.get("task") or {}
        return RolloutResult(task_id=task.get("task_id"), error=f"{type(e).__name__}: {e}", error_kind="internal")


def main_row(result: RolloutResult) -> tuple[TrainingRow | None, int]:
    """The row of the branch holding the rollout's last policy turn (what the agent ended on),
    and how many other branches were left out."""
    rows = result.training_rows()
    if not rows:
        return None, 0
    last = max((t for t in result.proxy_turns if t.branch is not None), key=lambda t: t.index)
    main = next(r for r in rows if r.branch == last.branch)
    return main, len(rows) - 1


def vote(result: RolloutResult) -> float | None:
    """The reward a rollout brings to its group's statistics: None when it is masked (an end the
    agent did not cause: an infrastructure failure, a cancel) or unscored. An end the agent caused
    is graded and votes, and so does a rollout whose tokens cannot be trained (a policy must not
    turn a failing grade neutral by spoiling its own row)."""
    if result.mask_sample or result.reward is None or not math.isfinite(result.reward):
        return None
    return result.reward


def group_status(rewards: Sequence[float | None], min_valid: int = DEFAULT_MIN_VALID) -> str:
    """`all_failed` (no member votes), `too_few_valid` (fewer than `min_valid` do), `all_tied`
    (equal rewards: zero advantage) or `ok`."""
    scored = [r for r in rewards if r is not None]
    if not scored:
        return "all_failed"
    if len(scored) < min_valid:
        return "too_few_valid"
    if max(scored) - min(scored) < 1e-12:
        return "all_tied"
    return "ok"


def group_advantages(rewards: Sequence[float | None]) -> list[float]:
    """GRPO advantages of one group as TRL computes them from the rewards its reward function
    gets (reward minus the group mean, over the Bessel-corrected std + 1e-4): members with no
    vote (None) are left out of the mean and std and get 0, so a masked rollout changes no other
    member's advantage."""
    scored = [r for r in rewards if r is not None]
    if not scored:
        return [0.0] * len(rewards)
    mean = sum(scored) / len(scored)
    std = math.sqrt(sum((r - mean) ** 2 for r in scored) / (len(scored) - 1)) if len(scored) > 1 else 0.0
    return [0.0 if r is None else (r - mean) / (std + 1e-4) for r in rewards]


# -- GRPOTrainer rollout_func ---------------------------------------------------------------------
@dataclass
class HarnessRolloutFunc:
    """`GRPOTrainer(..., rollout_func=HarnessRolloutFunc(...), reward_funcs=[harness_reward])`.

    `request`: RolloutRequest fields shared by every rollout (endpoint, harness, limits,
    temperature: set it to the trainer's temperature); `task_for_prompt(prompt)` returns the Task
    fields for a prompt (a dataset lookup, say)."""

    run_many: RunMany
    task_for_prompt: TaskForPrompt
    request: dict[str, Any]
    num_generations: int | None = None  # rows per group (TRL's num_generations); default: the trainer's
    min_valid: int = DEFAULT_MIN_VALID  # a group with fewer voting members is marked too_few_valid
    # Rows per rollout: one per trainable branch (main first), up to this many. TRL takes exactly
    # one row per prompt entry, so a group of G rollouts needs num_generations = G * branch_slots.
    branch_slots: int = 1
    last_results: list[RolloutResult] = field(default_factory=list, repr=False)

    def __call__(self, prompts: list[Any], trainer: Any = None) -> dict[str, list[Any]]:
        k = self.branch_slots
        n = self.num_generations or getattr(getattr(trainer, "args", None), "num_generations", None) or len(prompts)
        loss = getattr(getattr(trainer, "args", None), "loss_type", None)
        if k < 1 or n % k or len(prompts) % k:
            raise ValueError(f"branch_slots={k} must divide num_generations ({n}) and the prompts handed over ({len(prompts)})")
        if k > 1 and loss is not None and loss not in TOKEN_LEVEL_LOSSES:
            raise ValueError(
                f"branch_slots={k} needs a token-level loss ({', '.join(sorted(TOKEN_LEVEL_LOSSES))}): "
                f"with loss_type={loss!r} each row weighs as a whole sequence, so a rollout's rows would weigh as several"
            )
        requests = [{**self.request, "task": self.task_for_prompt(p)} for p in prompts[::k]]  # one rollout per k entries
        results = self.run_many(requests)
        self.last_results = results
        return rollout_batch(results, n // k, filler_token_id=_filler(trainer), min_valid=self.min_valid, branch_slots=k)


def _filler(trainer: Any) -> int:
    tok = getattr(trainer, "processing_class", None)
    tok = getattr(tok, "tokenizer", tok)
    for name in ("eos_token_id", "pad_token_id"):
        value = getattr(tok, name, None)
        if isinstance(value, int):
            return value
    return 0


def rollout_batch(
    results: Sequence[RolloutResult], num_generations: int, filler_token_id: int = 0, min_valid: int = DEFAULT_MIN_VALID, branch_slots: int = 1
) -> dict[str, list[Any]]:
    """TRL's rollout_func output for `results` (consecutive groups of `num_generations` rollouts):
    `branch_slots` rows per rollout, its trainable branches (main first), then filler rows; every
    row of a rollout carries its reward, so TRL's group mean is the rollouts' mean and each row
    gets the rollout's advantage."""
    out: dict[str, list[Any]] = {
        k: []
        for k in (
            "prompt_ids",
            "completion_ids",
            "logprobs",
            "env_mask",
            "harness_reward",
            "harness_error",
            "rollout_type",
            "group_status",
            "dropped_branches",
            "agent_tool_calls",
            "mask_sample",
            "failure_kind",
            "harness_branch",
            "harness_advantage",
        )
    }
    rewards: list[float | None] = []
    for res in results:
        reward = vote(res)  # None: TRL leaves it out of the group's mean and std, advantage 0
        rows, untrainable = branch_rows(res)
        kept = rows[:branch_slots] if reward is not None else []
        for slot in range(branch_slots):
            row = kept[slot] if slot < len(kept) else None
            _add_row(out, row, filler_token_id)
            out["harness_branch"].append(row.branch if row is not None else None)
        why = res.error or next((r.untrainable_reason for r in untrainable), None) or (None if rows or untrainable else "no model call")
        for name, value in (
            ("harness_reward", reward),
            ("harness_error", why),
            ("rollout_type", res.rollout_type),
            ("dropped_branches", len(rows) + len(untrainable) - len(kept)),
            ("agent_tool_calls", res.agent_tool_calls),
            ("mask_sample", res.mask_sample),
            ("failure_kind", res.failure_kind),
        ):
            out[name] += [value] * branch_slots
        rewards.append(reward)
    for start in range(0, len(rewards), max(1, num_generations)):
        group = rewards[start : start + num_generations]
        out["group_status"] += [group_status(group, min_valid)] * (len(group) * branch_slots)
        # What TRL computes (scale_rewards="group") from the rows' rewards, for logs.
        out["harness_advantage"] += group_advantages([r for r in group for _ in range(branch_slots)])
    return out


def branch_rows(result: RolloutResult) -> tuple[list[TrainingRow], list[TrainingRow]]:
    """The rollout's trainable rows with sampled tokens, the main branch's first (the branch of its
    last policy turn, what the agent ended on), then by branch; and its untrainable rows."""
    rows = result.training_rows()
    main, _ = main_row(result)
    trainable = [r for r in rows if r.trainable and any(r.loss_mask)]
    trainable.sort(key=lambda r: (main is None or r.branch != main.branch, r.branch))
    return trainable, [r for r in rows if not r.trainable]


def _add_row(out: dict[str, list[Any]], row: TrainingRow | None, filler_token_id: int) -> None:
    if row is None:  # no row to train: one filler token TRL can batch, masked out of the loss
        out["prompt_ids"].append([filler_token_id])
        out["completion_ids"].append([filler_token_id])
        out["logprobs"].append([0.0])
        out["env_mask"].append([0])
        return
    p = row.prompt_length
    out["prompt_ids"].append(row.token_ids[:p])
    out["completion_ids"].append(row.token_ids[p:])
    out["logprobs"].append(row.logprobs[p:])
    out["env_mask"].append(row.loss_mask[p:])


def harness_reward(completions: list[Any] | None = None, harness_reward: list[float | None] | None = None, **_: Any) -> list[float | None]:
    """The reward function to pass with HarnessRolloutFunc: the rollout's own reward (None for an
    unscored rollout, which TRL leaves out)."""
    return list(harness_reward or [])


# -- loop-owning sessions (AsyncGRPOTrainer's HarnessRolloutWorker, OpenEnv's harness protocol) ----
class HarnessSession:
    """One rollout started by `HarnessSessionFactory.create`, running in a background thread."""

    def __init__(self, run_many: RunMany, request: dict[str, Any], episode_id: str | None) -> None:
        self.episode_id = episode_id or ""
        self.result: RolloutResult | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(run_many, request), daemon=True, name=f"harness-session-{self.episode_id}")
        self._thread.start()

    def _run(self, run_many: RunMany, request: dict[str, Any]) -> None:
        try:
            self.result = run_many([request])[0]
        except Exception as e:
            self.result = RolloutResult(error=f"{type(e).__name__}: {e}", error_kind="internal")
        finally:
            self._done.set()

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        """The agent's exit code (-1 when it had none); TimeoutError when not done in time."""
        if not self._done.wait(timeout_s):
            raise TimeoutError(f"rollout {self.episode_id} still running after {timeout_s}s")
        assert self.result is not None
        return self.result.agent_exit_code if self.result.agent_exit_code is not None else -1

    def fetch_proxy_trace(self) -> list[dict[str, Any]]:
        """One TraceEntry per turn of a trainable branch: its own prompt and completion ids,
        logprobs, a loss mask over prompt + completion, the reward, and metadata (node_id, branch,
        parent). None for a masked rollout."""
        self.wait_for_completion()
        res = self.result
        assert res is not None
        if res.mask_sample:  # nothing of a masked rollout trains
            return []
        rows, _ = branch_rows(res)
        by_index = {t.index: t for t in res.proxy_turns}
        entries = []
        # Branch by branch, the main one last (TRL reads the last entry as the agent's final answer):
        # TRL's worker chains consecutive entries that extend each other into one row and starts a
        # new row where one does not, so each trainable branch becomes exactly one row.
        for t in (by_index[i] for row in [*rows[1:], *rows[:1]] for i in row.turn_indices):
            entries.append(
                {
                    "request": {"messages": t.request_messages, "tools": t.request_tools},
                    "response": {"content": t.completion_text, "tool_calls": t.tool_calls, "finish_reason": t.finish_reason},
                    "prompt_token_ids": list(t.prompt_token_ids),
                    "completion_token_ids": list(t.completion_token_ids),
                    "per_token_logps": list(t.per_token_logps),
                    "loss_mask": [0] * len(t.prompt_token_ids) + t.completion_mask(),
                    "reward": res.reward,
                    "metadata": {
                        "node_id": f"{self.episode_id or res.sandbox_id}:{t.index}",
                        "turn": t.index,
                        "branch": t.branch,
                        "parent": t.parent,
                        "task_id": res.task_id,
                        "harness": res.harness,
                        "rollout_type": res.rollout_type,
                    },
                }
            )
        return entries

    def fetch_training_trace(self) -> Any:
        """The same turns as OpenEnv's TrainingTrace (what TRL's HarnessRolloutWorker reads).

        OpenEnv is imported here, not required by harness-env: the trainer host running TRL's
        harness worker installs `openenv` itself, and not beside the `harbor` extra (OpenEnv 0.10
        needs fastmcp < 4, Harbor 0.26 fastmcp >= 4.1.6)."""
        from openenv.core.harness import TrainingTrace

        return TrainingTrace.from_entries(self.fetch_proxy_trace())

    def verify(self, transcript: Any = None, final_state: Any = None) -> Any:
        """The rollout's reward as OpenEnv's VerifyResult (env_reward None: unscored)."""
        from openenv.core.harness import VerifyResult

        return VerifyResult(**self.verdict())

    def verdict(self) -> dict[str, Any]:
        """verify()'s fields as plain data: the rollout's vote, done, and its metrics."""
        self.wait_for_completion()
        res = self.result
        assert res is not None
        # None (masked or unscored): TRL's worker leaves it out of its group's mean and std.
        return {
            "env_reward": vote(res),
            "done": True,
            "metrics": {
                "agent_tool_calls": res.agent_tool_calls,
                "wall_s": res.wall_s,
                "error_kind": res.error_kind,
                "mask_sample": res.mask_sample,
                "failure_kind": res.failure_kind,
                "rollout_type": res.rollout_type,
                "branches": res.graph.branches,
            },
        }

    def close(self) -> None:
        """Nothing to release here: the engine removes the sandbox when the rollout ends (a rollout
        still running ends at its own agent_timeout_s)."""
        return None


@dataclass
class HarnessSessionFactory:
    """`create(task, seed=None, episode_id=None)` starts a rollout of `task` (Task fields, or the
    prompt messages, whose last user message becomes the instruction). Picklable when `run_many`
    is (e.g. `functools.partial` of a module-level function)."""

    run_many: RunMany
    request: dict[str, Any]
    sampling: dict[str, Any] | None = None

    def __call__(self, sampling: dict[str, Any] | None = None) -> HarnessSessionFactory:
        """TRL calls the factory callable with the trainer's sampling settings."""
        return HarnessSessionFactory(self.run_many, self.request, sampling)

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> HarnessSession:
        request = {**self.request, "task": task_fields(task)}
        if self.sampling and self.sampling.get("temperature") is not None:
            request["temperature"] = self.sampling["temperature"]
        return HarnessSession(self.run_many, request, episode_id)


def task_fields(task: Any) -> dict[str, Any]:
    if isinstance(task, dict):
        return task
    if isinstance(task, list):  # prompt messages
        users = [m for m in task if isinstance(m, dict) and m.get("role") == "user"]
        if users:
            content = users[-1].get("content")
            return {"instruction": content if isinstance(content, str) else str(content)}
    if isinstance(task, str):
        return {"instruction": task}
    raise TypeError(f"cannot make a task of {type(task).__name__}: pass Task fields (a dict), prompt messages or a string")
