"""The command line's parser and flags, derived from the option fields (pure builders: nothing here
reads a file or runs anything).

A rollout's flags (run's and eval's) are never restated: each field of models.RolloutOptions is
one kebab-case flag whose help is the field's description and default, grouped as the fields are,
and each harness's own options model (from the harness registry) adds a group of its own.

Bad input gives one line on stderr and exit code 2 (`CliParser`, `bad_input`), never usage text
or a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from typing import Any, Literal, NoReturn, Union, get_args, get_origin

EXIT_BAD_INPUT = 2
LOCAL_ISOLATION = {"auto": None, "bwrap": True, "plain": False}  # --sandbox for harnesses run in our sandbox: use_bwrap
# A harness option may share one of the command's own flags (Harbor's sandbox: --sandbox); these
# values of it stay the command's.
SHARED_FLAGS = {"sandbox": tuple(LOCAL_ISOLATION)}
GROUP_TITLES = {"harness": "harness", "limits": "limits", "capture": "capture", "reward": "reward", "sandbox": "sandbox limits"}


class CliParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit 2."""

    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see --help)\n")


def bad_input(message: str) -> NoReturn:
    """Refuse the command line: one line on stderr, exit 2."""
    print(f"harness-env: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_BAD_INPUT)


def sweep_leftovers(quiet: bool) -> None:
    """What killed runs and servers left (rollout directories and mounts, cgroups, capture sockets),
    removed by `run` and `eval` once their input is checked, so that bad input stays one line.
    `serve` does not: the app's lifespan sweeps, wherever the app is started (server/app.py)."""
    from harness_env.core.sandbox.sweep import sweep_at_start

    for note in sweep_at_start():
        if not quiet:
            print(f"harness-env: {note}", file=sys.stderr)


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def shown_default(default: Any) -> str:
    """A field's default as the help text shows it."""
    if default is None:
        return "none"
    if isinstance(default, (dict, list)):
        return json.dumps(default)
    return str(default)


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {getattr(e, 'msg', 'nested too deeply')}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, e.g. '{\"key\": 1}'")
    return value


def flag_spec(info: Any) -> dict[str, Any]:
    """add_argument's keywords for a pydantic field: its type (a Literal's values as choices, a
    dict as a JSON object, a bool as --x/--no-x), its description and default as help. The
    parsed default is None, so that what was not given is left to the field's own default."""
    kinds = [a for a in get_args(info.annotation) if a is not type(None)] if get_origin(info.annotation) in (Union, types.UnionType) else [info.annotation]
    kind = kinds[0] if len(kinds) == 1 else str
    spec: dict[str, Any] = {"default": None, "help": f"{info.description} (default: {shown_default(info.default)})"}
    if get_origin(kind) is Literal:
        spec["choices"] = list(get_args(kind))
    elif kind is bool:
        spec["action"] = argparse.BooleanOptionalAction
    elif kind is dict or get_origin(kind) is dict:
        spec.update(type=_json_object, metavar="JSON")
    elif kind in (int, float, str):
        spec["type"] = kind
    return spec


def harness_option_models() -> list[tuple[str, Any]]:
    """(name, options model) of every registered harness that has options of its own."""
    from harness_env.envs import harness_options_models

    return list(harness_options_models().items())


def field_cli(info: Any) -> str | None:
    """The flag that carries a harness option instead of its own (e.g. --task), if any."""
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    return extra.get("cli")


def add_rollout_flags(run: argparse.ArgumentParser) -> None:
    """A rollout's flags (run's and eval's): the endpoint, then one flag per option field, by
    group, then one group per harness with options of its own."""
    from harness_env.core.capture.dialects import native_wire_apis
    from harness_env.core.catalog import CATALOG
    from harness_env.envs import HARNESSES
    from harness_env.models import HARNESS_OPTIONS, RolloutArgs, RolloutOptions, option_group

    models = harness_option_models()
    endpoint = run.add_argument_group(
        "endpoint", "the policy: --base-url and --model, or --endpoint (not needed for an agent that calls no model, e.g. Harbor's oracle)"
    )
    args_fields = RolloutArgs.model_fields
    endpoint.add_argument(
        "--endpoint",
        choices=list(CATALOG),
        help="a catalog entry whose URL, model and key come from this "
        "process's environment, as on a server (vllm: VLLM_URL, VLLM_MODEL; openai: OPENAI_API_KEY, ...)",
    )
    endpoint.add_argument("--base-url", default="", help=args_fields["base_url"].description)
    endpoint.add_argument("--model", default="", help=args_fields["model"].description)
    endpoint.add_argument("--wire-api", choices=native_wire_apis(), default="chat", help=f"{args_fields['wire_api'].description} (default: chat)")
    key = endpoint.add_mutually_exclusive_group()
    key.add_argument("--api-key", help="upstream key (prefer --api-key-env: command lines are visible to other users)")
    key.add_argument("--api-key-env", help="name of an environment variable holding the upstream key")

    groups = {name: run.add_argument_group(title) for name, title in GROUP_TITLES.items()}
    actions: dict[str, argparse.Action] = {}
    for name, info in RolloutOptions.model_fields.items():
        if name == HARNESS_OPTIONS:  # one group per harness below
            continue
        spec = flag_spec(info)
        if name == "harness":
            spec["help"] = (
                f"{info.description}: {', '.join(HARNESSES)} (default: {info.default}; a harness's own flags, or a task directory it claims, select it)"
            )
        actions[name] = groups[option_group(info)].add_argument(flag_name(name), **spec)
    actions["disable_thinking"] = groups["capture"].add_argument("--disable-thinking", **flag_spec(args_fields["disable_thinking"]))
    actions["sandbox"] = groups["sandbox"].add_argument(
        "--sandbox", metavar="NAME", help=f"{'|'.join(LOCAL_ISOLATION)}: the local sandbox's isolation (default auto: bubblewrap when available)"
    )
    for name, model in models:
        group = run.add_argument_group(f"{model.label or name} options (--harness {name})")
        for field, info in model.model_fields.items():
            if field_cli(info):  # carried by another flag (--task)
                continue
            if field in actions:  # shared with the command's own flag
                actions[field].help += f"; with --harness {name}, any other value: {info.description} (default: {shown_default(info.default)})"
                continue
            actions[field] = group.add_argument(flag_name(field), **flag_spec(info))
