"""Wire types, part 3: what a rollout gives back (RolloutResult, its turns, phases and training
rows), the events it emits while it runs, and what the listing tools return. Import them from
`harness_env.models`.

Field names of `RolloutResult` follow OpenEnv's pi_env result so its users feel at home; what we
add (harness, error_kind, phases, capture data) is additive.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SerializeAsAny, computed_field, model_validator

from harness_env.models.base import Mode

ErrorKind = Literal["invalid_request", "endpoint", "sandbox", "setup", "agent_timeout", "agent_error", "verify", "judge", "internal", "cancelled"]
# Ends the agent can bring about (its harness dying, a timeout, verify broken by what it left):
# such a rollout is still graded (verify ran on what was there, or the reward is 0) and
# error_kind says what happened. Every other kind is a failure of the endpoint, the sandbox or
# the server: reward None, left out of every mean and of training. `cancelled` (a caller's
# cancel) is neither: reward None, and not counted as an infrastructure failure.
AGENT_CAUSED_KINDS: frozenset[str] = frozenset({"agent_timeout", "agent_error", "verify"})


def is_masked(error_kind: str | None) -> bool:
    """The masking rule (RolloutResult.mask_sample, eval summaries): an end the agent did not cause."""
    return error_kind is not None and error_kind not in AGENT_CAUSED_KINDS


CaptureLevel = Literal["tokens", "logprobs", "text", "none"]
TurnPurpose = Literal["policy", "auxiliary"]
# How a turn follows from the turns before it (core/capture/graph.py; docs/training.md shows each).
LinkKind = Literal["extends", "template_rerender", "reasoning_dropped", "compaction", "subagent", "retry", "auxiliary", "new_thread"]
LINK_KINDS: tuple[str, ...] = LinkKind.__args__  # type: ignore[attr-defined]


class CommandResult(BaseModel):
    """One setup or verify command, as pi_env reports it."""

    cmd: str
    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    timed_out: bool = False


class TopLogprob(BaseModel):
    token: str
    logprob: float
    token_id: int | None = None


class Turn(BaseModel):
    """One model call seen by the capture proxy.

    Token ids and logprobs are exactly what the engine returned; where the engine gave none the
    lists are empty (never zero-filled) and `capture_level` says what was reached.
    """

    index: int
    purpose: TurnPurpose = "policy"
    stream: bool = False
    request_messages: list[dict[str, Any]] = Field(default_factory=list)
    request_tools: list[dict[str, Any]] = Field(default_factory=list)
    prompt_token_ids: list[int] = Field(default_factory=list)
    completion_token_ids: list[int] = Field(default_factory=list)
    per_token_logps: list[float] = Field(default_factory=list)
    completion_tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[list[TopLogprob]] = Field(default_factory=list)
    completion_text: str = ""
    reasoning_text: str = ""
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    finish_reason: str | None = None
    latency_s: float = 0.0
    ttft_s: float | None = None
    usage: dict[str, Any] | None = None
    upstream_status: int | None = None
    upstream_error: str | None = None
    capture_level: CaptureLevel = "none"
    # The turn graph (core/capture/graph.py): the turn this one continues, and its branch. Both
    # None for auxiliary and failed turns, which belong to no branch.
    parent: int | None = None
    branch: int | None = None
    # What the link to `parent` is (None until the graph is linked). A `retry` was answered with
    # its parent's answer again: it has no tokens of its own and no branch.
    link: LinkKind | None = None
    # The policy's weight version when the call was sent, as the trainer announced it (PUT
    # /policy/weights); None: none announced. `stale`: it lags the version at the rollout's end by
    # more than the rollout's max_weight_lag.
    weight_version: int | None = None
    stale: bool = False
    # Sampled under the rollout's `structured_regex`: its logprobs are the constrained sampler's
    # (the distribution the tokens were drawn from), not the model's own over the whole vocabulary.
    constrained: bool = False
    # Left out of the loss (loss_mask 0 on its completion): a constrained turn of a rollout with
    # `mask_constrained`. Its tokens stay in the row, as the context of what follows.
    masked: bool = False

    def completion_mask(self) -> list[int]:
        """The loss mask over the completion's tokens: 1 where a trainer learns, 0 where not."""
        return [0 if self.masked else 1] * len(self.completion_token_ids)

    @property
    def answered(self) -> bool:
        """The endpoint answered (HTTP 200) with something: a broken stream that still delivered
        text, tokens or tool calls counts; an error with nothing delivered does not."""
        if self.upstream_status != 200:
            return False
        return not self.upstream_error or bool(self.completion_token_ids or self.per_token_logps or self.completion_text or self.tool_calls)

    def continues(self, earlier: Turn) -> bool:
        """Whether this turn's prompt starts with `earlier`'s prompt + completion ids, so it carries
        on from what `earlier` sampled: the one prefix relation behind the turn graph
        (core/capture/graph.py), training rows and compact storage. A turn with no completion
        ids is continued by none."""
        p, c, prompt = earlier.prompt_token_ids, earlier.completion_token_ids, self.prompt_token_ids
        n = len(p)
        return bool(c) and len(prompt) >= n + len(c) and prompt[:n] == p and prompt[n : n + len(c)] == c


