"""The RolloutRequest a rollout command line describes (`run`'s, and each task of `eval`'s): the
RolloutArgs of the task file (or a task family's record), the harness its flags select, the
endpoint and the option fields given, resolved as every face of the server resolves its callers'
(core/catalog.to_request). Pure but for reading the task file and --api-key-env's variable; bad
input exits 2 with one line.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness_env.cli_flags import LOCAL_ISOLATION, SHARED_FLAGS, bad_input, harness_option_models

if TYPE_CHECKING:  # imported where used: every command line loads this module
    from harness_env.core.sandbox.backends import SandboxSettings
    from harness_env.models import RolloutArgs, RolloutRequest, Task


def load_task(path: str) -> dict:
    try:
        text = Path(path).read_text()
    except OSError as e:
        bad_input(f"cannot read task file {path}: {e.strerror}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        bad_input(f"task file {path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}")
    if not isinstance(data, dict):
        bad_input(f"task file {path} must hold a JSON object with at least 'instruction'")
    return data


def harness_of(flags: dict[str, Any]) -> tuple[str, dict[str, Any] | None, SandboxSettings]:
    """(harness, its options or None, the local sandbox's settings) from the run command's flags: the first harness
    whose options model claims the command line (after every one has checked it) (its flags, a task directory it runs), else
    --harness (default pi) in our sandbox with --sandbox's isolation."""
    from harness_env.models import DEFAULT_HARNESS

    claims = []
    for name, model in harness_option_models():  # each asked, so each says what is wrong for it
        try:
            options = model.from_command_line(name, flags, SHARED_FLAGS)
        except ValueError as e:
            bad_input(str(e))
        if options is not None:
            claims.append((name, model, options))
    if claims:  # --sandbox is the harness's own when its options take it (Harbor's)
        name, model, options = claims[0]
        return name, options, _local_isolation({} if "sandbox" in model.model_fields else flags)
    return flags.get("harness") or DEFAULT_HARNESS, None, _local_isolation(flags)


def _local_isolation(flags: dict[str, Any]) -> SandboxSettings:
    """The local sandbox backend's settings from --sandbox, for a harness run in our sandbox."""
    from harness_env.core.sandbox.backends import SandboxSettings

    sandbox = flags.get("sandbox") or "auto"
    if sandbox not in LOCAL_ISOLATION:
        bad_input(f"--sandbox {sandbox}: choose {', '.join(LOCAL_ISOLATION)}")
    return SandboxSettings(use_bwrap=LOCAL_ISOLATION[sandbox])


def request_fields(flags: dict[str, Any]) -> dict[str, Any]:
    """The option fields the command line gave (a flag not given leaves the field's default)."""
    from harness_env.models import HARNESS_OPTIONS, RolloutOptions

    return {name: flags[name] for name in RolloutOptions.model_fields if name != HARNESS_OPTIONS and flags.get(name) is not None}


def run_request(args: argparse.Namespace, task_data: dict | None = None) -> tuple[RolloutRequest, SandboxSettings]:
    """(the RolloutRequest, the local sandbox's settings: rollout.local_sandboxes) the run command's arguments describe (`task_data`: the
    task's object, already read from args.task): the RolloutArgs of its flags and task file,
    resolved by the server's own resolver (core/catalog.to_request), so the two cannot drift; the
    command line is trusted (its image may be a local one). Bad input exits 2 with one line. Pure
    but for reading the task file and --api-key-env's variable."""
    from harness_env.core.catalog import to_request
    from harness_env.core.errors import InvalidRequestError

    flags = vars(args)
    harness, harness_options, sandbox = harness_of(flags)
    task, task_family, family_options, family_limits = task_of(args, harness, harness_options, task_data)
    fields = {
        **family_limits,  # a family record's own limits, unless given on the command line
        "task_family": task_family,
        **request_fields(flags),
        "family_options": {**family_options, **(args.family_options or {})},
        "harness": harness,
        "harness_options": harness_options,
        "disable_thinking": args.disable_thinking,  # none: the endpoint kind's default, as on a server
        **endpoint_fields(args),
        # The Task's fields are RolloutArgs' too, but for metadata, which to_request takes beside them.
        **(task.model_dump(exclude={"metadata"}, exclude_none=True) if task is not None else {}),
    }
    rollout_args = _rollout_args(fields)
    check_endpoint_given(args, rollout_args.agent_calls_model)
    try:
        return to_request(rollout_args, trusted=True, metadata=task.metadata if task is not None else None), sandbox
    except InvalidRequestError as e:
        bad_input(str(e))


def task_of(
    args: argparse.Namespace, harness: str, harness_options: dict[str, Any] | None, task_data: dict | None
) -> tuple[Task | None, str | None, dict, dict]:
    """(the task file's Task, its task family, family_options, request limits); no Task when the
    harness's options name a task, which brings its own."""
    from harness_env.core.errors import InvalidRequestError
    from harness_env.envs import harness_options_models
    from harness_env.evals.tasks import split_family_task

    model = harness_options_models().get(harness)
    if harness_options is not None and model is not None and model.model_construct(**harness_options).names_task:
        return None, None, {}, {}
    try:
        task, task_family, family_options, family_limits = split_family_task(task_data if task_data is not None else load_task(args.task), args.task)
    except InvalidRequestError as e:  # a task_family no one registered
        bad_input(str(e))
    return checked_task(task), task_family, family_options, family_limits


def checked_task(data: dict) -> Task:
    """The task file's task, checked as the wire type it is: an unknown key is refused, and a
    problem is named where it sits in the request (`task.instruction: Field required`)."""
    from pydantic import ValidationError

    from harness_env.core.errors import describe_validation_error
    from harness_env.models import Task

    try:
        return Task.model_validate(data)
    except ValidationError as e:
        bad_input(describe_validation_error(e, "task"))


def endpoint_fields(args: argparse.Namespace) -> dict[str, Any]:
    """RolloutArgs' endpoint fields from the endpoint flags (--api-key-env's variable read here)."""
    api_key = args.api_key or ""
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env, "")
        if not api_key:
            bad_input(f"environment variable {args.api_key_env} (from --api-key-env) is not set")
    return {"endpoint": args.endpoint or "", "base_url": args.base_url or "", "api_key": api_key, "model": args.model or "", "wire_api": args.wire_api}


def check_endpoint_given(args: argparse.Namespace, agent_calls_model: bool) -> None:
    """The command line's own word for a missing endpoint, naming its flags (the catalog's names
    the tool's fields): --endpoint, or --base-url with --model; neither only for an agent that
    calls no model (else the request stands in an endpoint nothing calls)."""
    if args.endpoint or (args.base_url and args.model):
        return
    if agent_calls_model or args.base_url or args.model:
        bad_input("no policy endpoint: pass --base-url and --model, or --endpoint vllm|openai|hf_router")


def _rollout_args(fields: dict[str, Any]) -> RolloutArgs:
    """The command line's RolloutArgs: a bad value is named as the tool's argument it is."""
    from pydantic import ValidationError

    from harness_env.core.errors import describe_validation_error
    from harness_env.models import RolloutArgs

    try:
        return RolloutArgs.model_validate(fields)
    except ValidationError as e:
        bad_input(describe_validation_error(e))
