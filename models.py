"""Wire types shared by the engine, the server and the client.

Field names of `RolloutResult` follow OpenEnv's pi_env result so its users feel at home; what we add
(harness, error_kind, phases, capture data) is additive. Every size and count has a bound so a bad
request fails validation with a clear message instead of exhausting the server.
"""

from __future__ import annotations

import math
import posixpath
import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator

MAX_INSTRUCTION_CHARS = 200_000
MAX_COMMANDS = 64
MAX_COMMAND_CHARS = 20_000
MAX_FILES = 256
MAX_FILE_CHARS = 2_000_000
MAX_TOTAL_FILE_CHARS = 16_000_000
MAX_PATH_CHARS = 512
MAX_NAME_BYTES = 255  # one path component: what Linux file systems allow
MAX_NESTING = 32  # levels of lists and objects in free-form values (harness_config, ...)

Mode = Literal["transparent_proxy", "black_box"]
ErrorKind = Literal[
    "invalid_request", "endpoint", "sandbox", "setup", "agent_timeout", "agent_error", "verify", "judge", "internal"
]
CaptureLevel = Literal["tokens", "logprobs", "text", "none"]
TurnPurpose = Literal["policy", "auxiliary"]


def _check_relative_path(path: str) -> str:
    if not path or len(path) > MAX_PATH_CHARS:
        raise ValueError(f"file path must be 1..{MAX_PATH_CHARS} characters, got {len(path)}")
    if "\x00" in path:
        raise ValueError(f"file path {path!r} contains a NUL byte")
    if path.startswith("/"):
        raise ValueError(f"file path {path!r} must be relative to the workspace, not absolute")
    norm = posixpath.normpath(path)
    if norm == "." or norm.startswith("../") or norm == "..":
        raise ValueError(f"file path {path!r} must stay inside the workspace (no '..')")
    for part in norm.split("/"):
        if len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
            raise ValueError(f"file path {path[:60]!r}...: a name in it is over {MAX_NAME_BYTES} bytes; shorten it")
    return norm


def _check_file_tree(paths: list[str]) -> None:
    """Every path names one file, and no file is also a directory of another (both cannot be written)."""
    seen: set[str] = set()
    for path in paths:
        if path in seen:
            raise ValueError(f"file path {path!r} is given twice (after normalising); give each file once")
        seen.add(path)
    for path in paths:
        parent = posixpath.dirname(path)
        while parent:
            if parent in seen:
                raise ValueError(f"{parent!r} is both a file and the directory of {path!r}; rename one of them")
            parent = posixpath.dirname(parent)


