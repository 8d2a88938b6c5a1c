"""Wire types, part 2: how a rollout runs. Import them from `harness_env.models`.

Options are declared once. Each rollout option is one pydantic field with its description, default
and bounds (and the group it is shown in); the CLI flags (cli_flags.py), the MCP tool's input schema and
description (server/mcp/rollout.py), the HTTP schema (FastAPI reads RolloutArgs) and the web form's
controls (server/web/form.py) are derived from these fields, never restated. Adding an option is
adding a field here.

A harness's own options are one nested object, `harness_options`, declared by the harness as a
HarnessOptions subclass (its `options_model`, in envs/<harness>/options.py) with the same kind of
fields: the shared code derives their flags, schema and controls from the harness registry and
names no harness. Wherever the registry is loaded (the server, the CLI, the engine) they are
validated with the rest of the request; a client that has only these wire types sends them as
given, and the server validates them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, Field, SecretStr, ValidationInfo, WithJsonSchema, field_validator, model_validator

from harness_env.models.base import (
    IMAGE_DESCRIPTION,
    MAX_IMAGE_CHARS,
    MAX_INSTRUCTION_CHARS,
    NO_MODEL_ENDPOINT,
    WIRE_API_DESCRIPTION,
    CheckedText,
    Endpoint,
    Mode,
    Task,
    WireApi,
    bounded_mapping,
    check_http_url,
    check_text,
)

HARNESS_OPTIONS = "harness_options"
DEFAULT_HARNESS = "pi"
# A task named by the harness options brings its own instruction, read when the request is prepared
# (the harness's prepare); until then the request's Task carries this stand-in.
NAMED_TASK_INSTRUCTION = "(the instruction of the task named in the harness options)"
OPTION_GROUPS = ("harness", "limits", "capture", "reward", "sandbox")  # how the CLI and the web form group them
# (RolloutArgs' other fields are in groups "task" and "endpoint": the surfaces lay those out themselves)


def option(default: Any, description: str, *, group: str, **bounds: Any) -> Any:
    """A rollout option's field: its default, description, bounds, and the group its CLI flag and
    web control sit in (`cli=...` names another flag that carries it, for a harness option)."""
    extra: dict[str, Any] = {"group": group}
    if "cli" in bounds:
        extra["cli"] = bounds.pop("cli")
    return Field(default, description=description, json_schema_extra=extra, **bounds)


def option_group(info: Any) -> str:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    return str(extra.get("group", "harness"))


# The harness registry (name -> harness class), handed over by core/registry.py when it is
# imported: the wire types import nothing from the engine and name no harness. Where no engine is
# loaded (a client with only these types) harness options stay a bounded mapping, typed when the
# server prepares the request.
_harness_registry: Mapping[str, Any] | None = None


def use_harness_registry(registry: Mapping[str, Any]) -> None:
    global _harness_registry
    _harness_registry = registry


def harness_options_model(harness: str) -> type[HarnessOptions] | None | Literal[False]:
    """The options model of `harness` from the harness registry; None when the harness has none;
    False when that is not known here: no registry in this process (a client), or a harness it
    does not list (refused by name when prepared)."""
    cls = _harness_registry.get(harness) if _harness_registry is not None else None
    if cls is None:
        return False
    return getattr(cls, "options_model", None)


class HarnessOptions(CheckedText):
    """The base of a harness's own options (`options_model` on its class). Fields are declared as
    the rollout options are (`option(...)`); the hooks below say what fields alone cannot."""

    label: ClassVar[str] = ""  # how messages and the web form name these options
    names_task_hint: ClassVar[str] = ""  # when the instruction may be left out, in words

    @property
    def names_task(self) -> bool:
        """The options name a task of their own (which brings its instruction)."""
        return False

    @property
    def calls_model(self) -> bool:
        """The agent these options choose calls the policy (Harbor's oracle and nop do not: they
        need no endpoint)."""
        return True

    @classmethod
    def of(cls, request: RolloutOptions) -> Self:
        """The request's harness options as this model (its defaults when none were given)."""
        raw = request.harness_options
        if isinstance(raw, cls):
            return raw
        return cls.model_validate(raw.model_dump() if isinstance(raw, BaseModel) else (raw or {}))

    @classmethod
    def upgrade_request(cls, data: dict[str, Any]) -> dict[str, Any]:
        """A request (as sent: a dict) in the form these options have now, from a form an earlier
        version of the harness took (its options under a key of their own, say); raise ValueError
        (one line) for one that cannot be upgraded. Asked of every harness before any request is
        validated where the harness registry is loaded. Default: as given."""
        return data

    @classmethod
    def from_command_line(cls, name: str, flags: dict[str, Any], shared: dict[str, tuple[str, ...]]) -> dict[str, Any] | None:
        """The options `harness-env run` gives harness `name`, or None when the command line is not
        for it. `flags`: the run command's values by destination (None: not given), this model's
        fields among them; `shared`: the values of a flag this model shares with the command's own
        (--sandbox) that are the command's, not this model's. Raise ValueError (one line) for a
        combination that cannot work."""
        given = {k: v for k in cls.model_fields if (v := flags.get(k)) is not None and v not in shared.get(k, ())}
        harness = flags.get("harness")
        if not given:
            return {} if harness == name else None
        if harness not in (None, name):
            names = " and ".join("--" + k.replace("_", "-") for k in given)
            verb = f"is a {cls.label} option: it is" if len(given) == 1 else f"are {cls.label} options: they are"
            raise ValueError(f"{names} {verb} for --harness {name}, not --harness {harness}")
        return given

    @classmethod
    def cli_commands(cls) -> dict[str, tuple[str, Any, Any]]:
        """`harness-env` subcommands of this harness: name -> (help, add_arguments(parser), run(args) -> exit code)."""
        return {}

    @classmethod
    def choices(cls) -> dict[str, list[tuple[str, str]]]:
        """(label, value) choices of fields the web form offers as a dropdown, by field name."""
        return {}


