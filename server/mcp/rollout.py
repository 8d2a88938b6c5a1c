"""The `run_rollout` tool's arguments as sent, and its answers, sized for whoever called it.

Arguments: the rollout's own (RolloutArgs) and `detail`, the tool's own argument, declared here
once. The tool's input schema and description are derived from those fields and each harness's own
options model (run_rollout_schema, run_rollout_description), never restated; the schema is listed
compactly (run_rollout_tool_schema: the advanced options in one nested `options` object).

Answers: an agent calling the tool gets the rollout's summary (models_summary: at most 16 KB)
unless it asks for `detail="full"`. Either way the data comes once: an MCP answer carries it as
structured content, with a few lines for a person as its text content (as the MCP spec intends),
never the JSON a second time; OpenEnv's plain JSON-RPC face carries it once, in `data`, where
OpenEnv's MCPToolClient reads it.
"""

from __future__ import annotations

import json
import types
from typing import Annotated, Any, Union, get_args, get_origin

from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase
from mcp.types import CallToolResult, TextContent
from pydantic import ConfigDict, RootModel, ValidationError

from harness_env.core.errors import describe_validation_error
from harness_env.envs import harness_options_models
from harness_env.models import HARNESS_OPTIONS, MAX_SUMMARY_BYTES, Detail, RolloutArgs, RolloutResult, RolloutSummary, option, summarize, upgrade_request


# -- arguments -----------------------------------------------------------------------------------
class RunRolloutArgs(RolloutArgs):
    """run_rollout's arguments: the rollout's own, and how much of its result the answer carries
    (not a rollout option: the CLI, HTTP and the web form give the whole result)."""

    detail: Detail = option(
        "summary",
        f"summary: the rollout in at most {MAX_SUMMARY_BYTES // 1024} KB (reward, error, "
        "reward notes, phases, the agent's final text, counts, files changed: names and sizes); full: the "
        "whole result (captured turns with token ids and logprobs, file contents, logs)",
        group="answer",
    )


def _holds_json(annotation: Any) -> bool:
    kinds = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    return any(k in (list, dict, Any) or get_origin(k) in (list, dict, Annotated) for k in kinds)


# Arguments that hold a list or an object: some clients send those as JSON text.
_JSON_ARGS = frozenset(n for n, f in RolloutArgs.model_fields.items() if _holds_json(f.annotation))


def rollout_args(arguments: dict[str, Any]) -> RunRolloutArgs:
    """run_rollout's arguments as sent, checked by RunRolloutArgs: those given as null are left to
    their defaults, a list or object sent as JSON text is read."""
    args = {}
    try:  # a harness's earlier form of its options (under a key of their own) first
        given = upgrade_request(_with_options_unnested(arguments))
    except ValueError as e:
        raise ToolError(f"invalid request: {e}") from None
    for name, value in given.items():
        if name in _JSON_ARGS and isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
            try:
                value = json.loads(value)
            except (json.JSONDecodeError, RecursionError):
                pass  # as sent: RolloutArgs says what is wrong with it
        if value is not None:
            args[name] = value
    try:
        return RunRolloutArgs.model_validate(args)
    except ValidationError as e:
        raise ToolError(describe_validation_error(e)) from None


def _with_options_unnested(arguments: dict[str, Any]) -> dict[str, Any]:
    """The advanced options sent under `options` (the tool schema's group) beside the others: every
    option may also be sent at the top, as before; one given both ways is refused."""
    if "options" not in arguments:
        return arguments
    arguments = dict(arguments)
    nested = arguments.pop("options")
    if isinstance(nested, str) and nested.lstrip()[:1] == "{":
        try:
            nested = json.loads(nested)
        except (json.JSONDecodeError, RecursionError):
            pass
    if nested is None:
        return arguments
    if not isinstance(nested, dict):
        raise ToolError("invalid request: options must be an object of advanced options (their names as in the schema)")
    twice = sorted(set(nested) & set(arguments))
    if twice:
        raise ToolError(f"invalid request: {', '.join(twice)} given both in options and at the top: give it once")
    return {**arguments, **nested}


class ArgumentsAsSent(ArgModelBase):  # run_rollout's arguments as sent: RunRolloutArgs checks them, not the SDK
    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)

    def model_dump_one_level(self) -> dict[str, Any]:
        return {"arguments": dict(self.__pydantic_extra__ or {})}


RUN_ROLLOUT_SUMMARY = (
    "Run one rollout of a coding-agent harness on a task; returns its summary (reward, error, phases, the agent's final "
    f"text, counts, files changed; at most {MAX_SUMMARY_BYTES // 1024} KB), or with detail='full' the whole result (turns "
    "with token ids and logprobs). A failed rollout is a result with `error`. endpoint (a catalog shorthand) or base_url + "
    "model name the policy. Advanced options go in `options`; each is described in the server's GET /schema (`action`)."
)


def run_rollout_description() -> str:
    """What the tool does, and which harnesses take options of their own (harness_options)."""
    own = ", ".join(f"{name} ({', '.join(model.model_fields)})" for name, model in harness_options_models().items())
    return f"{RUN_ROLLOUT_SUMMARY} options.{HARNESS_OPTIONS}: a harness's own options: {own}."


