"""`harness-env eval` and `harness-env export`: their parsers and handlers.

eval's rollout flags are run's (cli_flags.add_rollout_flags): the endpoint, the options, each
harness's own; each task of TASKS becomes a request as `run --task` would make it
(cli_request.run_request), so the two commands cannot drift apart.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

EVAL_EPILOG = """TASKS is a JSONL of tasks (one task file's object per line), a directory of task JSON files,
a Harbor dataset directory (--split picks its subdirectory), or an svg_icon dataset (a directory with
tasks.jsonl). Results go to DIR/results/<task>/<attempt>.json, the numbers to DIR/summary.json; run
again with the same --out to resume (finished attempts are kept). The run and its attempts are also
recorded in the store of the data directory (--data-dir), where `harness-env serve`'s Evals tab shows
them. Exit status 1 when every attempt failed for infrastructure reasons.

example:
  harness-env eval tasks.jsonl --harness pi -n 8 --concurrency 16 --out runs/qwen-pi \\
      --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen3-8B
  harness-env export runs/qwen-pi --format parquet --push-to-hub me/qwen-pi-evals"""


def add_eval_parser(sub: Any) -> None:
    from harness_env.cli_flags import add_rollout_flags

    ev = sub.add_parser(
        "eval",
        help="run K attempts of every task (resumable); print mean reward and pass@k",
        epilog=EVAL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ev.add_argument("tasks", metavar="TASKS", help="a JSONL of tasks, a directory of task files, a Harbor dataset or an svg_icon dataset")
    add_rollout_flags(ev)
    g = ev.add_argument_group("evaluation")
    g.add_argument("-n", "--attempts", type=int, default=1, help="attempts per task, K (default: %(default)s)")
    g.add_argument("--concurrency", type=int, default=4, help="attempts run at once (default: %(default)s)")
    g.add_argument("--out", required=True, metavar="DIR", help="where results and summary.json go; an existing one is resumed")
    g.add_argument("--threshold", type=float, default=1.0, help="an attempt passes when its reward is at least this (default: %(default)s)")
    g.add_argument(
        "--server",
        metavar="URL",
        action="append",
        help="run on this harness-env server as jobs; repeat it for several servers, each attempt going to the one "
        "with the fewest in flight (default: in this process)",
    )
    g.add_argument("--token", default=os.environ.get("HARNESS_ENV_TOKEN") or None, help="the server's token (env HARNESS_ENV_TOKEN; default: none)")
    g.add_argument(
        "--data-dir",
        metavar="DIR",
        help="the data directory whose store records this run (default: $HARNESS_ENV_DATA_DIR, "
        "else the user's data directory; $HARNESS_ENV_STORE_URL names another store)",
    )
    g.add_argument("--quiet", action="store_true", help="no progress on stderr")
    ev.set_defaults(handler=cmd_eval)


def add_export_parser(sub: Any) -> None:
    ex = sub.add_parser("export", help="write an eval directory's results and training rows as a dataset (JSONL or parquet, the Hub)")
    ex.add_argument("dir", metavar="DIR", help="the --out directory of `harness-env eval`")
    ex.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl", help="file format (default: %(default)s)")
    ex.add_argument("--to", metavar="DEST", help="where the dataset goes (default: DIR/export)")
    ex.add_argument("--push-to-hub", metavar="REPO", help="upload it as this Hugging Face dataset repository (the stored token, or env HF_TOKEN)")
    ex.add_argument("--public", action="store_true", help="with --push-to-hub: a public dataset (default: private)")
    ex.set_defaults(handler=cmd_export)


def eval_requests(args: argparse.Namespace) -> tuple[list[tuple[str, Any]], Any]:
    """((task id, RolloutRequest) for every task of TASKS, as `run --task` makes them; the local
    sandbox's settings, as cli_request.run_request gives them); bad input exits 2."""
    from harness_env.cli_flags import bad_input
    from harness_env.cli_request import run_request
    from harness_env.core.errors import InvalidRequestError
    from harness_env.evals.tasks import load_tasks

    try:
        tasks = load_tasks(args.tasks, split=getattr(args, "split", None))
    except InvalidRequestError as e:
        bad_input(str(e))
    from harness_env.core.sandbox.backends import SandboxSettings

    out, sandbox = [], SandboxSettings()
    for t in tasks:
        one = copy.copy(args)
        one.task, one.task_index = t.source, t.task_index
        request, sandbox = run_request(one, t.data)
        if not request.task.task_id:
            request = request.model_copy(update={"task": request.task.model_copy(update={"task_id": t.task_id})})
        out.append((t.task_id, request))
    return out, sandbox


def _progress_printer(quiet: bool, out: str):
    """Progress on stderr: one line redrawn in place on a terminal, else a plain line at most every
    second (and the last). A resumed run with nothing left says so."""
    from harness_env.evals.report import progress_line

    tty, last = sys.stderr.isatty(), [0.0]

    def show(p) -> None:
        if p.resumed == p.total:
            if not last[0]:
                last[0] = -1.0
                sys.stderr.write(f"nothing to run: all {p.total} attempts in {out} are finished\n")
            return
        now = time.monotonic()
        final = p.done == p.total and p.running == 0
        if quiet or (not tty and not final and now - last[0] < 1.0):
            return
        last[0] = now
        line = progress_line(p.done, p.total, p.running, p.failed, now - p.started, p.resumed, p.mean_reward)
        sys.stderr.write(("\r" + line + "\033[K" + ("\n" if final else "")) if tty else f"[eval] {line}\n")
        sys.stderr.flush()

    return show


def _recorder(data_dir: str | None):
    """The store of the data directory, as the run's recorder; None (with a warning) when it cannot
    be opened: the evaluation itself does not need it."""
    from harness_env.server.store import Store, default_data_dir, store_url
    from harness_env.server.store.eval_runs import EvalRecorder

    where = Path(data_dir).expanduser() if data_dir else default_data_dir()
    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        return EvalRecorder(Store.open(store_url(where)))
    except Exception as e:  # any store problem (unwritable, a bad URL, a newer schema): run unrecorded, say so
        print(f"warning: this run is not recorded in the store of {where}: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return None


def cmd_eval(args: argparse.Namespace) -> int:
    from harness_env.cli_flags import bad_input, sweep_leftovers
    from harness_env.cli_run import until_stopped
    from harness_env.core.procs import make_undumpable
    from harness_env.evals.report import error_groups, error_lines, headline, table
    from harness_env.evals.run import attempt_errors, evaluate_async
    from harness_env.rollout import local_sandboxes

    if args.attempts < 1 or args.concurrency < 1:
        bad_input("-n/--attempts and --concurrency must be at least 1")
    make_undumpable()  # as run: the upstream key in this process stays out of a plain sandbox's reach
    requests, sandbox = eval_requests(args)
    sweep_leftovers(args.quiet)
    recorder = _recorder(getattr(args, "data_dir", None))
    work = evaluate_async(
        requests,
        args.out,
        attempts=args.attempts,
        concurrency=args.concurrency,
        threshold=args.threshold,
        server=args.server,
        token=args.token,
        sandbox_factory=local_sandboxes(sandbox),
        on_progress=_progress_printer(args.quiet, args.out),
        recorder=recorder,
    )
    try:
        summary = until_stopped(
            work, f"the attempts in flight were cancelled and cleaned up; finished ones are kept in {args.out}: run the same command again to resume"
        )
    except ValueError as e:  # e.g. --out holds another harness's or model's evaluation
        bad_input(str(e))
    finally:
        if recorder is not None:
            recorder.store.close()
    print(table(summary))
    groups = error_groups(attempt_errors(Path(args.out), [tid for tid, _ in requests], args.attempts))
    if groups:
        print("errors (the most frequent messages of each kind):\n" + error_lines(groups))
    print(headline(summary))
    o = summary["overall"]
    if o["attempts"] and o["infra_failures"] == o["attempts"]:
        print("error: every attempt failed for infrastructure reasons (see the errors above); nothing was graded", file=sys.stderr)
        return 1
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from harness_env.cli_flags import bad_input
    from harness_env.evals.export import export, push_to_hub, upload_plan

    try:
        target = export(args.dir, args.format, args.to)
    except ValueError as e:
        bad_input(str(e))
    print(f"dataset written to {target}", file=sys.stderr)
    if args.push_to_hub:
        plan = upload_plan(target, args.push_to_hub, private=not args.public)
        print(f"uploading {len(plan['files'])} files to {plan['repo_id']} ({'private' if plan['private'] else 'public'})", file=sys.stderr)
        print(push_to_hub(plan, token=os.environ.get("HF_TOKEN") or None))
    else:
        print(json.dumps({"dataset": str(target)}))
    return 0