class RolloutOptions(CheckedText):
    """How a rollout runs, shared by the resolved request and the flat tool arguments."""

    # The harness, first: harness_options are validated by its options model.
    harness: str = option(
        DEFAULT_HARNESS, "the harness that runs the agent (the server's harnesses: list_harnesses)", group="harness", min_length=1, max_length=64
    )
    mode: Mode = option(
        "transparent_proxy",
        "transparent_proxy: the capture proxy asks the endpoint for token ids and "
        "logprobs of every model call; black_box: it records the calls and asks for nothing extra",
        group="harness",
    )
    harness_config: dict[str, Any] = option(
        {},
        "extra harness configuration, deep-merged last into the harness's own config "
        "(OpenCode's opencode.json, the white-box loop's tool_timeout_s and "
        "max_tool_output_bytes); harnesses without one ignore it",
        group="harness",
    )
    harness_options: Annotated[Any, WithJsonSchema({"anyOf": [{"type": "object"}, {"type": "null"}]})] = Field(
        None,
        description="the harness's own options (an object; only for a harness that has options: see its options model)",
        json_schema_extra={"group": "harness"},
    )
    max_turns: int | None = option(None, "the most model calls the agent may make; none: no limit", group="limits", ge=1, le=10_000)
    # Calls without tools (titles, summaries, token counts) are not turns; these two bound them and
    # what the capture proxy holds for the rollout (core/capture/session.py). Past either, the
    # proxy refuses the call with a 429 naming the option, and the rollout is graded as it stands.
    max_auxiliary_calls: int = option(
        1000,
        "the most model calls without tools (titles, summaries, token counts) the agent may make; past it the capture proxy refuses them",
        group="limits",
        ge=0,
        le=100_000,
    )
    max_recorded_mb: int = option(
        256,
        "MiB of model calls (messages, answers, token ids and logprobs) the capture proxy may "
        "record for the rollout; past it the proxy refuses the agent's model calls",
        group="limits",
        ge=1,
        le=65_536,
    )
    agent_timeout_s: float = option(600.0, "seconds the agent may run before it is stopped", group="limits", gt=0, le=86_400, allow_inf_nan=False)
    setup_timeout_s: float = option(300.0, "seconds each setup command may run", group="limits", gt=0, le=86_400, allow_inf_nan=False)
    verify_timeout_s: float = option(300.0, "seconds each verify command may run", group="limits", gt=0, le=86_400, allow_inf_nan=False)
    max_tokens_cap: int | None = option(None, "caps max_tokens of every model call; none: the harness's own", group="limits", ge=1, le=1_000_000)
    max_weight_lag: int | None = option(
        None,
        "weight versions a model call may lag the policy's at the rollout's end (as a trainer "
        "announces them: PUT /policy/weights) before its branch is marked stale; none: never",
        group="capture",
        ge=0,
        le=1_000_000,
    )
    # core/capture/continuity.py: the earlier prompt's ids + the sampled ids + the new messages'
    # ids, so a chat template that re-renders earlier turns never splits a thread.
    continuity: Literal["tokens", "messages"] = option(
        "tokens",
        "tokens: a model call that continues an earlier one is sent to the engine as that call's prompt and sampled "
        "token ids + the new messages' ids (where the endpoint offers vLLM's render and generate routes: --enable-scale-out; "
        "elsewhere messages); messages: every call's messages are rendered again by the chat template",
        group="capture",
    )
    top_logprobs: int = option(0, "alternatives recorded per sampled token, besides its own logprob", group="capture", ge=0, le=20)
    # Set on every policy call by the proxy: a trainer's logprobs match the sampler's only at the
    # temperature it trains with.
    temperature: float | None = option(
        None,
        "sampling temperature forced on every policy call, whatever the harness asks (train at the same one); none: the harness's own",
        group="capture",
        ge=0,
        le=10,
        allow_inf_nan=False,
    )
    # vLLM's processed logprobs are taken after nucleus truncation and penalties: a harness that asks
    # for them (Gemini CLI sends top_p 0.95) records logprobs a plain log_softmax(logits / T) misses.
    plain_sampling: bool = option(
        False,
        "drop what the harness asks that reshapes the distribution tokens are drawn from "
        "beyond temperature (top_p, presence and frequency penalties), so the recorded logprobs "
        "are log_softmax(logits / T), what a trainer computes",
        group="capture",
    )
    # A small model (a test's, a curriculum's first steps) seldom writes a tool call by itself; vLLM's
    # structured outputs make it. The answer's logprobs are then those of the constrained sampler.
    structured_regex: str | None = option(
        None,
        "a regular expression the policy's answers must match (vLLM's structured outputs), e.g. a tool call in the model's format; none: free answers",
        group="capture",
        min_length=1,
        max_length=8192,
    )
    structured_calls: int | None = option(
        None, "how many of the first policy calls `structured_regex` constrains; none: every one", group="capture", ge=0, le=100_000
    )
    # Their logprobs are the grammar-masked sampler's: a trainer that wants only the model's own samples leaves them out.
    mask_constrained: bool = option(
        False, "loss_mask 0 on the turns `structured_regex` constrained (their tokens stay in the rows, as context); off: trained as sampled", group="capture"
    )
    reward_mode: Literal["correctness", "tool_efficiency"] = option(
        "correctness", "correctness: the verify reward; tool_efficiency: correctness * (1 + 0.1 * 15 / (15 + tool calls))", group="reward"
    )
    task_family: str | None = option(
        None,
        "a task family (e.g. svg_icon) that prepares what the agent gets from the instruction and grades the submission instead of the verify commands",
        group="reward",
        min_length=1,
        max_length=64,
    )
    family_options: dict[str, Any] = option({}, "the task family's own options (svg_icon: reference_png, source_prompt, rubric, renderer)", group="reward")
    # Where the machine has them, cgroups and a size-limited filesystem; the result's sandbox_notes
    # say which applied and which were hit. A server caps each with HARNESS_ENV_MAX_<NAME>.
    memory_limit_mb: int = option(4096, "memory of all the rollout's processes together, MiB", group="sandbox", ge=64, le=1_048_576)
    pids_limit: int = option(1024, "processes and threads of the rollout at once", group="sandbox", ge=16, le=1_000_000)
    disk_limit_mb: int = option(4096, "size of the rollout's directory and /tmp, MiB", group="sandbox", ge=16, le=1_048_576)
    cpu_limit: float | None = option(None, "CPU cores the rollout may use; none: no cap", group="sandbox", gt=0, le=1024, allow_inf_nan=False)
    # proxy_only: bubblewrap's network namespace, the capture proxy's socket its only way out
    # (setup commands keep the host network).
    network: Literal["proxy_only", "open"] = option(
        "proxy_only", "what agent and verify commands reach: proxy_only (the capture proxy) or open (the host's network)", group="sandbox"
    )

    @field_validator("harness_config", "family_options")
    @classmethod
    def _config_bounded(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        return bounded_mapping(cfg, "harness_config / family_options")

    @field_validator("structured_regex")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is not None:
            check_text(v, "structured_regex")
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"structured_regex is not a regular expression: {e}") from None
        return v

    @field_validator("agent_timeout_s", "setup_timeout_s", "verify_timeout_s")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("timeouts must be finite numbers of seconds")
        return v

    @model_validator(mode="before")
    @classmethod
    def _upgraded(cls, data: Any) -> Any:
        return upgrade_request(data)

    @field_validator("harness_options")
    @classmethod
    def _harness_options(cls, value: Any, info: ValidationInfo) -> Any:
        harness = info.data.get("harness")
        if value is None or harness is None:  # no options, or a bad harness name (reported there)
            return value
        model = harness_options_model(harness)
        if model is False:  # validated where the registry is (the server): here only bounded
            if not isinstance(value, (dict, BaseModel)):
                raise ValueError("harness_options must be an object")
            return value if isinstance(value, BaseModel) else bounded_mapping(value, "harness_options")
        if model is None:
            raise ValueError(f"harness {harness!r} has no options of its own; leave harness_options out")
        if isinstance(value, model):
            return value
        return model.model_validate(value.model_dump() if isinstance(value, BaseModel) else value)

    @property
    def agent_calls_model(self) -> bool:
        """Whether the agent these options choose calls the policy (see HarnessOptions.calls_model)."""
        return _option_says(self.harness, self.harness_options, "calls_model", True)


