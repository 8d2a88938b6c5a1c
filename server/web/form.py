"""The web form: its option controls, derived from the option fields (RolloutArgs, each
harness's own options model and each task family's, from the registries), and its values -> the `run_rollout` tool's
arguments (the same RolloutArgs every other surface sends). Pure functions: no Gradio, no I/O.

A control is read off its field: a bool is a checkbox, a Literal a radio, a number a number box
(bounds from the field), an object a JSON text box, a string a text box; its label is the field's
title (or name), its info the field's description, its value the field's default. WIDGET_HINTS
holds the few that need more. The form's values are a dict keyed by field name; a harness's own
options under the harness's name, a task family's under the family's.
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, SecretStr, ValidationError

from harness_env.core.capture.dialects import native_wire_apis
from harness_env.core.errors import InvalidRequestError, describe_validation_error
from harness_env.envs import harness_options_models
from harness_env.families import family_names, get_family
from harness_env.models import DEFAULT_HARNESS, HARNESS_OPTIONS, OPTION_GROUPS, HarnessInfo, RolloutArgs, option_group

EXPLICIT = "explicit base URL"
SHELL_TASK = "shell task (verify commands)"
# What a field's type does not say: the harness list comes from the server at load; the task
# family and its options are the task column's; a harness's own options are its group's.
WIDGET_HINTS = {"harness": "dropdown", "task_family": "family", "family_options": "family", HARNESS_OPTIONS: "harness group"}
UNITS = {"s": "s", "mb": "MiB"}


@dataclass(frozen=True)
class Control:
    """One control of the form, read off a field."""

    name: str  # the field's name: its key in the form's values
    kind: str  # checkbox, radio, dropdown, number, json, text; or a WIDGET_HINTS kind
    label: str
    info: str  # the field's description
    default: Any  # the field's default: what the control starts with
    group: str
    choices: tuple = ()
    minimum: float | None = None
    maximum: float | None = None
    integer: bool = False
    zero_is_none: bool = False  # an optional number that cannot be 0: 0 (or empty) means none
    placeholder: str = ""  # an empty JSON box's: the field's example (what it means when left empty)

    def elem_id(self, prefix: str = "") -> str:
        return prefix + self.name.replace("_", "-")


def _label(name: str, info: Any) -> str:
    if info.title:
        return info.title
    *words, last = name.split("_")
    return " ".join(words) + f" ({UNITS[last]})" if last in UNITS and words else name.replace("_", " ")


def control(name: str, info: Any, choices: list | None = None) -> Control:
    """The control of field `name` (a pydantic FieldInfo)."""
    ann = info.annotation
    kinds = [a for a in get_args(ann) if a is not type(None)] if get_origin(ann) in (Union, types.UnionType) else [ann]
    kind_type = kinds[0] if len(kinds) == 1 else str
    bounds = {type(m): m for m in info.metadata}
    low = next((getattr(bounds[b], f) for b, f in ((Ge, "ge"), (Gt, "gt")) if b in bounds), None)
    high = next((getattr(bounds[b], f) for b, f in ((Le, "le"), (Lt, "lt")) if b in bounds), None)
    base = dict(name=name, label=_label(name, info), info=info.description or "", default=info.default, group=option_group(info))
    if name in WIDGET_HINTS:
        return Control(kind=WIDGET_HINTS[name], **base)
    if choices:
        return Control(kind="dropdown", choices=tuple(choices), **base)
    if kind_type is bool:
        return Control(kind="checkbox", **base)
    if get_origin(kind_type) is Literal:
        return Control(kind="radio", choices=get_args(kind_type), **base)
    if kind_type in (int, float):
        # An optional number: 0 stands for none where 0 is not a value it can take; where it is
        # (a temperature), a text box, empty for none (a number box cannot be empty).
        zero_is_none = info.default is None and low is not None and (low > 0 or Gt in bounds)
        if info.default is None and not zero_is_none:
            return Control(kind="text", **base)
        return Control(
            kind="number",
            minimum=0 if zero_is_none else low,
            maximum=high,
            integer=kind_type is int,
            zero_is_none=zero_is_none,
            **{**base, "label": base["label"] + (" (0: none)" if zero_is_none else "")},
        )
    if kind_type is dict or get_origin(kind_type) is dict or (isinstance(kind_type, type) and issubclass(kind_type, BaseModel)):
        example = (info.json_schema_extra or {}).get("example") if isinstance(info.json_schema_extra, dict) else None
        return Control(kind="json", placeholder=json.dumps(example, indent=1) if example is not None else "", **base)
    return Control(kind="text", **base)


def option_controls() -> list[Control]:
    """The rollout options' controls, in the fields' order (the page lays out the task's and the
    endpoint's fields itself)."""
    # wire_api is open (a plug-in's dialect brings its own): the dialect registry's names
    return [
        control(name, info, native_wire_apis() if name == "wire_api" else None)
        for name, info in RolloutArgs.model_fields.items()
        if option_group(info) in OPTION_GROUPS
    ]


def harness_controls(*, with_choices: bool = True) -> dict[str, tuple[type, list[Control]]]:
    """Per harness with options of its own: its options model and the controls of the fields a
    remote caller may set (a field marked remote=False is for trusted callers only); dropdowns
    offer the model's choices (`with_choices`: ask for them)."""
    out = {}
    for harness, model in harness_options_models().items():
        choices = model.choices() if with_choices else {}
        out[harness] = (
            model,
            [control(name, info, choices.get(name)) for name, info in model.model_fields.items() if (info.json_schema_extra or {}).get("remote", True)],
        )
    return out


def task_families() -> list[str]:
    """The form's task family choices: a shell task, then every registered family."""
    return [SHELL_TASK, *family_names()]


def family_controls() -> dict[str, tuple[type, list[Control]]]:
    """Per registered task family: its options model and the controls of its fields."""
    out = {}
    for name in family_names():
        model = get_family(name).options_model
        out[name] = (model, [control(field, info) for field, info in model.model_fields.items()])
    return out


def instruction_label(family: str | None) -> str:
    """What the form calls the instruction of a task of `family` (a shell task's: instruction)."""
    return get_family(family).instruction_label if family and family != SHELL_TASK else "instruction"


def parse_json_object(text: str, what: str) -> dict | None:
    """A JSON textbox -> its object (None when blank). One-line errors naming the box."""
    if not (text or "").strip():
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidRequestError(f"{what} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    except RecursionError:
        raise InvalidRequestError(f"{what} is nested too deeply") from None
    if not isinstance(data, dict):
        raise InvalidRequestError(f'{what} must be a JSON object, e.g. {{"key": value}}')
    return data


_UNSET = object()


def field_value(c: Control, raw: Any) -> Any:
    """What the form's value of control `c` sends: _UNSET when left empty (the field's default)."""
    if c.kind == "number":
        if raw is None or raw == "" or (c.zero_is_none and not raw):
            return None if c.zero_is_none else _UNSET
        return int(raw) if c.integer and float(raw).is_integer() else raw
    if c.kind == "json":
        data = parse_json_object(raw, c.label)
        return _UNSET if data is None else data
    if c.kind == "checkbox":
        return bool(raw)
    text = (raw or "").strip() if isinstance(raw, str) or raw is None else raw
    return text if text != "" else _UNSET


def family_fields(form: dict[str, Any]) -> dict:
    """task_family and family_options for RolloutArgs (only what was filled in, checked against
    the family's options model); nothing for a shell task."""
    family = form.get("task_family") or SHELL_TASK
    if family == SHELL_TASK:
        return {}
    if family not in family_names():
        raise InvalidRequestError(f"unknown task family {family!r}; choose one of: {', '.join(task_families())}")
    model, controls = family_controls()[family]
    options = options_fields(controls, form.get(family) or {})
    try:
        model.model_validate(options)
    except ValidationError as e:
        raise InvalidRequestError(f"{family} " + describe_validation_error(e).replace("invalid request: ", "")) from None
    return {"task_family": family, "family_options": options}


def options_fields(controls: list[Control], values: dict[str, Any]) -> dict[str, Any]:
    """The fields the form's values give (what was left empty keeps its default)."""
    out = {}
    for c in controls:
        if c.name in values and c.kind not in ("family", "harness group"):
            if (value := field_value(c, values[c.name])) is not _UNSET:
                out[c.name] = value
    return out


def harness_options_fields(form: dict[str, Any]) -> dict:
    """The chosen harness's own options (only what was filled in), when it has any; nothing for
    the others, whatever their hidden controls hold."""
    harness = form.get("harness")
    found = harness_controls(with_choices=False).get(harness) if harness else None
    if found is None:
        return {}
    return {HARNESS_OPTIONS: options_fields(found[1], form.get(harness) or {})}


def lines(text: str) -> list[str]:
    """One command per line; blank lines are skipped."""
    return [ln for ln in (text or "").splitlines() if ln.strip()]


def check_instruction(form: dict[str, Any]) -> None:
    """An empty instruction, in the words of the harness chosen: one whose options can name a task
    instead (Harbor's) is left to RolloutArgs, which says how."""
    if (form.get("instruction") or "").strip():
        return
    harness = form.get("harness") or DEFAULT_HARNESS
    found = harness_controls(with_choices=False).get(harness)
    if found is None or not found[0].names_task_hint:
        family = form.get("task_family") or SHELL_TASK
        what = "the task" if family == SHELL_TASK or family not in family_names() else instruction_label(family)
        raise InvalidRequestError(f"the instruction is empty: write {what} for the {harness} agent")


def to_args(form: dict[str, Any]) -> RolloutArgs:
    """The form's values (keyed by field name) -> RolloutArgs. Raises InvalidRequestError with a
    one-line message for bad input."""
    files: dict[str, str] = {}
    for path, content in form.get("files") or []:
        path = (path or "").strip()
        if not path:
            continue
        if path in files:
            raise InvalidRequestError(f"file {path!r} is listed twice")
        files[path] = content or ""
    endpoint = form.get("endpoint") or EXPLICIT
    endpoint_fields = (
        {"endpoint": endpoint}
        if endpoint != EXPLICIT
        else {"base_url": (form.get("base_url") or "").strip(), "model": (form.get("model") or "").strip(), "api_key": SecretStr(form.get("api_key") or "")}
    )
    family = family_fields(form)
    check_instruction(form)
    fields = {
        **options_fields(option_controls(), form),
        **family,
        **harness_options_fields(form),
        **endpoint_fields,
        "instruction": form.get("instruction") or "",
        "setup": lines(form.get("setup") or ""),
        "verify": [] if family else lines(form.get("verify") or ""),  # a family grades the submission itself, not commands
        "files": files,
        "task_id": (form.get("task_id") or "").strip(),
    }
    try:
        return RolloutArgs(**fields)
    except ValidationError as e:
        raise InvalidRequestError(describe_validation_error(e)) from None


def harness_choices(harnesses: list[HarnessInfo]) -> list[tuple[str, str]]:
    """(label, value) pairs: name and version, installed ones first, else in the registry's order."""
    ordered = sorted(harnesses, key=lambda h: not h.installed)
    return [(f"{h.name} {h.version}" if h.installed else f"{h.name} (not installed)", h.name) for h in ordered]


def endpoint_choices(catalog: list[dict]) -> list[str]:
    """Only the catalog shorthands the server has configured, then the explicit choice."""
    return [e["name"] for e in catalog if e.get("configured")] + [EXPLICIT]


def endpoint_note(catalog: list[dict], name: str) -> str:
    entry = next((e for e in catalog if e["name"] == name), None)
    if entry is None:
        return "Base URL, model and key of an OpenAI-compatible endpoint. The key stays on the server; it is never shown again."
    return f"`{name}`: {entry['base_url']} · model `{entry['model']}` · key {'set' if entry['api_key_set'] else 'not set'} (from the server's environment)"


def disable_thinking_default(catalog: list[dict], name: str) -> bool:
    entry = next((e for e in catalog if e["name"] == name), None)
    return bool(entry and entry.get("disable_thinking_default"))


def shown_value(c: Control, value: Any) -> Any:
    """A field's value as control `c` shows it (the inverse of field_value): an object as JSON
    text, none as empty (0 in a box where 0 means none)."""
    if c.kind == "json":
        return json.dumps(value, indent=1) if value else ""
    if c.kind == "number":
        return 0 if value is None and c.zero_is_none else value
    if c.kind == "text":
        return "" if value is None else str(value)
    return value


def request_form(request: dict[str, Any], catalog: list[dict]) -> dict[str, Any]:
    """A stored rollout's request (RolloutRequest's JSON; its key masked) -> the form's values, to
    run it again: the catalog endpoint it used when one has its base URL and model, else the
    explicit one (whose key is never kept: it is typed again)."""
    task, endpoint = request.get("task") or {}, request.get("endpoint") or {}
    form = {c.name: shown_value(c, request.get(c.name, c.default)) for c in option_controls() if c.kind not in ("family", "harness group")}
    harness, family = request.get("harness"), request.get("task_family")
    for name, (_, controls) in harness_controls(with_choices=False).items():  # every harness's controls: the others' defaults
        own = (request.get(HARNESS_OPTIONS) or {}) if name == harness else {}
        form[name] = {c.name: shown_value(c, own.get(c.name, c.default)) for c in controls}
    for name, (_, controls) in family_controls().items():
        own = (request.get("family_options") or {}) if name == family else {}
        form[name] = {c.name: shown_value(c, own.get(c.name, c.default)) for c in controls}
    named = next(
        (e["name"] for e in catalog if e.get("configured") and e.get("base_url") == endpoint.get("base_url") and e.get("model") == endpoint.get("model")), None
    )
    form.update(
        endpoint=named or EXPLICIT,
        base_url="" if named else endpoint.get("base_url", ""),
        model="" if named else endpoint.get("model", ""),
        task_family=family if family in family_names() else SHELL_TASK,
        instruction=task.get("instruction", ""),
        setup="\n".join(task.get("setup") or []),
        verify="\n".join(task.get("verify") or []),
        task_id=task.get("task_id") or "",
        files=list((task.get("files") or {}).items()),
        disable_thinking=bool(request.get("disable_thinking")),
    )
    return form