class GraphSummary(BaseModel):
    """The shape of a rollout's turn graph: how many branches a trainer gets rows for."""

    turns: int = 0
    branches: int = 0
    auxiliary_turns: int = 0  # e.g. title generation: kept in the trace, never trained on
    failed_turns: int = 0  # no answer from the endpoint
    trainable_tokens: int = 0  # sampled tokens in rows that can be trained on
    # Tokens the engine sampled for the policy's answered turns, and for auxiliary calls (never
    # trained). trainable_tokens / sampled_tokens is the share of the policy's samples a trainer
    # gets (1.0 unless a branch is untrainable).
    sampled_tokens: int = 0
    auxiliary_tokens: int = 0
    untrainable_branches: int = 0
    # Turns per link kind (LinkKind): how the harness's calls followed from one another.
    links: dict[str, int] = Field(default_factory=dict)
    # The weight versions the policy turns were sampled by; more than one: the rollout spans a
    # weight update. Rows of `stale_branches` hold a turn past the rollout's max_weight_lag.
    weight_versions: list[int] = Field(default_factory=list)
    spans_weight_versions: bool = False
    stale_branches: list[int] = Field(default_factory=list)

    @property
    def trained_share(self) -> float | None:
        """The share of the policy's sampled tokens that reach a trainable row (None: none sampled)."""
        return self.trainable_tokens / self.sampled_tokens if self.sampled_tokens else None


class TrainingRow(BaseModel):
    """One branch of a rollout as a trainer consumes it: the concatenated token ids, a loss mask
    (1 on tokens the engine sampled, 0 on prompt, tool results and user text) and the sampled
    tokens' logprobs aligned to it (0.0 where the mask is 0). `token_ids[:prompt_length]` is the
    branch's first prompt. A row that cannot be trained on says why and carries no tokens."""

    rollout_id: str = ""
    task_id: str | None = None
    branch: int
    turn_indices: list[int]
    token_ids: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    prompt_length: int = 0
    reward: float | None = None
    trainable: bool = True
    untrainable_reason: str | None = None
    stale: bool = False  # a turn of it was sampled more than max_weight_lag weight versions ago


class Phase(BaseModel):
    name: str
    started: float
    duration_s: float
    ok: bool = True
    detail: str = ""


class HarnessRunInfo(BaseModel):
    """What a harness that owns its environment says it ran (a trial's task, agent, sandbox, ...).
    A harness subclasses it with its own fields (envs/<harness>/options.py); read back from JSON
    without that class, the same fields are attributes all the same."""

    model_config = ConfigDict(extra="allow")