def _option_says(harness: Any, raw: Any, prop: str, default: bool) -> bool:
    """What raw harness options say of `prop` (names_task, calls_model), read by the harness's model."""
    if raw is None or not isinstance(harness, str):
        return default
    if isinstance(raw, HarnessOptions):
        return getattr(raw, prop)
    model = harness_options_model(harness)
    if not model:
        return default
    try:
        return getattr(model.model_validate(raw), prop)
    except ValueError:  # ValidationError: reported with the field
        return default


def upgrade_request(data: Any) -> Any:
    """A request as sent (a dict), each harness's earlier forms upgraded by that harness
    (HarnessOptions.upgrade_request); as given where no harness registry is loaded (a client:
    the server upgrades it)."""
    if not isinstance(data, dict) or _harness_registry is None:
        return data
    for cls in _harness_registry.values():
        model = getattr(cls, "options_model", None)
        if model is not None:
            data = model.upgrade_request(data)
    return data


def _raw_harness_options(data: dict[str, Any]) -> Any:
    return data.get(HARNESS_OPTIONS)


def calls_model(data: dict[str, Any]) -> bool:
    """Whether a request's (raw) harness and options call the policy at all."""
    return _option_says(data.get("harness", DEFAULT_HARNESS), _raw_harness_options(data), "calls_model", True)