def run_rollout_schema() -> dict[str, Any]:
    """RunRolloutArgs' fields (description, default, bounds), harness_options being one of the
    harnesses' own options models."""
    schema = RunRolloutArgs.model_json_schema()
    defs, props, refs = schema.setdefault("$defs", {}), schema["properties"], []
    for model in harness_options_models().values():
        sub = model.model_json_schema()
        defs.update(sub.pop("$defs", {}))
        defs[model.__name__] = sub
        refs.append({"$ref": f"#/$defs/{model.__name__}"})
    props[HARNESS_OPTIONS] = {k: v for k, v in props[HARNESS_OPTIONS].items() if k != "anyOf"} | {"anyOf": [*refs, {"type": "null"}]}
    return schema


# The arguments an agent sees first (the task, the policy, the limits it most often sets): every other option
# is listed under `options` with its type and default only, so the tool costs an agent's context
# a few KB; run_rollout_schema (every description) stays the reference, and GET /schema serves it.
TOOL_TOP = (
    "instruction",
    "endpoint",
    "base_url",
    "api_key",
    "model",
    "harness",
    "mode",
    "setup",
    "verify",
    "files",
    "task_id",
    "agent_timeout_s",
    "max_tokens_cap",
    "detail",
)
SHORT_CHARS = 60
OPTIONS_DESCRIPTION = "advanced options (limits, sampling and capture, reward, sandbox, the harness's own)"


def short(description: str) -> str:
    """A description's first clause, cut to SHORT_CHARS at a word (before a parenthesis it would
    leave open)."""
    text = description.split("; ")[0]
    if len(text) <= SHORT_CHARS:
        return text
    cut = text[: SHORT_CHARS + 1].rsplit(" ", 1)[0]
    if cut.count("(") > cut.count(")"):
        cut = cut[: cut.rindex("(")]
    return cut.rstrip(" ,:") + " ..."


def _brief(prop: dict[str, Any], described: bool) -> dict[str, Any]:
    """A property of run_rollout_schema as the tool lists it: its type (null allowed when it was),
    enum, items, its default when it has one, and if `described` its bounds and a short
    description (an advanced option's bounds are checked all the same, and said when broken)."""
    kinds = prop.get("anyOf", [prop])
    shape = next((k for k in kinds if k.get("type") != "null"), prop)
    nullable = any(k.get("type") == "null" for k in kinds)
    out: dict[str, Any] = {}
    kind = shape.get("type", "object" if "$ref" in shape else None)  # a harness's options model
    if kind is not None:
        out["type"] = [kind, "null"] if nullable else kind
    out.update({k: shape[k] for k in ("enum", "items", *(("minimum", "maximum", "exclusiveMinimum") if described else ())) if k in shape})
    if prop.get("default") not in (None, "", {}, []):
        out["default"] = prop["default"]
    if described and prop.get("description"):
        out["description"] = short(prop["description"])
    return out


def run_rollout_tool_schema() -> dict[str, Any]:
    """run_rollout's input schema as listed: TOOL_TOP described briefly, the rest in `options`."""
    props = run_rollout_schema()["properties"]
    listed = {name: _brief(props[name], True) for name in TOOL_TOP}
    nested = {name: _brief(p, False) for name, p in props.items() if name not in TOOL_TOP}
    listed["options"] = {"type": "object", "description": OPTIONS_DESCRIPTION, "properties": nested, "additionalProperties": False}
    return {"type": "object", "properties": listed, "additionalProperties": False}


# -- answers -------------------------------------------------------------------------------------
class RunRolloutAnswer(RootModel[RolloutSummary | RolloutResult]):
    """run_rollout's structured content: the rollout's summary (`detail: "summary"`) or, asked for
    with detail="full", the whole RolloutResult."""


def run_rollout_output_schema() -> dict[str, Any]:
    """Either answer's JSON schema, as the data is serialized: an object at the top, as MCP wants
    of an output schema; a summary is told from a whole result by its `detail` field."""
    defs: dict[str, Any] = {}
    refs = []
    for model in (RolloutSummary, RolloutResult):
        schema = model.model_json_schema(mode="serialization")
        defs.update(schema.pop("$defs", {}))
        defs[model.__name__] = schema
        refs.append({"$ref": f"#/$defs/{model.__name__}"})
    description = " ".join((RunRolloutAnswer.__doc__ or "").split())
    return {"type": "object", "title": "RunRolloutAnswer", "description": description, "anyOf": refs, "$defs": defs}


def answer_data(result: RolloutResult, detail: Detail) -> tuple[dict[str, Any], str]:
    """The data asked for (JSON-ready) and the few lines of text that go with it."""
    summary = summarize(result)
    data = summary if detail == "summary" else result
    return data.model_dump(mode="json"), summary.text()


def tool_result(result: RolloutResult, detail: Detail) -> CallToolResult:
    """The MCP answer. Returned as a CallToolResult, the SDK neither puts the data into the text a
    second time nor re-checks it against the output schema with jsonschema (seconds of the event
    loop for a 40-turn result)."""
    data, text = answer_data(result, detail)
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data, is_error=False)


def rpc_result(data: Any, text: str) -> dict[str, Any]:
    """A tools/call result for OpenEnv's plain JSON-RPC: the data once, in `data`."""
    return {"content": [{"type": "text", "text": text}], "isError": False, "data": data}


def listing_text(name: str, data: Any) -> str:
    """The text of a listing tool's plain JSON-RPC answer (its data is in `data`)."""
    return f"{name}: {len(data)} entries" if isinstance(data, list) else name
