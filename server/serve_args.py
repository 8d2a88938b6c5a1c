"""The flags of `harness-env serve` and of OpenEnv's `server` script (server/main.py), checked into
what to serve: one server (server/main.py `serve`) or Ray Serve replicas (server/ray/serve.py).
The CLI's command (cli_serve.py) and the script share them; they read this process's environment
(HARNESS_ENV_HOST, PORT, ...). Light to import (the CLI builds its parser from these flags for
every command): what checking needs is imported when it runs."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any, NoReturn

DEFAULT_PORT = 8100  # not vLLM's 8000, where the policy usually is
SERVE_HELP = "serve the app: the web UI at /web, MCP at /mcp, POST /rollout, /health, /docs, the capture proxy"
SERVE_EPILOG = """The server answers at:
  /web      the web UI (a token login when the server has one)
  /mcp      MCP over streamable HTTP: tools run_rollout, submit_rollout, get_rollout, list_harnesses, list_tasks, catalog
  /rollout  POST one rollout and wait for it; /rollouts submit, list, watch, cancel jobs; /docs lists the HTTP routes
  /health   liveness and load, open without a token"""


class BadServeArgs(ValueError):
    """A serve flag (or the variable behind it) that cannot work: the message says which and what to do."""


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The serve flags; their defaults read this process's environment."""
    p.add_argument(
        "--host",
        default=os.environ.get("HARNESS_ENV_HOST", "127.0.0.1"),
        help="address to listen on (env HARNESS_ENV_HOST; default: %(default)s; another address needs a token)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("HARNESS_ENV_PORT") or os.environ.get("PORT") or DEFAULT_PORT),
        help=f"port (env HARNESS_ENV_PORT or PORT; default: {DEFAULT_PORT}, beside vLLM's 8000)",
    )
    p.add_argument(
        "--public-url",
        default=os.environ.get("HARNESS_ENV_PUBLIC_URL"),
        help="URL at which sandboxes reach this server (env HARNESS_ENV_PUBLIC_URL; default: http://127.0.0.1:PORT, "
        "on a Hugging Face Space https://$SPACE_HOST)",
    )
    p.add_argument(
        "--token",
        default=os.environ.get("HARNESS_ENV_TOKEN") or None,
        help="require 'Authorization: Bearer TOKEN' (env HARNESS_ENV_TOKEN; default: none, loopback only)",
    )
    p.add_argument(
        "--max-concurrent", type=int, default=None, help="rollouts run at once (env MAX_CONCURRENT_ROLLOUTS; default: 2 x the CPUs this process may use)"
    )
    p.add_argument("--max-queue", type=int, default=None, help="rollouts that may wait beyond those (default: 4 x max-concurrent)")
    p.add_argument(
        "--max-starting",
        type=int,
        default=None,
        help="of the running rollouts, how many may be starting at once (sandbox, setup, harness launch until its first "
        "model call); the rest wait in arrival order (env MAX_STARTING_ROLLOUTS; default: the CPUs this process may use)",
    )
    p.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        default=os.environ.get("HARNESS_ENV_ALLOW_UNAUTHENTICATED") == "1",
        help="serve a non-loopback address without a token (env HARNESS_ENV_ALLOW_UNAUTHENTICATED=1)",
    )
    p.add_argument(
        "--data-dir",
        default=None,
        help="where the job store keeps rollouts (SQLite; env HARNESS_ENV_DATA_DIR; default: /data/harness-env on a Space "
        "with persistent storage, else ~/.local/share/harness-env/data; HARNESS_ENV_STORE_URL=postgresql://... "
        "uses PostgreSQL instead)",
    )
    p.add_argument(
        "--retention-max-age",
        default=None,
        help="remove stored results that ended longer ago, e.g. 30d, 12h (env HARNESS_ENV_RETENTION_MAX_AGE; default: none)",
    )
    p.add_argument(
        "--retention-max-size",
        default=None,
        help="keep stored results under this total, the oldest removed first, e.g. 10GB, 500MB, 0 for no limit "
        "(env HARNESS_ENV_RETENTION_MAX_SIZE; default: 10GB)",
    )
    p.add_argument(
        "--sandbox-backend",
        default=None,
        metavar="NAME",
        help="where rollouts run: a name in the sandbox registry (core/sandbox/backends.py; default $HARNESS_ENV_SANDBOX_BACKEND, else local)",
    )
    ray = p.add_argument_group(
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


class ServeParser(argparse.ArgumentParser):
    """OpenEnv's `server` script's parser: its errors are one line (as the CLI's) and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def serve_parser() -> argparse.ArgumentParser:
    p = ServeParser(prog="server", description=SERVE_HELP, epilog=SERVE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_serve_arguments(p)
    return p


@dataclass(frozen=True)
class OneServer:
    """What server/main.py `serve` is given."""

    host: str
    port: int
    public_url: str | None
    token: str | None
    max_concurrent: int | None
    max_queue: int | None
    max_starting: int | None
    allow_unauthenticated: bool
    data_dir: str | None
    retention: Any  # server/jobs/upkeep.py Retention
    sandbox_backend: str | None


@dataclass(frozen=True)
class OnRay:
    """What server/ray/serve.py `serve_on_ray` is given."""

    host: str
    port: int
    address: str | None
    scale: Any  # server/ray/settings.py Scale
    settings: Any  # server/ray/settings.py ReplicaSettings
    token: str | None


def serve_plan(args: argparse.Namespace) -> OneServer | OnRay:
    """The parsed serve flags, checked: what to serve; BadServeArgs says what cannot work."""
    from harness_env.core.errors import InvalidRequestError
    from harness_env.core.sandbox.backends import BACKEND_VAR, check_backend, default_backend
    from harness_env.server.jobs.upkeep import Retention

    max_starting = args.max_starting
    if max_starting is None and os.environ.get("MAX_STARTING_ROLLOUTS"):
        value = os.environ["MAX_STARTING_ROLLOUTS"]
        if not value.strip().isdigit() or int(value) < 1:
            raise BadServeArgs(f"MAX_STARTING_ROLLOUTS must be a whole number of at least 1, not {value[:40]!r}")
        max_starting = int(value)
    for name, value, least in (("max_concurrent", args.max_concurrent, 1), ("max_queue", args.max_queue, 0), ("max_starting", max_starting, 1)):
        if value is not None and value < least:
            raise BadServeArgs(f"--{name.replace('_', '-')} must be at least {least}, not {value}")
    try:
        retention = Retention.from_env(args.retention_max_age, args.retention_max_size)
    except ValueError as e:
        raise BadServeArgs(str(e)) from None
    try:  # before anything starts: the server would refuse it at start-up, less plainly
        check_backend(args.sandbox_backend or default_backend(), "--sandbox-backend" if args.sandbox_backend else f"${BACKEND_VAR}")
    except InvalidRequestError as e:
        raise BadServeArgs(str(e)) from None
    if args.ray:
        return _on_ray(args)
    ray_flags = [f for f in ("ray_address", "replicas", "min_replicas", "max_replicas") if getattr(args, f) is not None]
    if ray_flags:
        raise BadServeArgs(f"--{ray_flags[0].replace('_', '-')} is a Ray setting: add --ray")
    return OneServer(
        host=args.host,
        port=args.port,
        public_url=args.public_url,
        token=args.token,
        max_concurrent=args.max_concurrent,
        max_queue=args.max_queue,
        max_starting=max_starting,
        allow_unauthenticated=args.allow_unauthenticated,
        data_dir=args.data_dir,
        retention=retention,
        sandbox_backend=args.sandbox_backend,
    )


def _on_ray(args: argparse.Namespace) -> OnRay:
    from harness_env.server.ray.settings import ReplicaSettings, Scale, replica_problem

    problem = check_exposure(args.host, args.token, args.allow_unauthenticated)
    if problem:
        raise BadServeArgs(problem)
    scale = Scale(args.replicas, args.min_replicas, args.max_replicas)
    if (problem := scale.problem()) is not None:
        raise BadServeArgs(problem)
    if args.sandbox_backend is not None:
        raise BadServeArgs("--sandbox-backend names one server's backend: Ray replicas read HARNESS_ENV_SANDBOX_BACKEND from their environment")
    if args.data_dir is not None:
        raise BadServeArgs("--data-dir is a single server's SQLite store: Ray replicas share HARNESS_ENV_STORE_URL=postgresql://...")
    settings = ReplicaSettings(
        public_url=(args.public_url or f"http://127.0.0.1:{args.port}").rstrip("/"),
        token_required=bool(args.token),
        max_concurrent=args.max_concurrent,
        max_queue=args.max_queue,
        retention_max_age=args.retention_max_age,
        retention_max_size=args.retention_max_size,
    )
    if args.ray_address is None and (problem := replica_problem(settings, dict(os.environ), args.token)):
        raise BadServeArgs(problem)  # a local cluster's nodes have this environment: said before Ray starts
    return OnRay(host=args.host, port=args.port, address=args.ray_address, scale=scale, settings=settings, token=args.token)


def check_exposure(host: str, token: str | None, allow_unauthenticated: bool) -> str | None:
    """Why serving would be unsafe, or None."""
    from harness_env.models.base import is_loopback

    if is_loopback(host) or token or allow_unauthenticated:
        return None
    return (
        f"refusing to serve on {host} without a token: anyone who reaches it could run commands on this machine "
        "(rollouts run in the local sandbox). Set HARNESS_ENV_TOKEN (or --token), bind 127.0.0.1, "
        "or pass --allow-unauthenticated if something in front of the server already checks access."
    )


def where_to_go(host: str, port: int, public_url: str | None) -> str:
    """The lines `harness-env serve` prints when it starts (and each deployment on Ray): the addresses of its faces."""
    from harness_env.core.distribution import package_version

    base = public_url or f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    base = base.rstrip("/")
    return "\n".join(
        [
            f"harness-env {package_version()} serving on {host}:{port}",
            f"  web UI     {base}/web",
            f"  MCP        {base}/mcp   (streamable HTTP; tools: run_rollout, submit_rollout, get_rollout, list_harnesses, list_tasks, catalog)",
            f"  HTTP API   {base}/docs",
            f"  health     {base}/health",
        ]
    )
