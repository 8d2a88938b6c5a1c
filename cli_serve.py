"""`harness-env serve`: its parser and handler. The app itself is server/main.py's (one server) or
server/ray/serve.py's (Ray Serve replicas); both are imported only when the command runs, so that
other commands do not load the server.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from harness_env.cli_flags import bad_input

DEFAULT_PORT = 8100  # not vLLM's 8000, where the policy usually is
SERVE_EPILOG = """The server answers at:
  /web      the web UI (a token login when the server has one)
  /mcp      MCP over streamable HTTP: tools run_rollout, submit_rollout, get_rollout, list_harnesses, list_tasks, catalog
  /rollout  POST one rollout and wait for it; /rollouts submit, list, watch, cancel jobs; /docs lists the HTTP routes
  /health   liveness and load, open without a token"""


def add_serve_parser(sub: Any) -> None:
    """The serve command; its defaults read this process's environment (HARNESS_ENV_HOST, PORT, ...)."""
    srv = sub.add_parser(
        "serve",
        help="serve the app: the web UI at /web, MCP at /mcp, POST /rollout, /health, /docs, the capture proxy",
        epilog=SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    srv.add_argument(
        "--host",
        default=os.environ.get("HARNESS_ENV_HOST", "127.0.0.1"),
        help="address to listen on (env HARNESS_ENV_HOST; default: %(default)s; another address needs a token)",
    )
    srv.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("HARNESS_ENV_PORT") or os.environ.get("PORT") or DEFAULT_PORT),
        help=f"port (env HARNESS_ENV_PORT or PORT; default: {DEFAULT_PORT}, beside vLLM's 8000)",
    )
    srv.add_argument(
        "--public-url",
        default=os.environ.get("HARNESS_ENV_PUBLIC_URL"),
        help="URL at which sandboxes reach this server (env HARNESS_ENV_PUBLIC_URL; default: http://127.0.0.1:PORT, "
        "on a Hugging Face Space https://$SPACE_HOST)",
    )
    srv.add_argument(
        "--token",
        default=os.environ.get("HARNESS_ENV_TOKEN") or None,
        help="require 'Authorization: Bearer TOKEN' (env HARNESS_ENV_TOKEN; default: none, loopback only)",
    )
    srv.add_argument(
        "--max-concurrent", type=int, default=None, help="rollouts run at once (env MAX_CONCURRENT_ROLLOUTS; default: 2 x the CPUs this process may use)"
    )
    srv.add_argument("--max-queue", type=int, default=None, help="rollouts that may wait beyond those (default: 4 x max-concurrent)")
    srv.add_argument(
        "--max-starting",
        type=int,
        default=None,
        help="of the running rollouts, how many may be starting at once (sandbox, setup, harness launch until its first "
        "model call); the rest wait in arrival order (env MAX_STARTING_ROLLOUTS; default: the CPUs this process may use)",
    )
    srv.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        default=os.environ.get("HARNESS_ENV_ALLOW_UNAUTHENTICATED") == "1",
        help="serve a non-loopback address without a token (env HARNESS_ENV_ALLOW_UNAUTHENTICATED=1)",
    )
    srv.add_argument(
        "--data-dir",
        default=None,
        help="where the job store keeps rollouts (SQLite; env HARNESS_ENV_DATA_DIR; default: /data/harness-env on a Space "
        "with persistent storage, else ~/.local/share/harness-env/data; HARNESS_ENV_STORE_URL=postgresql://... "
        "uses PostgreSQL instead)",
    )
    srv.add_argument(
        "--retention-max-age",
        default=None,
        help="remove stored results that ended longer ago, e.g. 30d, 12h (env HARNESS_ENV_RETENTION_MAX_AGE; default: none)",
    )
    srv.add_argument(
        "--retention-max-size",
        default=None,
        help="keep stored results under this total, the oldest removed first, e.g. 10GB, 500MB, 0 for no limit "
        "(env HARNESS_ENV_RETENTION_MAX_SIZE; default: 10GB)",
    )
    srv.add_argument(
        "--sandbox-backend",
        default=None,
        metavar="NAME",
        help="where rollouts run: a name in the sandbox registry (core/sandbox/backends.py; default $HARNESS_ENV_SANDBOX_BACKEND, else local)",
    )
    ray = srv.add_argument_group(
        "Ray",
        "serve the same app as a Ray Serve application: replicas, each with its own engine, capture "
        "proxy and sandboxes, sharing a PostgreSQL store ($HARNESS_ENV_STORE_URL); needs the ray extra",
    )
    ray.add_argument("--ray", action="store_true", help="deploy on Ray Serve (a local Ray cluster unless --ray-address)")
    ray.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="a running Ray cluster: host:port of its head's GCS (RAY_ADDRESS is not read; default: start a local cluster)",
    )
    ray.add_argument("--replicas", type=int, default=None, metavar="N", help="a fixed number of replicas (default: 1)")
    ray.add_argument(
        "--min-replicas", type=int, default=None, metavar="A", help="autoscaling on ongoing requests: at least A replicas (default: none, a fixed count)"
    )
    ray.add_argument("--max-replicas", type=int, default=None, metavar="B", help="autoscaling: at most B replicas (default: none, a fixed count)")
    srv.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from harness_env.server.main import serve

    if args.max_starting is None and os.environ.get("MAX_STARTING_ROLLOUTS"):
        value = os.environ["MAX_STARTING_ROLLOUTS"]
        if not value.strip().isdigit() or int(value) < 1:
            bad_input(f"MAX_STARTING_ROLLOUTS must be a whole number of at least 1, not {value[:40]!r}")
        args.max_starting = int(value)
    for name, least in (("max_concurrent", 1), ("max_queue", 0), ("max_starting", 1)):
        value = getattr(args, name)
        if value is not None and value < least:
            bad_input(f"--{name.replace('_', '-')} must be at least {least}, not {value}")
    from harness_env.server.jobs.upkeep import Retention

    try:
        retention = Retention.from_env(args.retention_max_age, args.retention_max_size)
    except ValueError as e:
        bad_input(str(e))
    from harness_env.core.errors import InvalidRequestError
    from harness_env.core.sandbox.backends import BACKEND_VAR, check_backend, default_backend

    try:  # before anything starts: the server would refuse it at start-up, less plainly
        check_backend(args.sandbox_backend or default_backend(), "--sandbox-backend" if args.sandbox_backend else f"${BACKEND_VAR}")
    except InvalidRequestError as e:
        bad_input(str(e))
    ray_flags = [f for f in ("ray_address", "replicas", "min_replicas", "max_replicas") if getattr(args, f) is not None]
    if args.ray:
        return _serve_on_ray(args)
    if ray_flags:
        bad_input(f"--{ray_flags[0].replace('_', '-')} is a Ray setting: add --ray")
    return serve(
        host=args.host,
        port=args.port,
        public_url=args.public_url,
        token=args.token,
        max_concurrent=args.max_concurrent,
        max_queue=args.max_queue,
        max_starting=args.max_starting,
        allow_unauthenticated=args.allow_unauthenticated,
        data_dir=args.data_dir,
        retention=retention,
        sandbox_backend=args.sandbox_backend,
    )


