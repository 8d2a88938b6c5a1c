"""The `harness-env` command: run one rollout, install the harness CLIs, or serve; a harness may add
commands of its own (Harbor's lists a dataset's tasks).

`run`'s flags are derived from the option fields, never restated: each field of
models.RolloutOptions is one kebab-case flag whose help is the field's description and default,
grouped as the fields are, and each harness's own options model (from the harness registry) adds a
group of its own. `--task` takes a task JSON file, or what a harness claims (Harbor: a task or
dataset directory); a harness's own flags select that harness.

Bad input gives one line on stderr and exit code 2; a produced result (whatever its reward)
exits 0. Progress goes to stderr, the RolloutResult JSON to stdout (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from pathlib import Path
from typing import Any, Literal, NoReturn, Union, get_args, get_origin

EXIT_BAD_INPUT = 2
DEFAULT_PORT = 8100  # not vLLM's 8000, where the policy usually is
LOCAL_ISOLATION = {"auto": None, "bwrap": True, "plain": False}  # --sandbox for harnesses run in our sandbox: use_bwrap
# A harness option may share one of the command's own flags (Harbor's sandbox: --sandbox); these
# values of it stay the command's.
SHARED_FLAGS = {"sandbox": tuple(LOCAL_ISOLATION)}
GROUP_TITLES = {"harness": "harness", "limits": "limits", "capture": "capture", "reward": "reward", "sandbox": "sandbox limits"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see --help)\n")


def _bad_input(message: str) -> NoReturn:
    print(f"harness-env: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_BAD_INPUT)


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
    from harness_env.models import harness_options_models

    return list(harness_options_models().items())


def _field_cli(info: Any) -> str | None:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    return extra.get("cli")


def _add_run_flags(run: argparse.ArgumentParser) -> None:
    """The run command's flags: the task, the rollout's flags, the output."""
    claims = "".join(f"; for harness {name}: {info.description}" for name, model in harness_option_models()
                     for info in model.model_fields.values() if _field_cli(info) == "--task")
    task = run.add_argument_group("task")
    task.add_argument("--task", required=True, help="task JSON file (instruction, setup, verify, files, task_id, metadata; "
                      f"or a task family's record: task_family, prompt, ...){claims}")
    add_rollout_flags(run)
    out = run.add_argument_group("output")
    out.add_argument("--out", help="write the result JSON to this file instead of stdout")
    out.add_argument("--compact", action="store_true", help="write the result compactly (each turn's new tokens once; read it with harness_env.storage.load)")
    out.add_argument("--rows-out", help="also write the training rows (one per branch of the turn graph) as JSON lines to this file")
    out.add_argument("--quiet", action="store_true", help="no progress on stderr")


def add_rollout_flags(run: argparse.ArgumentParser) -> None:
    """A rollout's flags (run's and eval's): the endpoint, then one flag per option field, by
    group, then one group per harness with options of its own."""
    from harness_env.envs import HARNESSES
    from harness_env.models import HARNESS_OPTIONS, RolloutArgs, RolloutOptions, RolloutRequest, option_group
    from harness_env.server.catalog import CATALOG

    models = harness_option_models()
    endpoint = run.add_argument_group("endpoint", "the policy: --base-url and --model, or --endpoint (not needed for an agent "
                                      "that calls no model, e.g. Harbor's oracle)")
    args_fields = RolloutArgs.model_fields
    endpoint.add_argument("--endpoint", choices=list(CATALOG), help="a catalog entry whose URL, model and key come from this "
                          "process's environment, as on a server (vllm: VLLM_URL, VLLM_MODEL; openai: OPENAI_API_KEY, ...)")
    endpoint.add_argument("--base-url", default="", help=args_fields["base_url"].description)
    endpoint.add_argument("--model", default="", help=args_fields["model"].description)
    endpoint.add_argument("--wire-api", choices=list(get_args(args_fields["wire_api"].annotation)), default="chat",
                          help=f"{args_fields['wire_api'].description} (default: chat)")
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
            spec["help"] = (f"{info.description}: {', '.join(HARNESSES)} (default: {info.default}; a harness's own flags, or "
                            "a task directory it claims, select it)")
        actions[name] = groups[option_group(info)].add_argument(flag_name(name), **spec)
    actions["disable_thinking"] = groups["capture"].add_argument("--disable-thinking", **flag_spec(RolloutRequest.model_fields["disable_thinking"]))
    actions["sandbox"] = groups["sandbox"].add_argument(
        "--sandbox", metavar="NAME", help=f"{'|'.join(LOCAL_ISOLATION)}: the local sandbox's isolation (default auto: bubblewrap when available)")
    for name, model in models:
        group = run.add_argument_group(f"{model.label or name} options (--harness {name})")
        for field, info in model.model_fields.items():
            if _field_cli(info):  # carried by another flag (--task)
                continue
            if field in actions:  # shared with the command's own flag
                actions[field].help += f"; with --harness {name}, any other value: {info.description} (default: {shown_default(info.default)})"
                continue
            actions[field] = group.add_argument(flag_name(field), **flag_spec(info))


EPILOG = """examples:
  harness-env run --harness pi --task task.json --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen3-8B --out result.json
  harness-env serve --port 8100        # then open http://127.0.0.1:8100/web; MCP at /mcp