class ServedBy(BaseModel):
    """Which server ran a rollout: with replicas (Ray Serve, or several servers sharing a store),
    where to look for its logs, and whether the load spread."""

    host: str = Field(description="the host name of the machine (or pod) that ran it")
    instance: str = Field(description="the id of the server process in the job store")
    replica: str | None = Field(None, description="the Ray Serve replica id, when it ran in one")
    node: str | None = Field(None, description="the Ray node id, when it ran on a Ray cluster")


# The key a harness's run info had before it was `run_info` (the one harness with one then).
FORMER_RUN_INFO_KEY = "harbor"


class RolloutResult(BaseModel):
    # pi_env-compatible fields
    task_id: str | None = None
    sandbox_id: str = ""
    reward: float | None = None
    agent_exit_code: int | None = None
    wall_s: float = 0.0
    mode: Mode = "transparent_proxy"
    setup_results: list[CommandResult] = Field(default_factory=list)
    verify_results: list[CommandResult] = Field(default_factory=list)
    proxy_turns: list[Turn] = Field(default_factory=list)
    files: dict[str, str] = Field(default_factory=dict)
    agent_log_tail: str = ""
    proxy_log_tail: str = ""
    error: str | None = None
    # additions
    # The engine's id of this run (its phase events carry it too); empty for a request refused
    # before it ran.
    rollout_id: str = ""
    harness: str = ""
    error_kind: ErrorKind | None = None
    phases: list[Phase] = Field(default_factory=list)
    agent_tool_calls: int | None = None
    agent_final_text: str = ""
    capture_level: CaptureLevel = "none"
    # How calls that continue a thread were sent (the `continuity` option, where the endpoint can):
    # "tokens" when the proxy sent the ids it had (core/capture/continuity.py), else "messages".
    continuity: Literal["tokens", "messages"] = "messages"
    # verify_failed: verify could not run on what the agent left (reward 0; error_kind "verify").
    reward_source: Literal["reward_file", "verify_ratio", "judge", "zero_check", "verify_failed"] | None = None
    reward_notes: list[str] = Field(default_factory=list)
    sandbox_backend: str = ""
    sandbox_notes: list[str] = Field(default_factory=list)
    # Limits the rollout ran into, in words: resources (memory, processes, disk) and the capture
    # proxy's budgets (max_auxiliary_calls, max_recorded_mb); empty when none.
    limits_hit: list[str] = Field(default_factory=list)
    dropped_fields: list[str] = Field(default_factory=list)
    turn_limit_hit: bool = False
    graph: GraphSummary = Field(default_factory=GraphSummary)
    # A task family's grading evidence (svg_icon: the rendered PNG as base64, zero_reasons,
    # page_valid, the judge's raw answer and per-dimension scores, timings).
    grading: dict[str, Any] | None = None
    # `train` only when the endpoint gives token ids and processed (post-temperature) logprobs and
    # every turn was captured at token level; otherwise `eval`, and the reason says why.
    rollout_type: Literal["train", "eval"] = "eval"
    rollout_type_reason: str = ""
    # A harness's own account of what it ran (its run-info model, a HarnessRunInfo). A client reads
    # it back as a HarnessRunInfo: same attributes. Results stored before it had this name carry it
    # under the key of the one harness that had one ("harbor"): still read (FORMER_RUN_INFO_KEY).
    run_info: SerializeAsAny[HarnessRunInfo] | None = Field(None, validation_alias=AliasChoices("run_info", FORMER_RUN_INFO_KEY))
    # The agent's ATIF trajectory (trajectory.json), when the harness's agent wrote one.
    agent_trajectory: dict[str, Any] | None = None
    # The server (replica, node) that ran it; None when it ran in-process, without a server.
    served_by: ServedBy | None = None

    # NeMo-Gym's vocabulary, derived from error_kind and error so the two can never disagree; they
    # are in the JSON a client receives (and ignored when a result is read back).
    @computed_field  # type: ignore[prop-decorator]
    @property
    def mask_sample(self) -> bool:
        """True when the sample must not train and must not count in its GRPO group: an end the
        agent did not cause (an infrastructure failure, reward None; or a cancel). A rollout with
        no verify command is unscored (reward None) but not masked: nothing failed."""
        return is_masked(self.error_kind)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def failure_kind(self) -> str | None:
        """What broke (error_kind), or None when nothing did."""
        return self.error_kind

    @computed_field  # type: ignore[prop-decorator]
    @property
    def failure_reason(self) -> str | None:
        """Why, in words (error)."""
        return self.error

    @property
    def harbor(self) -> HarnessRunInfo | None:
        """The former name of `run_info`."""
        return self.run_info

    def training_rows(self) -> list[TrainingRow]:
        """One row per branch of the turn graph; auxiliary and failed turns are left out. Rows of a
        rollout with no reward (an infrastructure failure) carry reward None: skip them."""
        by_branch: dict[int, list[Turn]] = {}
        for t in sorted(self.proxy_turns, key=lambda t: t.index):
            if t.branch is not None:
                by_branch.setdefault(t.branch, []).append(t)
        return [_branch_row(b, turns, self.reward, self.task_id, self.rollout_id) for b, turns in sorted(by_branch.items())]

    @model_validator(mode="after")
    def _finite_reward(self) -> RolloutResult:
        if self.reward is not None and not math.isfinite(self.reward):
            raise ValueError("reward must be a finite number or None")
        return self