def _serve_on_ray(args: argparse.Namespace) -> int:
    from harness_env.server.main import check_exposure
    from harness_env.server.ray.settings import ReplicaSettings, Scale, replica_problem

    problem = check_exposure(args.host, args.token, args.allow_unauthenticated)
    if problem:
        bad_input(problem)
    scale = Scale(args.replicas, args.min_replicas, args.max_replicas)
    if (problem := scale.problem()) is not None:
        bad_input(problem)
    if args.sandbox_backend is not None:
        bad_input("--sandbox-backend names one server's backend: Ray replicas read HARNESS_ENV_SANDBOX_BACKEND from their environment")
    if args.data_dir is not None:
        bad_input("--data-dir is a single server's SQLite store: Ray replicas share HARNESS_ENV_STORE_URL=postgresql://...")
    settings = ReplicaSettings(
        public_url=(args.public_url or f"http://127.0.0.1:{args.port}").rstrip("/"),
        token_required=bool(args.token),
        max_concurrent=args.max_concurrent,
        max_queue=args.max_queue,
        retention_max_age=args.retention_max_age,
        retention_max_size=args.retention_max_size,
    )
    if args.ray_address is None and (problem := replica_problem(settings, dict(os.environ), args.token)):
        bad_input(problem)  # a local cluster's nodes have this environment: said before Ray starts
    try:
        from harness_env.server.ray.serve import serve_on_ray
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "ray":
            raise
        bad_input("--ray needs Ray Serve: install the ray extra (pip install 'harness-env[ray]'; ./dev test installs it)")
    return serve_on_ray(host=args.host, port=args.port, address=args.ray_address, scale=scale, settings=settings, token=args.token)