'harness-env COMMAND --help' shows a command's flags."""
SERVE_EPILOG = """The server answers at:
  /web      the web UI (a token login when the server has one)
  /mcp      MCP over streamable HTTP: tools run_rollout, submit_rollout, get_rollout, list_harnesses, list_tasks, catalog
  /rollout  POST one rollout and wait for it; /rollouts submit, list, watch, cancel jobs; /docs lists the HTTP routes
  /health   liveness and load, open without a token"""


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("harness-env")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="harness-env", description="Run coding-agent harnesses on tasks and capture exact token trajectories.",
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"harness-env {version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run one rollout and print the RolloutResult JSON")
    _add_run_flags(run)
    run.set_defaults(handler=_cmd_run)
    from harness_env.evals.cli import add_eval_parser, add_export_parser

    add_eval_parser(sub)
    add_export_parser(sub)

    for _name, model in harness_option_models():
        for command, (help_text, add_arguments, handler) in model.cli_commands().items():
            cmd = sub.add_parser(command, help=help_text)
            add_arguments(cmd)
            cmd.set_defaults(handler=_one_line_errors(handler))

    inst = sub.add_parser("install", help="install the pinned harness CLIs (and Node if needed) into the tools directory")
    inst.add_argument("harnesses", nargs="*", help="names (default: all pinned)")
    inst.add_argument("--print-pins", action="store_true", help="print the pinned versions as JSON and exit")
    inst.set_defaults(handler=_cmd_install)

    srv = sub.add_parser("serve", help="serve the app: the web UI at /web, MCP at /mcp, POST /rollout, /health, /docs, the capture proxy",
                         epilog=SERVE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    srv.add_argument("--host", default=os.environ.get("HARNESS_ENV_HOST", "127.0.0.1"),
                     help="address to listen on (env HARNESS_ENV_HOST; default: %(default)s; another address needs a token)")
    srv.add_argument("--port", type=int, default=int(os.environ.get("HARNESS_ENV_PORT") or os.environ.get("PORT") or DEFAULT_PORT),
                     help=f"port (env HARNESS_ENV_PORT or PORT; default: {DEFAULT_PORT}, beside vLLM's 8000)")
    srv.add_argument("--public-url", default=os.environ.get("HARNESS_ENV_PUBLIC_URL"),
                     help="URL at which sandboxes reach this server (env HARNESS_ENV_PUBLIC_URL; default: http://127.0.0.1:PORT, "
                          "on a Hugging Face Space https://$SPACE_HOST)")
    srv.add_argument("--token", default=os.environ.get("HARNESS_ENV_TOKEN") or None,
                     help="require 'Authorization: Bearer TOKEN' (env HARNESS_ENV_TOKEN; default: none, loopback only)")
    srv.add_argument("--max-concurrent", type=int, default=None,
                     help="rollouts run at once (env MAX_CONCURRENT_ROLLOUTS; default: 2 x the CPUs this process may use)")
    srv.add_argument("--max-queue", type=int, default=None, help="rollouts that may wait beyond those (default: 4 x max-concurrent)")
    srv.add_argument("--max-starting", type=int, default=None,
                     help="of the running rollouts, how many may be starting at once (sandbox, setup, harness launch until its first "
                          "model call); the rest wait in arrival order (env MAX_STARTING_ROLLOUTS; default: the CPUs this process may use)")
    srv.add_argument("--allow-unauthenticated", action="store_true",
                     default=os.environ.get("HARNESS_ENV_ALLOW_UNAUTHENTICATED") == "1",
                     help="serve a non-loopback address without a token (env HARNESS_ENV_ALLOW_UNAUTHENTICATED=1)")
    srv.add_argument("--data-dir", default=None,
                     help="where the job store keeps rollouts (SQLite; env HARNESS_ENV_DATA_DIR; default: /data/harness-env on a Space "
                          "with persistent storage, else ~/.local/share/harness-env/data; HARNESS_ENV_STORE_URL=postgresql://... "
                          "uses PostgreSQL instead)")
    srv.add_argument("--retention-max-age", default=None,
                     help="remove stored results that ended longer ago, e.g. 30d, 12h (env HARNESS_ENV_RETENTION_MAX_AGE; default: none)")
    srv.add_argument("--retention-max-size", default=None,
                     help="keep stored results under this total, the oldest removed first, e.g. 10GB, 500MB, 0 for no limit "
                          "(env HARNESS_ENV_RETENTION_MAX_SIZE; default: 10GB)")
    ray = srv.add_argument_group("Ray", "serve the same app as a Ray Serve application: replicas, each with its own engine, capture "
                                 "proxy and sandboxes, sharing a PostgreSQL store ($HARNESS_ENV_STORE_URL); needs the ray extra")
    ray.add_argument("--ray", action="store_true", help="deploy on Ray Serve (a local Ray cluster unless --ray-address)")
    ray.add_argument("--ray-address", default=None, metavar="ADDR",
                     help="a running Ray cluster: host:port of its head's GCS (RAY_ADDRESS is not read; default: start a local cluster)")
    ray.add_argument("--replicas", type=int, default=None, metavar="N", help="a fixed number of replicas (default: 1)")
    ray.add_argument("--min-replicas", type=int, default=None, metavar="A",
                     help="autoscaling on ongoing requests: at least A replicas (default: none, a fixed count)")
    ray.add_argument("--max-replicas", type=int, default=None, metavar="B", help="autoscaling: at most B replicas (default: none, a fixed count)")
    srv.set_defaults(handler=_cmd_serve)
    sub.add_parser("svg-dataset", add_help=False,
                   help="build svg_icon task records from icon parquet shards or a CSV of briefs (--help for its options)")
    return p


def _one_line_errors(handler):
    """A harness's command whose bad input (ValueError, HarnessEnvError) is one line and exit 2."""
    from harness_env.core.errors import HarnessEnvError

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except (ValueError, HarnessEnvError) as e:
            _bad_input(str(e))

    return run


def _load_task(path: str) -> dict:
    try:
        text = Path(path).read_text()
    except OSError as e:
        _bad_input(f"cannot read task file {path}: {e.strerror}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        _bad_input(f"task file {path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}")
    if not isinstance(data, dict):
        _bad_input(f"task file {path} must hold a JSON object with at least 'instruction'")
    return data


TASK_KEYS = ("instruction", "setup", "verify", "files", "task_id", "metadata")
FAMILY_REQUEST_KEYS = ("max_turns", "agent_timeout_s")  # a family record's own limits


def split_family_task(data: dict, task_file: str) -> tuple[dict, str | None, dict, dict]:
    """A task file with a top-level `task_family` (e.g. {"task_family": "svg_icon", "prompt": ...,
    "reference_png": "ref.png"}): (task, family, family_options, request limits). `prompt` is the
    instruction; a relative reference_png is relative to the task file."""
    data = dict(data)
    family = data.pop("task_family", None)
    if family is None:
        return data, None, {}, {}
    if "prompt" in data:
        data["instruction"] = data.pop("prompt")
    task = {k: data.pop(k) for k in TASK_KEYS if k in data}
    limits = {k: data.pop(k) for k in FAMILY_REQUEST_KEYS if data.get(k) is not None}
    ref = data.get("reference_png")
    if isinstance(ref, str) and ref and not os.path.isabs(ref):
        data["reference_png"] = os.path.join(os.path.dirname(os.path.abspath(task_file)), ref)
    return task, family, data, limits


def harness_of(flags: dict[str, Any]) -> tuple[str, dict[str, Any] | None, bool | None]:
    """(harness, its options or None, use_bwrap) from the run command's flags: the first harness
    whose options model claims the command line (after every one has checked it) (its flags, a task directory it runs), else
    --harness (default pi) in our sandbox with --sandbox's isolation."""
    from harness_env.models import DEFAULT_HARNESS

    claims = []
    for name, model in harness_option_models():  # each asked, so each says what is wrong for it
        try:
            options = model.from_command_line(name, flags, SHARED_FLAGS)
        except ValueError as e:
            _bad_input(str(e))
        if options is not None:
            claims.append((name, model, options))
    if claims:  # --sandbox is the harness's own when its options take it (Harbor's)
        name, model, options = claims[0]
        return name, options, None if "sandbox" in model.model_fields else _local_isolation(flags)
    return flags.get("harness") or DEFAULT_HARNESS, None, _local_isolation(flags)


def _local_isolation(flags: dict[str, Any]) -> bool | None:
    """use_bwrap from --sandbox, for a harness run in our sandbox."""
    sandbox = flags.get("sandbox") or "auto"
    if sandbox not in LOCAL_ISOLATION:
        _bad_input(f"--sandbox {sandbox}: choose {', '.join(LOCAL_ISOLATION)}")
    return LOCAL_ISOLATION[sandbox]


def request_fields(flags: dict[str, Any]) -> dict[str, Any]:
    """The option fields the command line gave (a flag not given leaves the field's default)."""
    from harness_env.models import HARNESS_OPTIONS, RolloutOptions

    return {name: flags[name] for name in RolloutOptions.model_fields if name != HARNESS_OPTIONS and flags.get(name) is not None}


def run_request(args: argparse.Namespace, task_data: dict | None = None):
    """(the RolloutRequest, use_bwrap) the run command's arguments describe (`task_data`: the
    task's object, already read from args.task); bad input exits 2 with one line. Pure but for
    reading the task file and --api-key-env's variable."""
    from pydantic import ValidationError

    from harness_env.core.errors import describe_validation_error
    from harness_env.models import RolloutRequest, harness_options_models
    from harness_env.models_options import calls_model

    flags = vars(args)
    harness, harness_options, use_bwrap = harness_of(flags)
    model = harness_options_models().get(harness)
    if harness_options is not None and model is not None and model.model_construct(**harness_options).names_task:
        task, task_family, family_options, family_limits = None, None, {}, {}  # the harness's task brings its own
    else:
        task, task_family, family_options, family_limits = split_family_task(task_data if task_data is not None else _load_task(args.task), args.task)
    api_key = args.api_key or ""
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env, "")
        if not api_key:
            _bad_input(f"environment variable {args.api_key_env} (from --api-key-env) is not set")
    raw: dict[str, Any] = {
        **family_limits,  # a family record's own limits, unless given on the command line
        "task_family": task_family,
        **request_fields(flags),
        "family_options": {**family_options, **(args.family_options or {})},
        "harness": harness,
        "disable_thinking": bool(args.disable_thinking),
    }
    if task is not None:
        raw["task"] = task
    if harness_options is not None:
        raw["harness_options"] = harness_options
    if args.endpoint:
        raw["endpoint"] = catalog_endpoint(args, api_key, calls_model(raw))
    elif args.base_url and args.model:
        raw["endpoint"] = {"base_url": args.base_url, "api_key": api_key, "model": args.model, "wire_api": args.wire_api}
    elif calls_model(raw) or args.base_url or args.model:  # else the request stands in an endpoint nothing calls
        _bad_input("no policy endpoint: pass --base-url and --model, or --endpoint vllm|openai|hf_router")
    try:
        return RolloutRequest.model_validate(raw), use_bwrap
    except ValidationError as e:
        _bad_input(describe_validation_error(e))


def catalog_endpoint(args: argparse.Namespace, api_key: str, agent_calls_model: bool):
    """--endpoint NAME resolved from this process's environment, as the server resolves the tool's
    `endpoint` (explicit --base-url/--model/--api-key win)."""
    from pydantic import SecretStr

    from harness_env.core.errors import InvalidRequestError
    from harness_env.server.catalog import resolve_endpoint

    given = types.SimpleNamespace(endpoint=args.endpoint, base_url=args.base_url, api_key=SecretStr(api_key), model=args.model, wire_api=args.wire_api,
                                  agent_calls_model=agent_calls_model)
    try:
        return resolve_endpoint(given)[0]
    except InvalidRequestError as e:
        _bad_input(str(e))


def _cmd_run(args: argparse.Namespace) -> int:
    from harness_env.core.errors import InvalidRequestError, ToolMissingError
    from harness_env.core.procs import make_undumpable
    from harness_env.core.serialisable import made_serialisable
    from harness_env.models import PhaseEvent

    make_undumpable()  # the upstream key in this process stays out of reach of a plain sandbox's agent (same uid)

    request, use_bwrap = run_request(args)

    def progress(ev: PhaseEvent) -> None:
        if not args.quiet:
            print(f"[{ev.elapsed_s:8.2f}s] {ev.phase}: {ev.status}{' - ' + ev.detail if ev.detail else ''}", file=sys.stderr, flush=True)

    try:
        result = _run_until_stopped(request, progress, use_bwrap)
    except (InvalidRequestError, ToolMissingError) as e:  # e.g. a Harbor task that is not one, no Harbor extra
        _bad_input(str(e))
    result = made_serialisable(result)  # a result that cannot be written is repaired, or failed with why: never a traceback
    if args.compact:
        from harness_env.storage import pack

        text = json.dumps(pack(result), separators=(",", ":"))
    else:
        text = result.model_dump_json(indent=2)
    if args.rows_out:
        Path(args.rows_out).write_text("".join(row.model_dump_json() + "\n" for row in result.training_rows()))
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    return 0


def _run_until_stopped(request, progress, use_bwrap):
    """Run the rollout; SIGTERM or Ctrl-C cancels it, its clean-up runs (processes killed, the
    rollout directory removed), and the command exits 143 / 130."""
    from harness_env.rollout import run_rollout

    return until_stopped(run_rollout(request, on_event=progress, use_bwrap=use_bwrap), "the rollout was cancelled and cleaned up")


def until_stopped(work, stopped: str):
    """Await `work` in a new event loop; SIGTERM or Ctrl-C cancels it (its clean-up runs), says
    `stopped` and exits 143 / 130."""
    import asyncio
    import signal

    got: list[int] = []

    async def main():
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda s=sig: (got.append(s), task.cancel()))
        return await work

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        sig = got[0] if got else signal.SIGTERM
        print(f"harness-env: stopped by {signal.Signals(sig).name}; {stopped}", file=sys.stderr)
        raise SystemExit(128 + sig) from None


