"""The `run_rollout` tool's arguments as sent, and its answers, sized for whoever called it.

Arguments: the rollout's own (RolloutArgs) and `detail`, the tool's own argument, declared here
once. The tool's input schema and description are derived from those fields and each harness's own
options model (run_rollout_schema, run_rollout_description), never restated.

Answers: an agent calling the tool gets the rollout's summary (models_summary: at most 16 KB)
unless it asks for `detail="full"`. Either way the data comes once: an MCP answer carries it as
structured content, with a few lines for a person as its text content (as the MCP spec intends),
never the JSON a second time; OpenEnv's plain JSON-RPC face carries it once, in `data`, where
OpenEnv's MCPToolClient reads it.
"""

from __future__ import annotations

import inspect
import json
import types
from typing import Annotated, Any, Union, get_args, get_origin

from mcp.server.fastmcp.exceptions import ToolError
from mcp.server.fastmcp.utilities.func_metadata import ArgModelBase
from mcp.types import CallToolResult, TextContent
from pydantic import ConfigDict, RootModel, ValidationError

from harness_env.core.errors import describe_validation_error
from harness_env.models import (
    HARNESS_OPTIONS,
    LEGACY_OPTION_KEYS,
    MAX_SUMMARY_BYTES,
    Detail,
    RolloutArgs,
    RolloutOptions,
    RolloutResult,
    RolloutSummary,
    harness_options_models,
    option,
    summarize,
)


# -- arguments -----------------------------------------------------------------------------------
class RunRolloutArgs(RolloutArgs):
    """run_rollout's arguments: the rollout's own, and how much of its result the answer carries
    (not a rollout option: the CLI, HTTP and the web form give the whole result)."""

    detail: Detail = option("summary", f"summary: the rollout in at most {MAX_SUMMARY_BYTES // 1024} KB (reward, error, "
                            "reward notes, phases, the agent's final text, counts, files changed: names and sizes); full: the "
                            "whole result (captured turns with token ids and logprobs, file contents, logs)", group="answer")


def _holds_json(annotation: Any) -> bool:
    kinds = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    return any(k in (list, dict, Any) or get_origin(k) in (list, dict, Annotated) for k in kinds)


# Arguments that hold a list or an object: some clients send those as JSON text.
_JSON_ARGS = frozenset({*LEGACY_OPTION_KEYS, *(n for n, f in RolloutArgs.model_fields.items() if _holds_json(f.annotation))})


def rollout_args(arguments: dict[str, Any]) -> RunRolloutArgs:
    """run_rollout's arguments as sent, checked by RunRolloutArgs: those given as null are left to
    their defaults, a list or object sent as JSON text is read."""
    args = {}
    for name, value in arguments.items():
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


class ArgumentsAsSent(ArgModelBase):  # run_rollout's arguments as sent: RunRolloutArgs checks them, not the SDK
    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)

    def model_dump_one_level(self) -> dict[str, Any]:
        return {"arguments": dict(self.__pydantic_extra__ or {})}


RUN_ROLLOUT_SUMMARY = (
    "Run one rollout of a coding-agent harness on a task; returns its summary (reward, error, reward notes, phases, the "
    f"agent's final text, counts of model calls, tokens and tool calls, files changed; at most {MAX_SUMMARY_BYTES // 1024} KB), "
    "or with detail='full' the whole RolloutResult (captured turns with token ids and logprobs, file contents, logs). "
    "A failed rollout is a result with `error`. Each argument's meaning and default are in the input schema; endpoint "
    "(a catalog shorthand) or base_url + model name the policy."
)


def run_rollout_description() -> str:
    """What the tool does, the task family option, and each harness's own options (its options
    model's docstring)."""
    fields = RolloutOptions.model_fields
    parts = [RUN_ROLLOUT_SUMMARY, f"task_family: {fields['task_family'].description}; family_options: {fields['family_options'].description}."]
    for name, model in harness_options_models().items():
        key = HARNESS_OPTIONS + (f" (or {name})" if name in LEGACY_OPTION_KEYS else "")
        parts.append(f"harness={name!r} takes its own options in {key}: {' '.join(inspect.cleandoc(model.__doc__ or '').split())}")
    return " ".join(parts)


def run_rollout_schema() -> dict[str, Any]:
    """RunRolloutArgs' fields (description, default, bounds), harness_options being one of the
    harnesses' own options models (also under their former keys)."""
    schema = RunRolloutArgs.model_json_schema()
    defs, props, refs = schema.setdefault("$defs", {}), schema["properties"], []
    for name, model in harness_options_models().items():
        sub = model.model_json_schema()
        defs.update(sub.pop("$defs", {}))
        defs[model.__name__] = sub
        refs.append({"$ref": f"#/$defs/{model.__name__}"})
        if name in LEGACY_OPTION_KEYS:
            props[name] = {**refs[-1], "description": f"the former name of {HARNESS_OPTIONS}, for harness={name!r}"}
    props[HARNESS_OPTIONS] = {k: v for k, v in props[HARNESS_OPTIONS].items() if k != "anyOf"} | {"anyOf": [*refs, {"type": "null"}]}
    return schema


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
    return CallToolResult(content=[TextContent(type="text", text=text)], structuredContent=data, isError=False)


def rpc_result(data: Any, text: str) -> dict[str, Any]:
    """A tools/call result for OpenEnv's plain JSON-RPC: the data once, in `data`."""
    return {"content": [{"type": "text", "text": text}], "isError": False, "data": data}


def listing_text(name: str, data: Any) -> str:
    """The text of a listing tool's plain JSON-RPC answer (its data is in `data`)."""
    return f"{name}: {len(data)} entries" if isinstance(data, list) else name