class RolloutRequest(RolloutOptions):
    """A fully resolved rollout: the task, the endpoint, the options."""

    task: Task
    endpoint: Endpoint
    disable_thinking: bool = option(False, "ask the endpoint not to think (chat_template_kwargs)", group="capture")

    @model_validator(mode="before")
    @classmethod
    def _named_task_stand_in(cls, data: Any) -> Any:
        # A task the harness options name brings its own instruction: the Task may be left out.
        data = upgrade_request(data)  # before RolloutOptions' own upgrade: the options say whether a task is named
        if isinstance(data, dict) and "task" not in data:
            if _option_says(data.get("harness", DEFAULT_HARNESS), _raw_harness_options(data), "names_task", False):
                data = {**data, "task": Task(instruction=NAMED_TASK_INSTRUCTION)}
        # An agent that calls no model (Harbor's oracle) needs no endpoint: one that cannot be reached stands in.
        if isinstance(data, dict) and data.get("endpoint") is None and not calls_model(data):
            data = {**data, "endpoint": NO_MODEL_ENDPOINT}
        return data


class RolloutArgs(RolloutOptions):
    """The flat arguments of the `run_rollout` tool (MCP, HTTP, client), as OpenEnv's pi_env takes
    them, plus harness, files and max_turns. The server resolves them into a RolloutRequest:
    `endpoint` names a catalog entry (vllm, openai, hf_router) whose values come from the server's
    environment; explicit base_url / api_key / model win."""

    instruction: str = option("", "what the agent must do", group="task", max_length=MAX_INSTRUCTION_CHARS)
    endpoint: str = option("", "a catalog shorthand (vllm, openai, hf_router) whose values the server holds", group="endpoint", max_length=64)
    base_url: str = option("", "an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 (wins over endpoint's)", group="endpoint", max_length=2048)
    api_key: SecretStr = option(SecretStr(""), "the endpoint's key; it never leaves the server process", group="endpoint")
    model: str = option("", "the model to call (wins over endpoint's)", group="endpoint", max_length=512)
    wire_api: WireApi = option("chat", WIRE_API_DESCRIPTION, group="capture")  # Endpoint.wire_api; beside mode on the web form
    setup: list[str] | None = option(None, "shell commands run in the workspace before the agent starts", group="task")
    verify: list[str] | None = option(None, "shell commands run after the agent; the reward is what they score", group="task")
    files: dict[str, str] | None = option(None, "files written into the workspace first: relative path -> content", group="task")
    task_id: str = option("", "your name for the task, echoed in the result", group="task", max_length=256)
    image: str = option("", IMAGE_DESCRIPTION, group="task", max_length=MAX_IMAGE_CHARS)  # Task.image; "": none
    disable_thinking: bool | None = option(None, "ask the endpoint not to think; none: the endpoint kind's default", group="capture")

    @field_validator("base_url")
    @classmethod
    def _parsable_url(cls, url: str) -> str:
        # Only parsable here; the scheme and host are checked once the endpoint is resolved.
        return check_http_url(url) if url else url

    @model_validator(mode="after")
    def _instruction_given(self) -> RolloutArgs:
        if self.instruction:
            return self
        opts = self.harness_options
        if isinstance(opts, HarnessOptions) and opts.names_task or opts is not None and not isinstance(opts, HarnessOptions):
            return self  # the options name a task, or they are checked on the server
        model = type(opts) if isinstance(opts, HarnessOptions) else harness_options_model(self.harness)
        hint = model.names_task_hint if model else ""
        raise ValueError("instruction is required" + (f" (it may be left out only when {hint})" if hint else ""))
