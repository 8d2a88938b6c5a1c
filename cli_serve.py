"""`harness-env serve`: the command, its flags and their checks from server/serve_args.py (which
OpenEnv's `server` script shares). What it serves is server/main.py's (one server) or
server/ray/serve.py's (Ray Serve replicas), imported only when the command runs, so that other
commands do not load the server. The CLI imports the server; the server never imports the CLI.
"""

from __future__ import annotations

import argparse
from typing import Any

from harness_env.cli_flags import bad_input
from harness_env.server.serve_args import SERVE_EPILOG, SERVE_HELP, BadServeArgs, add_serve_arguments, serve_plan


def add_serve_parser(sub: Any) -> None:
    srv = sub.add_parser("serve", help=SERVE_HELP, epilog=SERVE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_serve_arguments(srv)
    srv.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        plan = serve_plan(args)
    except BadServeArgs as e:
        bad_input(str(e))
    from harness_env.server.main import run

    return run(plan)