def _branch_row(branch: int, turns: list[Turn], reward: float | None, task_id: str | None, rollout_id: str) -> TrainingRow:
    row = TrainingRow(
        rollout_id=rollout_id, task_id=task_id, branch=branch, turn_indices=[t.index for t in turns], reward=reward, stale=any(t.stale for t in turns)
    )
    for previous, t in zip([None, *turns], turns):
        if not t.prompt_token_ids or not t.completion_token_ids:
            row.trainable, row.untrainable_reason = False, f"turn {t.index} has no token ids (capture level {t.capture_level})"
        elif len(t.per_token_logps) != len(t.completion_token_ids):
            row.trainable, row.untrainable_reason = False, f"turn {t.index} has {len(t.per_token_logps)} logprobs for {len(t.completion_token_ids)} tokens"
        elif previous is not None and not t.continues(previous):  # the row so far is previous's prompt + completion
            row.trainable, row.untrainable_reason = False, f"turn {t.index} does not extend its branch's tokens"
        if not row.trainable:
            row.token_ids, row.loss_mask, row.logprobs, row.prompt_length = [], [], [], 0
            return row
        new_prompt = t.prompt_token_ids[len(row.token_ids) :]  # the turn extends the branch so far
        if not row.token_ids:
            row.prompt_length = len(new_prompt)
        row.token_ids += new_prompt + t.completion_token_ids
        row.loss_mask += [0] * len(new_prompt) + t.completion_mask()
        row.logprobs += [0.0] * len(new_prompt) + t.per_token_logps
    return row


class PhaseEvent(BaseModel):
    """Emitted while a rollout runs (CLI progress, web live log, MCP progress)."""

    rollout_id: str
    phase: str
    status: Literal["started", "finished", "failed", "info"]
    elapsed_s: float
    detail: str = ""


class HarnessInfo(BaseModel):
    name: str
    installed: bool
    version: str | None
    pinned_version: str | None
    capabilities: list[str] = Field(default_factory=list)


class DatasetTaskInfo(BaseModel):
    """One task of a dataset directory on the server, as `list_tasks` shows it: `index` is what a
    harness's `task_index` option counts."""

    index: int
    name: str
    path: str  # relative to the listed root
    instruction: str  # the first 500 characters
    agent_timeout_s: float | None = None
    verifier_timeout_s: float | None = None
    has_solution: bool = False
