"""`harness-env run`: its parser and handler, and `until_stopped`, which `run` and `eval` share.

`--task` takes a task JSON file, or what a harness claims (Harbor: a task or dataset directory); a
harness's own flags select that harness. Progress goes to stderr, the RolloutResult JSON to
stdout (or --out); a produced result (whatever its reward) exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness_env.cli_flags import add_rollout_flags, bad_input, field_cli, harness_option_models, sweep_leftovers
from harness_env.cli_request import run_request


def add_run_parser(sub: Any) -> None:
    run = sub.add_parser("run", help="run one rollout and print the RolloutResult JSON")
    _add_run_flags(run)
    run.set_defaults(handler=cmd_run)


def _add_run_flags(run: argparse.ArgumentParser) -> None:
    """The run command's flags: the task, the rollout's flags, the output."""
    claims = "".join(
        f"; for harness {name}: {info.description}"
        for name, model in harness_option_models()
        for info in model.model_fields.values()
        if field_cli(info) == "--task"
    )
    task = run.add_argument_group("task")
    task.add_argument(
        "--task",
        required=True,
        help=f"task JSON file (instruction, setup, verify, files, task_id, metadata; or a task family's record: task_family, prompt, ...){claims}",
    )
    add_rollout_flags(run)
    out = run.add_argument_group("output")
    out.add_argument("--out", help="write the result JSON to this file instead of stdout")
    out.add_argument("--compact", action="store_true", help="write the result compactly (each turn's new tokens once; read it with harness_env.storage.load)")
    out.add_argument(
        "--rows-out",
        help="also write the training rows (one per branch of the turn graph) as JSON lines to this file, in the layout of the export's rows table",
    )
    out.add_argument("--quiet", action="store_true", help="no progress on stderr")


def cmd_run(args: argparse.Namespace) -> int:
    from harness_env.core.errors import InvalidRequestError, SandboxError, ToolMissingError
    from harness_env.core.procs import make_undumpable
    from harness_env.core.serialisable import made_serialisable
    from harness_env.models import PhaseEvent

    make_undumpable()  # the upstream key in this process stays out of reach of a plain sandbox's agent (same uid)

    request, sandbox = run_request(args)
    sweep_leftovers(args.quiet)

    def progress(ev: PhaseEvent) -> None:
        if not args.quiet:
            print(f"[{ev.elapsed_s:8.2f}s] {ev.phase}: {ev.status}{' - ' + ev.detail if ev.detail else ''}", file=sys.stderr, flush=True)

    try:
        result = _run_until_stopped(request, progress, sandbox)
    except (InvalidRequestError, ToolMissingError, SandboxError) as e:  # e.g. a Harbor task that is not one, no Harbor extra, TMPDIR too long
        bad_input(str(e))
    result = made_serialisable(result)  # a result that cannot be written is repaired, or failed with why: never a traceback
    if args.compact:
        from harness_env.storage import pack

        text = json.dumps(pack(result), separators=(",", ":"))
    else:
        text = result.model_dump_json(indent=2)
    if args.rows_out:
        from harness_env.storage import row_records

        Path(args.rows_out).write_text("".join(json.dumps(row) + "\n" for row in row_records(result)))  # the export's `rows` layout
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    return 0


def _run_until_stopped(request, progress, sandbox):
    """Run the rollout; SIGTERM or Ctrl-C cancels it, its clean-up runs (processes killed, the
    rollout directory removed), and the command exits 143 / 130."""
    from harness_env.rollout import local_sandboxes, run_rollout

    return until_stopped(run_rollout(request, on_event=progress, sandbox_factory=local_sandboxes(sandbox)), "the rollout was cancelled and cleaned up")


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
