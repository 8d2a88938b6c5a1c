"""The `harness-env` command: run one rollout, evaluate, install the harness CLIs, or serve; a
harness may add commands of its own (Harbor's lists a dataset's tasks), and so may a task family
(the SVG family builds a dataset).

This module is the entry point (`harness_env.cli:main`, `python -m harness_env.cli`): it assembles
the commands and dispatches. Each command lives beside it: `run` in cli_run.py (its request built
in cli_request.py), `serve` in cli_serve.py, `eval` and `export` in cli_eval.py; the flags
derived from the option fields in cli_flags.py.

Bad input gives one line on stderr and exit code 2; a produced result (whatever its reward)
exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from harness_env.cli_flags import CliParser, bad_input, harness_option_models
from harness_env.cli_run import add_run_parser
from harness_env.cli_serve import add_serve_parser
from harness_env.core.distribution import package_version

EPILOG = """examples:
  harness-env run --harness pi --task task.json --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen3-8B --out result.json
  harness-env serve --port 8100        # then open http://127.0.0.1:8100/web; MCP at /mcp

'harness-env COMMAND --help' shows a command's flags."""


def build_parser() -> argparse.ArgumentParser:
    p = CliParser(
        prog="harness-env",
        description="Run coding-agent harnesses on tasks and capture exact token trajectories.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"harness-env {package_version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=CliParser)

    add_run_parser(sub)
    from harness_env.cli_eval import add_eval_parser, add_export_parser

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

    add_serve_parser(sub)
    for command, (help_text, _main) in _family_commands().items():  # each parses its own options
        sub.add_parser(command, add_help=False, help=help_text)
    return p


def _family_commands() -> dict:
    from harness_env.families import FAMILY_COMMANDS

    return FAMILY_COMMANDS


def _one_line_errors(handler):
    """A harness's command whose bad input (ValueError, HarnessEnvError) is one line and exit 2."""
    from harness_env.core.errors import HarnessEnvError

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except (ValueError, HarnessEnvError) as e:
            bad_input(str(e))

    return run


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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in _family_commands():  # a family's command: its own parser, options and errors
        return _family_commands()[argv[0]][1]()(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except BrokenPipeError:  # our reader went away (`| head`): not an error, and no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