def check_http_url(url: str) -> str:
    """`url` parsed as urllib parses it, or a clear ValueError (e.g. 'http://[::1' raises in urlsplit)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port out of range or not a number raises here
    except ValueError as e:
        raise ValueError(f"base_url is not a valid URL ({e}); give http(s)://host[:port]/path") from None
    if parts.scheme in ("http", "https") and not parts.hostname:
        raise ValueError("base_url has no host; give http(s)://host[:port]/path")
    return url


MAX_MAPPING_CHARS = 100_000


def _bounded_mapping(value: dict[str, Any], name: str) -> dict[str, Any]:
    if len(repr(value)) > MAX_MAPPING_CHARS:
        raise ValueError(f"{name} is larger than {MAX_MAPPING_CHARS} characters")
    return value


_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_text(value: Any, name: str) -> Any:
    """Raw input of field `name`: every string valid Unicode (a lone surrogate cannot be encoded
    into a file, an argv or a header) and lists/objects at most MAX_NESTING levels deep (deeper ones
    exhaust the recursion of whatever copies or serialises them later). Iterative: any depth is safe."""
    stack: list[tuple[Any, str, int]] = [(value, name, 0)]
    while stack:
        v, where, depth = stack.pop()
        if isinstance(v, str):
            if not v.isascii() and (m := _SURROGATE.search(v)):
                raise ValueError(f"{where} contains a lone surrogate (U+{ord(m.group()):04X} at character {m.start()}); send valid Unicode text")
        elif isinstance(v, (dict, list, tuple)):
            if depth >= MAX_NESTING:
                raise ValueError(f"{name} is nested more than {MAX_NESTING} levels deep; flatten it")
            for k, item in (v.items() if isinstance(v, dict) else enumerate(v)):
                key = f"{where}[{k[:40]!r}]" if isinstance(k, str) else f"{where}[{k!r}]"
                if isinstance(k, str):
                    stack.append((k, f"a key of {where}", depth + 1))
                stack.append((item, key, depth + 1))
    return value


class Task(BaseModel):
    """What the agent must do and how it is checked.

    `files` are written into the workspace before `setup` runs; `setup` runs before the agent
    starts; `verify` runs after it. A verify command may write one float to the file named by
    `$HARNESS_ENV_REWARD_FILE` (also reachable at /logs/verifier/reward.txt and
    /root/logs/verifier/reward.txt under bubblewrap); otherwise the reward is passed/total.
    """

    model_config = ConfigDict(extra="forbid")

    instruction: str = Field(min_length=1, max_length=MAX_INSTRUCTION_CHARS)
    setup: list[str] = Field(default_factory=list, max_length=MAX_COMMANDS)
    verify: list[str] = Field(default_factory=list, max_length=MAX_COMMANDS)
    files: dict[str, str] = Field(default_factory=dict)
    task_id: str | None = Field(default=None, max_length=256)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("*", mode="before")
    @classmethod
    def _valid_text(cls, v: Any, info: ValidationInfo) -> Any:
        return _check_text(v, info.field_name or "value")

    @field_validator("setup", "verify")
    @classmethod
    def _commands_bounded(cls, cmds: list[str]) -> list[str]:
        for i, cmd in enumerate(cmds):
            if not cmd.strip():
                raise ValueError(f"command #{i + 1} is empty")
            if len(cmd) > MAX_COMMAND_CHARS:
                raise ValueError(f"command #{i + 1} is {len(cmd)} characters; the limit is {MAX_COMMAND_CHARS}")
        return cmds

    @field_validator("files")
    @classmethod
    def _files_bounded(cls, files: dict[str, str]) -> dict[str, str]:
        if len(files) > MAX_FILES:
            raise ValueError(f"{len(files)} files given; the limit is {MAX_FILES}")
        total = 0
        out: dict[str, str] = {}
        norms: list[str] = []
        for path, content in files.items():
            norm = _check_relative_path(path)
            norms.append(norm)
            if len(content) > MAX_FILE_CHARS:
                raise ValueError(f"file {path!r} is {len(content)} characters; the limit is {MAX_FILE_CHARS}")
            total += len(content)
            out[norm] = content
        if total > MAX_TOTAL_FILE_CHARS:
            raise ValueError(f"files total {total} characters; the limit is {MAX_TOTAL_FILE_CHARS}")
        _check_file_tree(norms)
        return out

    @field_validator("metadata")
    @classmethod
    def _metadata_bounded(cls, meta: dict[str, Any]) -> dict[str, Any]:
        return _bounded_mapping(meta, "metadata")


class Endpoint(BaseModel):
    """An OpenAI-compatible policy endpoint. The key never leaves the server process."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(min_length=1, max_length=2048)
    api_key: SecretStr = SecretStr("")
    model: str = Field(min_length=1, max_length=512)

    @field_validator("*", mode="before")
    @classmethod
    def _valid_text(cls, v: Any, info: ValidationInfo) -> Any:
        return _check_text(v, info.field_name or "value")

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {url!r}")
        return check_http_url(url).rstrip("/")