def _cmd_install(args: argparse.Namespace) -> int:
    from harness_env.core import toolchain
    from harness_env.core.errors import ToolMissingError

    if args.print_pins:
        print(toolchain.pins_json())
        return 0
    try:
        done = toolchain.install(args.harnesses or None, log=lambda m: print(m, file=sys.stderr))
    except ToolMissingError as e:
        print(f"harness-env: install failed: {e}", file=sys.stderr)
        return 1
    print(json.dumps(done))
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from harness_env.server.main import serve

    if args.max_starting is None and os.environ.get("MAX_STARTING_ROLLOUTS"):
        value = os.environ["MAX_STARTING_ROLLOUTS"]
        if not value.strip().isdigit() or int(value) < 1:
            _bad_input(f"MAX_STARTING_ROLLOUTS must be a whole number of at least 1, not {value[:40]!r}")
        args.max_starting = int(value)
    for name, least in (("max_concurrent", 1), ("max_queue", 0), ("max_starting", 1)):
        value = getattr(args, name)
        if value is not None and value < least:
            _bad_input(f"--{name.replace('_', '-')} must be at least {least}, not {value}")
    from harness_env.server.jobs_upkeep import Retention

    try:
        retention = Retention.from_env(args.retention_max_age, args.retention_max_size)
    except ValueError as e:
        _bad_input(str(e))
    ray_flags = [f for f in ("ray_address", "replicas", "min_replicas", "max_replicas") if getattr(args, f) is not None]
    if args.ray:
        return _serve_on_ray(args)
    if ray_flags:
        _bad_input(f"--{ray_flags[0].replace('_', '-')} is a Ray setting: add --ray")
    return serve(host=args.host, port=args.port, public_url=args.public_url, token=args.token,
                 max_concurrent=args.max_concurrent, max_queue=args.max_queue, max_starting=args.max_starting,
                 allow_unauthenticated=args.allow_unauthenticated,
                 data_dir=args.data_dir, retention=retention)


