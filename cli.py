"""The `harness-env` command: run one rollout, list a Harbor dataset's tasks, install the harness
CLIs, or serve.

`run --task` takes a task JSON file, a Harbor task directory (task.toml, instruction.md, tests/), or
a Harbor dataset directory (task directories) with --task-index; the last two run with harness
harbor, as does a task file given with a Harbor option (--agent, --reward-key, a Harbor --sandbox).

Bad input gives one line on stderr and exit code 2; a produced result (whatever its reward)
exits 0. Progress goes to stderr, the RolloutResult JSON to stdout (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import NoReturn

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see --help)\n")


def _bad_input(message: str) -> NoReturn:
    print(f"harness-env: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_BAD_INPUT)


SANDBOX_LIMIT_FLAGS = ("memory_limit_mb", "pids_limit", "disk_limit_mb", "cpu_limit", "network")


def _add_sandbox_limit_flags(parser: argparse.ArgumentParser) -> None:
    """--memory-limit-mb, ..., --network: flags read off the rollout option fields (their type,
    default and description are declared once, in models.RolloutOptions)."""
    from typing import get_args

    from harness_env.models import RolloutOptions

    for name in SANDBOX_LIMIT_FLAGS:
        info = RolloutOptions.model_fields[name]
        choices = get_args(info.annotation) if name == "network" else None
        kind = int if info.annotation is int else (float if name == "cpu_limit" else str)
        parser.add_argument("--" + name.replace("_", "-"), type=kind, choices=choices, default=None,
                            help=f"{info.description} (default {info.default})")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="harness-env", description="Run coding-agent harnesses on tasks and capture exact token trajectories.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run one rollout and print the RolloutResult JSON")
    run.add_argument("--task", required=True, help="task JSON file (instruction, setup, verify, files, task_id, metadata; "
                     "or a task family's record: task_family, prompt, ...), a Harbor task directory (with task.toml), "
                     "or a Harbor dataset directory (of task directories; pick one with --task-index)")
    run.add_argument("--harness", default=None, help="pi (default), opencode, whitebox, harbor; "
                     "a Harbor task or dataset directory, or a Harbor option, means harbor")
    run.add_argument("--task-index", type=int, help="with a Harbor dataset directory: which task (see `harness-env harbor-tasks DIR`)")
    run.add_argument("--split", help="with a Harbor dataset directory: the subdirectory holding its tasks")
    run.add_argument("--agent", help=f"the Harbor agent (harness harbor; default {HARBOR_DEFAULT_AGENT}): pi, opencode, oracle, nop, ...")
    run.add_argument("--reward-key", help="harness harbor: which entry of the verifier's reward.json is the reward")
    run.add_argument("--base-url", required=True, help="OpenAI-compatible policy endpoint, e.g. http://127.0.0.1:8000/v1")
    run.add_argument("--model", required=True)
    key = run.add_mutually_exclusive_group()
    key.add_argument("--api-key", help="upstream key (prefer --api-key-env: command lines are visible to other users)")
    key.add_argument("--api-key-env", help="name of an environment variable holding the upstream key")
    run.add_argument("--mode", choices=["transparent_proxy", "black_box"], default="transparent_proxy")
    run.add_argument("--agent-timeout-s", type=float, default=AGENT_TIMEOUT_DEFAULT)
    run.add_argument("--setup-timeout-s", type=float, default=300.0)
    run.add_argument("--verify-timeout-s", type=float, default=300.0)
    run.add_argument("--max-turns", type=int)
    run.add_argument("--max-tokens-cap", type=int)
    run.add_argument("--disable-thinking", action="store_true")
    run.add_argument("--top-logprobs", type=int, default=0)
    run.add_argument("--temperature", type=float, help="sampling temperature forced on every policy call (train at the same one)")
    run.add_argument("--reward-mode", choices=["correctness", "tool_efficiency"], default="correctness")
    run.add_argument("--harness-config", help="JSON object deep-merged into the harness's own config (e.g. OpenCode's opencode.json)")
    run.add_argument("--sandbox", metavar="NAME",
                     help="auto|bwrap|plain: local sandbox isolation for pi, opencode and whitebox (default auto: bubblewrap when "
                     f"available); a Harbor environment (harness harbor; default {HARBOR_DEFAULT_SANDBOX}): local (ours, bubblewrap), "
                     "docker, e2b, daytona, modal, ...")
    _add_sandbox_limit_flags(run)
    run.add_argument("--out", help="write the result JSON to this file instead of stdout")
    run.add_argument("--compact", action="store_true", help="write the result compactly (each turn's new tokens once; read it with harness_env.storage.load)")
    run.add_argument("--rows-out", help="also write the training rows (one per branch of the turn graph) as JSON lines to this file")
    run.add_argument("--quiet", action="store_true", help="no progress on stderr")

    tasks = sub.add_parser("harbor-tasks", help="list the tasks of a Harbor dataset directory (index, name, instruction)")
    tasks.add_argument("dataset", metavar="DATASET_DIR", help="a directory of Harbor task directories")
    tasks.add_argument("--split", help="the subdirectory of DATASET_DIR holding the tasks")
    tasks.add_argument("--json", action="store_true", help="print the list as JSON (HarborTaskInfo objects)")

    inst = sub.add_parser("install", help="install the pinned harness CLIs (and Node if needed) into the tools directory")
    inst.add_argument("harnesses", nargs="*", help="names (default: all pinned)")
    inst.add_argument("--print-pins", action="store_true", help="print the pinned versions as JSON and exit")

    srv = sub.add_parser("serve", help="serve the app: MCP at /mcp, POST /rollout, /health, /docs, the capture proxy")
    srv.add_argument("--host", default=os.environ.get("HARNESS_ENV_HOST", "127.0.0.1"))
    srv.add_argument("--port", type=int, default=int(os.environ.get("HARNESS_ENV_PORT") or os.environ.get("PORT") or "8000"))
    srv.add_argument("--public-url", default=os.environ.get("HARNESS_ENV_PUBLIC_URL"), help="URL at which sandboxes reach this server")
    srv.add_argument("--token", default=os.environ.get("HARNESS_ENV_TOKEN") or None, help="require 'Authorization: Bearer TOKEN' (env HARNESS_ENV_TOKEN)")
    srv.add_argument("--max-concurrent", type=int, default=None, help="rollouts run at once (env MAX_CONCURRENT_ROLLOUTS; default 2 x cores)")
    srv.add_argument("--max-queue", type=int, default=None, help="rollouts that may wait beyond those (default 4 x max-concurrent)")
    srv.add_argument("--allow-unauthenticated", action="store_true",
                     default=os.environ.get("HARNESS_ENV_ALLOW_UNAUTHENTICATED") == "1",
                     help="serve a non-loopback address without a token (env HARNESS_ENV_ALLOW_UNAUTHENTICATED=1)")
    sub.add_parser("svg-dataset", add_help=False,
                   help="build svg_icon task records from icon parquet shards or a CSV of briefs (--help for its options)")
    return p


AGENT_TIMEOUT_DEFAULT = 600.0
DEFAULT_HARNESS = "pi"
HARBOR_DEFAULT_AGENT = "pi"
HARBOR_DEFAULT_SANDBOX = "local"
LOCAL_ISOLATION = {"auto": None, "bwrap": True, "plain": False}  # --sandbox for the other harnesses: use_bwrap


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


def _subdirs(path: Path) -> list[Path]:
    try:
        return [d for d in path.iterdir() if d.is_dir()]
    except OSError:  # unreadable: Harbor's own listing reports it
        return []


def _holds_task_dirs(path: Path) -> bool:
    return any((d / "task.toml").is_file() for d in _subdirs(path))


def _harbor_source(args: argparse.Namespace) -> dict | None:
    """The Harbor task --task names, as harbor options (task_dir, or dataset + task_index + split),
    or None when --task is a task JSON file."""
    path = Path(args.task).expanduser()
    picks = args.task_index is not None or args.split is not None
    if not path.is_dir():
        if picks:
            _bad_input(f"--task-index and --split pick a task of a Harbor dataset directory; --task {args.task} is not a directory")
        return None
    if (path / "task.toml").is_file():
        if picks:
            _bad_input(f"--task {args.task} is one Harbor task directory (it has task.toml); --task-index and --split are for a dataset directory of them")
        return {"task_dir": str(path.resolve())}
    tasks_here = _holds_task_dirs(path)
    if not tasks_here and not any(_holds_task_dirs(d) for d in _subdirs(path)):
        _bad_input(f"--task {args.task} is a directory but neither a Harbor task directory (no task.toml) "
                   "nor a Harbor dataset (no task directories in it or in its split subdirectories)")
    if args.task_index is None:
        split = "" if tasks_here or args.split else " --split NAME"
        _bad_input(f"--task {args.task} is a Harbor dataset directory: pick one of its tasks with{split} --task-index N "
                   f"(list them with: harness-env harbor-tasks {args.task}{split})")
    source: dict = {"dataset": str(path.resolve()), "task_index": args.task_index}
    if args.split is not None:
        source["split"] = args.split
    return source


def _harness_and_harbor(args: argparse.Namespace, source: dict | None) -> tuple[str, dict | None, bool | None]:
    """(harness, harbor options or None, use_bwrap) from --harness, --task and the Harbor options.
    A Harbor task or dataset directory, or any Harbor option, means harness harbor; another
    --harness given with them is one clear error."""
    sandbox = args.sandbox
    harbor_sandbox = sandbox if sandbox is not None and sandbox not in LOCAL_ISOLATION else None
    flags = [name for name, value in (("--agent", args.agent), ("--reward-key", args.reward_key), (f"--sandbox {sandbox}", harbor_sandbox))
             if value is not None]
    harness = args.harness
    if source is not None or flags:
        if harness not in (None, "harbor"):
            if source is not None:
                kind = "task" if "task_dir" in source else "dataset"
                why = f"--task {args.task} is a Harbor {kind} directory"
            elif flags == [f"--sandbox {sandbox}"]:
                _bad_input(f"--sandbox {sandbox}: with --harness {harness} choose auto, bwrap or plain "
                           "(Harbor environments such as local, docker or e2b are for --harness harbor)")
            else:
                why = f"{' and '.join(flags)} {'is a Harbor option: it is' if len(flags) == 1 else 'are Harbor options: they are'} for"
            hint = f" (to run {harness} inside Harbor, use --agent {harness})" if harness in ("pi", "opencode") and not args.agent else ""
            if source is not None:
                why += ": it runs with"
            _bad_input(f"{why} --harness harbor, not --harness {harness}{hint}")
        harness = "harbor"
    harness = harness or DEFAULT_HARNESS
    if harness != "harbor":
        return harness, None, LOCAL_ISOLATION.get(sandbox or "auto")
    if sandbox == "plain":
        _bad_input("--sandbox plain: harness harbor's local environment always runs in bubblewrap; "
                   "give a Harbor environment instead (local, docker, e2b, daytona, modal, ...)")
    harbor = {**(source or {}), "agent": args.agent or HARBOR_DEFAULT_AGENT, "sandbox": harbor_sandbox or HARBOR_DEFAULT_SANDBOX}
    if args.reward_key is not None:
        harbor["reward_key"] = args.reward_key
    return harness, harbor, None


def _cmd_run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from harness_env.core.errors import InvalidRequestError, ToolMissingError
    from harness_env.models import PhaseEvent, RolloutRequest
    from harness_env.core.errors import describe_validation_error

    source = _harbor_source(args)
    harness, harbor, use_bwrap = _harness_and_harbor(args, source)
    if source is None:
        task, task_family, family_options, family_limits = split_family_task(_load_task(args.task), args.task)
    else:  # the Harbor task brings its own instruction, tests and limits
        task, task_family, family_options, family_limits = None, None, {}, {}
    api_key = args.api_key or ""
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env, "")
        if not api_key:
            _bad_input(f"environment variable {args.api_key_env} (from --api-key-env) is not set")
    harness_config = {}
    if args.harness_config:
        try:
            harness_config = json.loads(args.harness_config)
        except json.JSONDecodeError as e:
            _bad_input(f"--harness-config is not valid JSON: {e.msg}")
    raw = {
        **{f: getattr(args, f) for f in SANDBOX_LIMIT_FLAGS if getattr(args, f) is not None},
        "harness_config": harness_config,
        "reward_mode": args.reward_mode,
        "harness": harness,
        "endpoint": {"base_url": args.base_url, "api_key": api_key, "model": args.model},
        "mode": args.mode,
        "disable_thinking": args.disable_thinking,
        "max_tokens_cap": args.max_tokens_cap,
        "top_logprobs": args.top_logprobs,
        "temperature": args.temperature,
        "max_turns": args.max_turns,
        "agent_timeout_s": args.agent_timeout_s,
        "setup_timeout_s": args.setup_timeout_s,
        "verify_timeout_s": args.verify_timeout_s,
        "task_family": task_family,
        "family_options": family_options,
    }
    if task is not None:
        raw["task"] = task
    if harbor is not None:
        raw["harbor"] = harbor
    for key, value in family_limits.items():  # the record's limits, unless given on the command line
        if key == "max_turns" and args.max_turns is None or key == "agent_timeout_s" and args.agent_timeout_s == AGENT_TIMEOUT_DEFAULT:
            raw[key] = value
    try:
        request = RolloutRequest.model_validate(raw)
    except ValidationError as e:
        _bad_input(describe_validation_error(e))

    def progress(ev: PhaseEvent) -> None:
        if not args.quiet:
            print(f"[{ev.elapsed_s:8.2f}s] {ev.phase}: {ev.status}{' - ' + ev.detail if ev.detail else ''}", file=sys.stderr, flush=True)

    try:
        result = _run_until_stopped(request, progress, use_bwrap)
    except (InvalidRequestError, ToolMissingError) as e:  # e.g. a Harbor task that is not one, no Harbor extra
        _bad_input(str(e))
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
    import asyncio
    import signal

    from harness_env.rollout import run_rollout

    got: list[int] = []

    async def main():
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda s=sig: (got.append(s), task.cancel()))
        return await run_rollout(request, on_event=progress, use_bwrap=use_bwrap)

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        sig = got[0] if got else signal.SIGTERM
        print(f"harness-env: stopped by {signal.Signals(sig).name}; the rollout was cancelled and cleaned up", file=sys.stderr)
        raise SystemExit(128 + sig) from None


INSTRUCTION_COLUMN_CHARS = 80


def _first_line(text: str, limit: int = INSTRUCTION_COLUMN_CHARS) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _cmd_harbor_tasks(args: argparse.Namespace) -> int:
    from harness_env.core.errors import HarnessEnvError
    from harness_env.envs.harbor.resolve import list_tasks

    path = Path(args.dataset).expanduser()
    if (path / "task.toml").is_file():
        _bad_input(f"{args.dataset} is one Harbor task directory (it has task.toml), not a dataset of them; "
                   f"run it with: harness-env run --task {args.dataset} ...")
    try:
        tasks = list_tasks(str(path), args.split, trusted=True)
    except HarnessEnvError as e:  # no such directory or split, no Harbor extra
        _bad_input(str(e))
    if args.json:
        print(json.dumps([t.model_dump(mode="json") for t in tasks], indent=2))
        return 0
    if not tasks:
        where = f"{args.dataset}{f' (split {args.split})' if args.split else ''}"
        print(f"harness-env: no Harbor task directories in {where}", file=sys.stderr)
        return 0
    rows = [(str(t.index), t.name, _first_line(t.instruction)) for t in tasks]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(("INDEX", "NAME"))]
    print(f"{'INDEX':>{widths[0]}}  {'NAME':<{widths[1]}}  INSTRUCTION")
    for index, name, instruction in rows:
        print(f"{index:>{widths[0]}}  {name:<{widths[1]}}  {instruction}".rstrip())
    return 0


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

    for name in ("max_concurrent", "max_queue"):
        value = getattr(args, name)
        if value is not None and value < (1 if name == "max_concurrent" else 0):
            _bad_input(f"--{name.replace('_', '-')} must be at least {1 if name == 'max_concurrent' else 0}")
    return serve(host=args.host, port=args.port, public_url=args.public_url, token=args.token,
                 max_concurrent=args.max_concurrent, max_queue=args.max_queue, allow_unauthenticated=args.allow_unauthenticated)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["svg-dataset"]:  # its own parser, options and errors
        from harness_env.families.svg_icon import dataset

        return dataset.main(argv[1:])
    args = build_parser().parse_args(argv)
    handlers = {"run": _cmd_run, "harbor-tasks": _cmd_harbor_tasks, "install": _cmd_install, "serve": _cmd_serve}
    try:
        return handlers[args.command](args)
    except BrokenPipeError:  # our reader went away (`| head`): not an error, and no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
