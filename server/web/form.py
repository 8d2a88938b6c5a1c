"""The web form's values -> the `run_rollout` tool's arguments (the same RolloutArgs every other
surface sends), plus the choices the form offers. Pure functions: no Gradio, no I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pydantic import SecretStr, ValidationError

from harness_env.core.errors import InvalidRequestError, describe_validation_error
from harness_env.envs.harbor.config import LOCAL_AGENTS, LOCAL_SANDBOX, MODEL_FREE_AGENTS
from harness_env.envs.harbor.resolve import REMOTE_AGENT_KWARGS
from harness_env.families.svg_icon.judge import DEFAULT_RUBRIC, Rubric
from harness_env.models import HarnessInfo, RolloutArgs

EXPLICIT = "explicit base URL"
SHELL_TASK = "shell task (verify commands)"
SVG_ICON = "svg_icon"
TASK_FAMILIES = [SHELL_TASK, SVG_ICON]
RENDERERS = ["chromium", "resvg"]
HARBOR = "harbor"
HARBOR_DEFAULT_AGENT = "pi"


@dataclass
class WebForm:
    endpoint: str = EXPLICIT  # a configured catalog shorthand, or EXPLICIT
    base_url: str = ""
    model: str = ""
    api_key: str = ""
    harness: str = "pi"
    mode: str = "transparent_proxy"
    max_turns: float | None = None  # 0 or empty: no limit
    agent_timeout_s: float | None = 600
    max_tokens_cap: float | None = None  # 0 or empty: no cap
    disable_thinking: bool = False
    top_logprobs: float | None = 0
    instruction: str = ""
    setup: str = ""  # one command per line
    verify: str = ""
    files: list[tuple[str, str]] = field(default_factory=list)  # (path, content); empty paths ignored
    task_family: str = SHELL_TASK  # SHELL_TASK or SVG_ICON; the svg fields below count only for SVG_ICON
    reference_png: str = ""  # a path under the server's $HARNESS_ENV_REFERENCE_DIR (or relative to it)
    source_prompt: str = ""
    renderer: str = "chromium"
    rubric: str = ""  # JSON {"dimensions": [{name, description, weight}]}; blank: the judge's default rubric
    # harness="harbor" only (ignored for every other harness): Harbor's agent and environment, and
    # optionally a Harbor task (paths under the server's HARNESS_ENV_HARBOR_TASKS_DIR). With neither
    # task dir nor dataset, the task above is converted into a Harbor task.
    harbor_agent: str = HARBOR_DEFAULT_AGENT
    harbor_sandbox: str = LOCAL_SANDBOX
    harbor_task_dir: str = ""
    harbor_dataset: str = ""
    harbor_task_index: float | None = 0
    harbor_split: str = ""  # a subdirectory of the dataset (Harbor has no splits of its own)
    harbor_reward_key: str = ""
    harbor_agent_kwargs: str = ""  # JSON object: Harbor's options for the agent (those open to remote callers)


def default_rubric_json() -> str:
    """The judge's default rubric as the form's editable JSON text: one dimension per line."""
    dims = [json.dumps(d.model_dump(mode="json")) for d in DEFAULT_RUBRIC.dimensions]
    return '{"dimensions": [\n  ' + ",\n  ".join(dims) + "\n]}"


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
        raise InvalidRequestError(f"{what} must be a JSON object, e.g. {{\"key\": value}}")
    return data


def parse_rubric(text: str) -> dict | None:
    """The rubric textbox -> the rubric family option (None when blank). One-line errors."""
    data = parse_json_object(text, "rubric")
    if data is None:
        return None
    try:
        return Rubric.model_validate(data).model_dump(mode="json")
    except ValidationError as e:
        raise InvalidRequestError("rubric: " + describe_validation_error(e).replace("invalid request: ", "")) from None


def family_fields(form: WebForm) -> dict:
    """task_family and family_options for RolloutArgs: nothing for a shell task."""
    if form.task_family in (SHELL_TASK, "", None):
        return {}
    if form.task_family != SVG_ICON:
        raise InvalidRequestError(f"unknown task family {form.task_family!r}; choose one of: {', '.join(TASK_FAMILIES)}")
    if form.renderer not in RENDERERS:
        raise InvalidRequestError(f"renderer must be one of {', '.join(RENDERERS)}, got {form.renderer!r}")
    options: dict = {"renderer": form.renderer}
    if (form.reference_png or "").strip():
        options["reference_png"] = form.reference_png.strip()
    if (form.source_prompt or "").strip():
        options["source_prompt"] = form.source_prompt.strip()
    if (rubric := parse_rubric(form.rubric)) is not None:
        options["rubric"] = rubric
    return {"task_family": SVG_ICON, "family_options": options}


def harbor_fields(form: WebForm) -> dict:
    """`harbor` for RolloutArgs when the harness is Harbor (only the fields that were filled in);
    nothing for any other harness, whatever the hidden Harbor inputs hold."""
    if form.harness != HARBOR:
        return {}
    opts: dict = {"agent": (form.harbor_agent or "").strip() or HARBOR_DEFAULT_AGENT,
                  "sandbox": (form.harbor_sandbox or "").strip() or LOCAL_SANDBOX}
    for key, value in (("task_dir", form.harbor_task_dir), ("dataset", form.harbor_dataset), ("split", form.harbor_split),
                       ("reward_key", form.harbor_reward_key)):
        if (value or "").strip():
            opts[key] = value.strip()
    if form.harbor_task_index:  # 0 or empty: the first task (the default)
        opts["task_index"] = int(form.harbor_task_index)
    if kwargs := parse_json_object(form.harbor_agent_kwargs, "agent options"):
        opts["agent_kwargs"] = kwargs
    return {"harbor": opts}


AGENT_KWARGS_HINT = f"agent options (JSON; {', '.join(sorted(REMOTE_AGENT_KWARGS))})"


def harbor_agent_choices(names: list[str]) -> list[tuple[str, str]]:
    """(label, value) pairs: the agents the local sandbox runs first (the default one at the top),
    then Harbor's others, labelled as needing a provider sandbox (they install themselves)."""
    local = sorted((n for n in names if n in LOCAL_AGENTS), key=lambda n: (n != HARBOR_DEFAULT_AGENT, n in MODEL_FREE_AGENTS, n))
    others = sorted(n for n in names if n not in LOCAL_AGENTS)
    return [(n, n) for n in local] + [(f"{n} (provider sandbox)", n) for n in others]