def _serve_on_ray(args: argparse.Namespace) -> int:
    from harness_env.server.main import check_exposure
    from harness_env.server.ray_settings import ReplicaSettings, Scale, replica_problem

    problem = check_exposure(args.host, args.token, args.allow_unauthenticated)
    if problem:
        _bad_input(problem)
    scale = Scale(args.replicas, args.min_replicas, args.max_replicas)
    if (problem := scale.problem()) is not None:
        _bad_input(problem)
    if args.data_dir is not None:
        _bad_input("--data-dir is a single server's SQLite store: Ray replicas share HARNESS_ENV_STORE_URL=postgresql://...")
    settings = ReplicaSettings(public_url=(args.public_url or f"http://127.0.0.1:{args.port}").rstrip("/"), token_required=bool(args.token),
                               max_concurrent=args.max_concurrent, max_queue=args.max_queue,
                               retention_max_age=args.retention_max_age, retention_max_size=args.retention_max_size)
    if args.ray_address is None and (problem := replica_problem(settings, dict(os.environ), args.token)):
        _bad_input(problem)  # a local cluster's nodes have this environment: said before Ray starts
    try:
        from harness_env.server.ray_serve import serve_on_ray
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "ray":
            raise
        _bad_input("--ray needs Ray Serve: install the ray extra (pip install 'harness-env[ray]'; ./dev test installs it)")
    return serve_on_ray(host=args.host, port=args.port, address=args.ray_address, scale=scale, settings=settings, token=args.token)


def _sweep_leftovers(quiet: bool) -> None:
    """What killed runs and servers left (rollout directories and mounts, cgroups, capture sockets).
    `serve` does not: the app's lifespan sweeps, wherever the app is started (server/app.py)."""
    from harness_env.core.sandbox.sweep import sweep_at_start

    for note in sweep_at_start():
        if not quiet:
            print(f"harness-env: {note}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["svg-dataset"]:  # its own parser, options and errors
        from harness_env.families.svg_icon import dataset

        return dataset.main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command in ("run", "eval"):
        _sweep_leftovers(quiet=getattr(args, "quiet", False))
    try:
        return args.handler(args)
    except BrokenPipeError:  # our reader went away (`| head`): not an error, and no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