# A Harbor task's instruction is read from its instruction.md when the request is prepared
# (envs/harbor/resolve.py); until then the request's Task carries this stand-in.
HARBOR_INSTRUCTION_PLACEHOLDER = "(the instruction of the Harbor task named in `harbor`)"
HARBOR_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class HarborOptions(BaseModel):
    """harness="harbor": which Harbor task, Harbor agent and Harbor environment ("sandbox").

    The task is `task_dir` (one Harbor task directory), or task `task_index` of the dataset
    directory `dataset` (optionally inside its subdirectory `split`); with neither, the request's
    uniform Task is converted into a Harbor task. On a server, both paths are relative to
    HARNESS_ENV_HARBOR_TASKS_DIR (and must stay inside it)."""

    model_config = ConfigDict(extra="forbid")

    task_dir: str | None = Field(default=None, min_length=1, max_length=1024)
    dataset: str | None = Field(default=None, min_length=1, max_length=1024)
    split: str | None = Field(default=None, min_length=1, max_length=128, pattern=HARBOR_NAME_PATTERN)
    task_index: int = Field(default=0, ge=0, le=10_000_000)
    # A Harbor agent name (pi, opencode, oracle, nop, codex, claude-code, terminus-2, ...).
    agent: str = Field(default="pi", min_length=1, max_length=64, pattern=HARBOR_NAME_PATTERN)
    agent_kwargs: dict[str, Any] = Field(default_factory=dict)  # Harbor's per-agent options
    # "local" (ours: bubblewrap, no Docker) or a Harbor provider: docker, daytona, e2b, modal, ...
    sandbox: str = Field(default="local", min_length=1, max_length=64, pattern=HARBOR_NAME_PATTERN)
    sandbox_kwargs: dict[str, Any] = Field(default_factory=dict)  # the provider's own options
    # Which entry of a reward.json map is the reward (default: its only key, else "reward").
    reward_key: str | None = Field(default=None, min_length=1, max_length=256)

    @field_validator("*", mode="before")
    @classmethod
    def _valid_text(cls, v: Any, info: ValidationInfo) -> Any:
        return _check_text(v, info.field_name or "value")

    @field_validator("agent_kwargs", "sandbox_kwargs")
    @classmethod
    def _kwargs_bounded(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        return _bounded_mapping(cfg, "agent_kwargs / sandbox_kwargs")

    @model_validator(mode="after")
    def _one_source(self) -> HarborOptions:
        if self.task_dir and self.dataset:
            raise ValueError("give harbor.task_dir or harbor.dataset (with task_index), not both")
        if self.split and not self.dataset:
            raise ValueError("harbor.split names a subdirectory of harbor.dataset; give the dataset too")
        return self

    @property
    def names_task(self) -> bool:
        return bool(self.task_dir or self.dataset)


class HarborTaskInfo(BaseModel):
    """One task of a Harbor dataset, as `list_tasks` shows it."""

    index: int
    name: str
    path: str  # relative to the listed root
    instruction: str  # the first 500 characters
    agent_timeout_s: float | None = None
    verifier_timeout_s: float | None = None
    has_solution: bool = False


class HarborRunInfo(BaseModel):
    """What Harbor ran, in a harness="harbor" result."""

    task_name: str = ""
    task_path: str = ""
    agent: str = ""
    agent_version: str | None = None
    sandbox: str = ""
    exception: str | None = None  # Harbor's own "Type: message", when its trial failed
    verifier_rewards: dict[str, float] | None = None  # reward.json's whole map, when it was one


class RolloutOptions(BaseModel):
    """How a rollout runs, shared by the resolved request and the flat tool arguments."""

    model_config = ConfigDict(extra="forbid")

    harness: str = Field(default="pi", min_length=1, max_length=64)
    mode: Mode = "transparent_proxy"
    max_tokens_cap: int | None = Field(default=None, ge=1, le=1_000_000)
    top_logprobs: int = Field(default=0, ge=0, le=20)
    # Set on every policy call by the proxy, whatever the harness asks: a trainer's logprobs
    # match the sampler's only at the temperature it trains with.
    temperature: float | None = Field(default=None, ge=0, le=10, allow_inf_nan=False)
    max_turns: int | None = Field(default=None, ge=1, le=10_000)
    agent_timeout_s: float = Field(default=600.0, gt=0, le=86_400, allow_inf_nan=False)
    setup_timeout_s: float = Field(default=300.0, gt=0, le=86_400, allow_inf_nan=False)
    verify_timeout_s: float = Field(default=300.0, gt=0, le=86_400, allow_inf_nan=False)
    # Extra harness configuration, deep-merged last into the harness's own config (OpenCode's
    # opencode.json); harnesses without such a file ignore it.
    harness_config: dict[str, Any] = Field(default_factory=dict)
    # "correctness": the verify reward; "tool_efficiency": correctness * (1 + 0.1 * 15 / (15 + tool calls))
    reward_mode: Literal["correctness", "tool_efficiency"] = "correctness"
    # A task family (families/: e.g. "svg_icon") prepares what the agent gets from the instruction
    # and grades the submission instead of the verify commands; family_options are its own fields
    # (svg_icon: reference_png, rubric, renderer).
    task_family: str | None = Field(default=None, min_length=1, max_length=64)
    family_options: dict[str, Any] = Field(default_factory=dict)
    # The rollout's sandbox limits (cgroups and a size-limited filesystem where the machine has
    # them; the result's sandbox_notes say which applied and which were hit). A server caps each
    # with HARNESS_ENV_MAX_<NAME> (e.g. HARNESS_ENV_MAX_MEMORY_LIMIT_MB).
    memory_limit_mb: int = Field(default=4096, ge=64, le=1_048_576, description="memory of all the rollout's processes together, MiB")
    pids_limit: int = Field(default=1024, ge=16, le=1_000_000, description="processes and threads of the rollout at once")
    disk_limit_mb: int = Field(default=4096, ge=16, le=1_048_576, description="size of the rollout's directory and /tmp, MiB")
    cpu_limit: float | None = Field(default=None, gt=0, le=1024, allow_inf_nan=False, description="CPU cores the rollout may use (None: no cap)")
    # "proxy_only": agent and verify commands reach nothing on the network but the capture proxy
    # (bubblewrap's network namespace; setup commands keep the host network); "open": the host's
    # network, including the policy endpoint directly.
    network: Literal["proxy_only", "open"] = Field(default="proxy_only", description="what agent and verify commands reach: proxy_only (the capture proxy) or open (the host's network)")
    # harness="harbor" only: the Harbor task, agent and environment.
    harbor: HarborOptions | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _valid_text(cls, v: Any, info: ValidationInfo) -> Any:
        # Every field, also RolloutArgs' and RolloutRequest's: text reaches files, argv and headers.
        return _check_text(v, info.field_name or "value")

    @field_validator("harness_config", "family_options")
    @classmethod
    def _config_bounded(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        return _bounded_mapping(cfg, "harness_config / family_options")

    @field_validator("agent_timeout_s", "setup_timeout_s", "verify_timeout_s")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("timeouts must be finite numbers of seconds")
        return v


class RolloutRequest(RolloutOptions):
    """A fully resolved rollout: the task, the endpoint, the options."""

    task: Task
    endpoint: Endpoint
    disable_thinking: bool = False

    @model_validator(mode="before")
    @classmethod
    def _harbor_task_stand_in(cls, data: Any) -> Any:
        # A Harbor task directory brings its own instruction: the Task may be left out.
        if isinstance(data, dict) and "task" not in data:
            harbor = data.get("harbor")
            named = harbor.names_task if isinstance(harbor, HarborOptions) else isinstance(harbor, dict) and (harbor.get("task_dir") or harbor.get("dataset"))
            if named:
                data = {**data, "task": Task(instruction=HARBOR_INSTRUCTION_PLACEHOLDER)}
        return data

    @model_validator(mode="after")
    def _harbor_only_with_harbor(self) -> RolloutRequest:
        if self.harbor is not None and self.harness != "harbor":
            raise ValueError(f"`harbor` options are for harness='harbor', not {self.harness!r}")
        return self


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

    @property
    def answered(self) -> bool:
        """The endpoint answered (HTTP 200) with something: a broken stream that still delivered
        text, tokens or tool calls counts; an error with nothing delivered does not."""
        if self.upstream_status != 200:
            return False
        return not self.upstream_error or bool(self.completion_token_ids or self.per_token_logps or self.completion_text or self.tool_calls)


class GraphSummary(BaseModel):
    """The shape of a rollout's turn graph: how many branches a trainer gets rows for."""

    turns: int = 0
    branches: int = 0
    auxiliary_turns: int = 0  # e.g. title generation: kept in the trace, never trained on
    failed_turns: int = 0  # no answer from the endpoint
    trainable_tokens: int = 0  # sampled tokens in rows that can be trained on
    untrainable_branches: int = 0


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


class Phase(BaseModel):
    name: str
    started: float
    duration_s: float
    ok: bool = True
    detail: str = ""


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
    harness: str = ""
    error_kind: ErrorKind | None = None
    phases: list[Phase] = Field(default_factory=list)
    agent_tool_calls: int | None = None
    agent_final_text: str = ""
    capture_level: CaptureLevel = "none"
    reward_source: Literal["reward_file", "verify_ratio", "judge", "zero_check"] | None = None
    reward_notes: list[str] = Field(default_factory=list)
    sandbox_backend: str = ""
    sandbox_notes: list[str] = Field(default_factory=list)
    # Resource limits the rollout ran into (memory, processes, disk), in words; empty when none.
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
    # harness="harbor": what Harbor ran, and the agent's ATIF trajectory (Harbor's trajectory.json)
    # when the agent wrote one.
    harbor: HarborRunInfo | None = None
    agent_trajectory: dict[str, Any] | None = None

    def training_rows(self) -> list[TrainingRow]:
        """One row per branch of the turn graph; auxiliary and failed turns are left out. Rows of a
        rollout with no reward (an infrastructure failure) carry reward None: skip them."""
        by_branch: dict[int, list[Turn]] = {}
        for t in sorted(self.proxy_turns, key=lambda t: t.index):
            if t.branch is not None:
                by_branch.setdefault(t.branch, []).append(t)
        return [_branch_row(b, turns, self.reward, self.task_id, self.sandbox_id) for b, turns in sorted(by_branch.items())]

    @model_validator(mode="after")
    def _finite_reward(self) -> RolloutResult:
        if self.reward is not None and not math.isfinite(self.reward):
            raise ValueError("reward must be a finite number or None")
        return self


def _branch_row(branch: int, turns: list[Turn], reward: float | None, task_id: str | None, rollout_id: str) -> TrainingRow:
    row = TrainingRow(rollout_id=rollout_id, task_id=task_id, branch=branch, turn_indices=[t.index for t in turns], reward=reward)
    for t in turns:
        if not t.prompt_token_ids or not t.completion_token_ids:
            row.trainable, row.untrainable_reason = False, f"turn {t.index} has no token ids (capture level {t.capture_level})"
        elif len(t.per_token_logps) != len(t.completion_token_ids):
            row.trainable, row.untrainable_reason = False, f"turn {t.index} has {len(t.per_token_logps)} logprobs for {len(t.completion_token_ids)} tokens"
        elif t.prompt_token_ids[: len(row.token_ids)] != row.token_ids:
            row.trainable, row.untrainable_reason = False, f"turn {t.index} does not extend its branch's tokens"
        if not row.trainable:
            row.token_ids, row.loss_mask, row.logprobs, row.prompt_length = [], [], [], 0
            return row
        new_prompt = t.prompt_token_ids[len(row.token_ids):]  # the turn extends the branch so far
        if not row.token_ids:
            row.prompt_length = len(new_prompt)
        row.token_ids += new_prompt + t.completion_token_ids
        row.loss_mask += [0] * len(new_prompt) + [1] * len(t.completion_token_ids)
        row.logprobs += [0.0] * len(new_prompt) + t.per_token_logps
    return row


class PhaseEvent(BaseModel):
    """Emitted while a rollout runs (CLI progress, web live log, MCP progress)."""

    rollout_id: str
    phase: str
    status: Literal["started", "finished", "failed", "info"]
    elapsed_s: float
    detail: str = ""


class RolloutArgs(RolloutOptions):
    """The flat arguments of the `run_rollout` tool (MCP, HTTP, client), as OpenEnv's pi_env takes
    them, plus harness, files and max_turns. The server resolves them into a RolloutRequest:
    `endpoint` names a catalog entry (vllm, openai, hf_router) whose values come from the server's
    environment; explicit base_url / api_key / model win."""

    instruction: str = Field(default="", max_length=MAX_INSTRUCTION_CHARS)
    endpoint: str = Field(default="", max_length=64)
    base_url: str = Field(default="", max_length=2048)
    api_key: SecretStr = SecretStr("")
    model: str = Field(default="", max_length=512)
    setup: list[str] | None = None
    verify: list[str] | None = None
    files: dict[str, str] | None = None
    task_id: str = Field(default="", max_length=256)
    disable_thinking: bool | None = None  # None: the endpoint kind's default

    @field_validator("base_url")
    @classmethod
    def _parsable_url(cls, url: str) -> str:
        # Only parsable here; the scheme and host are checked once the endpoint is resolved.
        return check_http_url(url) if url else url

    @model_validator(mode="after")
    def _instruction_given(self) -> RolloutArgs:
        if not self.instruction and not (self.harbor and self.harbor.names_task):
            raise ValueError("instruction is required (it may be left out only when harbor.task_dir or harbor.dataset names a Harbor task)")
        return self


class HarnessInfo(BaseModel):
    name: str
    installed: bool
    version: str | None
    pinned_version: str | None
    capabilities: list[str] = Field(default_factory=list)
