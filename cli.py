"""The `harness-env` command: run one rollout, install the harness CLIs, or serve.

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


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="harness-env", description="Run coding-agent harnesses on tasks and capture exact token trajectories.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run one rollout and print the RolloutResult JSON")
    run.add_argument("--task", required=True, help="task JSON file (instruction, setup, verify, files, task_id, metadata; "
                     "or a task family's record: task_family, prompt, ...)")
    run.add_argument("--harness", default="pi")
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
    run.add_argument("--sandbox", choices=["auto", "bwrap", "plain"], default="auto", help="local sandbox isolation (auto: bubblewrap when available)")
    run.add_argument("--out", help="write the result JSON to this file instead of stdout")
    run.add_argument("--compact", action="store_true", help="write the result compactly (each turn's new tokens once; read it with harness_env.storage.load)")
    run.add_argument("--rows-out", help="also write the training rows (one per branch of the turn graph) as JSON lines to this file")
    run.add_argument("--quiet", action="store_true", help="no progress on stderr")

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


def _cmd_run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from harness_env.core.errors import InvalidRequestError
    from harness_env.models import PhaseEvent, RolloutRequest
    from harness_env.core.errors import describe_validation_error
    from harness_env.rollout import run_rollout_sync

    task, task_family, family_options, family_limits = split_family_task(_load_task(args.task), args.task)
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
        "task": task,
        "harness_config": harness_config,
        "reward_mode": args.reward_mode,
        "harness": args.harness,
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

    use_bwrap = {"auto": None, "bwrap": True, "plain": False}[args.sandbox]
    try:
        result = run_rollout_sync(request, on_event=progress, use_bwrap=use_bwrap)
    except InvalidRequestError as e:
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
    handlers = {"run": _cmd_run, "install": _cmd_install, "serve": _cmd_serve}
    return handlers[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