def harbor_sandbox_choices(names: list[str]) -> list[str]:
    """The local sandbox first, then Harbor's providers in the order given."""
    return [LOCAL_SANDBOX] + [n for n in names if n != LOCAL_SANDBOX]


def lines(text: str) -> list[str]:
    """One command per line; blank lines are skipped."""
    return [ln for ln in (text or "").splitlines() if ln.strip()]


def _positive_int(value: float | None) -> int | None:
    return int(value) if value else None


def to_args(form: WebForm) -> RolloutArgs:
    """Raises InvalidRequestError with a one-line message for bad input."""
    files: dict[str, str] = {}
    for path, content in form.files:
        path = (path or "").strip()
        if not path:
            continue
        if path in files:
            raise InvalidRequestError(f"file {path!r} is listed twice")
        files[path] = content or ""
    endpoint = {"endpoint": form.endpoint} if form.endpoint != EXPLICIT else {
        "base_url": form.base_url.strip(), "model": form.model.strip(), "api_key": SecretStr(form.api_key or "")}
    family = family_fields(form)
    harbor = harbor_fields(form)
    try:
        return RolloutArgs(
            instruction=form.instruction,
            setup=lines(form.setup),
            verify=[] if family else lines(form.verify),  # svg_icon grades the icon, not commands
            files=files,
            harness=form.harness,
            mode=form.mode,  # type: ignore[arg-type]
            max_turns=_positive_int(form.max_turns),
            agent_timeout_s=form.agent_timeout_s or 600,
            max_tokens_cap=_positive_int(form.max_tokens_cap),
            disable_thinking=bool(form.disable_thinking),
            top_logprobs=int(form.top_logprobs or 0),
            **family,
            **harbor,
            **endpoint,
        )
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
