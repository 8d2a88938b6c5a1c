"""Entry point of `harness-env serve` (and of OpenEnv's `server` script)."""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

import uvicorn

from harness_env.core.distribution import package_version
from harness_env.core.procs import make_undumpable
from harness_env.models.base import is_loopback
from harness_env.server.app import create_app
from harness_env.server.jobs.upkeep import Retention
from harness_env.server.loop_lag import freeze_long_lived
from harness_env.server.store import STORE_URL_VAR, data_dir_problem, default_data_dir

OPEN_FILES_WANTED = 16384  # about 20 descriptors per rollout, for several hundred at once


def check_exposure(host: str, token: str | None, allow_unauthenticated: bool) -> str | None:
    """Why serving would be unsafe, or None."""
    if is_loopback(host) or token or allow_unauthenticated:
        return None
    return (
        f"refusing to serve on {host} without a token: anyone who reaches it could run commands on this machine "
        "(rollouts run in the local sandbox). Set HARNESS_ENV_TOKEN (or --token), bind 127.0.0.1, "
        "or pass --allow-unauthenticated if something in front of the server already checks access."
    )


def default_public_url(port: int, env: dict[str, str]) -> str:
    """Where sandboxes reach this server unless told: on a Hugging Face Space its public https
    address (SPACE_HOST), else loopback."""
    space_host = env.get("SPACE_HOST", "").strip()
    return f"https://{space_host}" if space_host else f"http://127.0.0.1:{port}"


def where_to_go(host: str, port: int, public_url: str | None) -> str:
    """The lines `harness-env serve` prints when it starts: the addresses of its faces."""
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


def raise_open_files_limit() -> str | None:
    """Raise this process's soft limit on open files to its hard limit: every rollout holds
    sockets (the harness's calls, the proxy's upstream calls) and its commands' pipes, and a
    soft limit of 1024 (a common default) refuses new ones at a few hundred rollouts. Returns a
    note when the hard limit itself is low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    elif hard == resource.RLIM_INFINITY and soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, OPEN_FILES_WANTED), hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < OPEN_FILES_WANTED:
        return (
            f"open files are limited to {soft} (ulimit -n); a few hundred concurrent rollouts need more: raise the hard limit to at least {OPEN_FILES_WANTED}"
        )
    return None


def serve(
    *,
    host: str = "127.0.0.1",
    port: int = 8100,
    public_url: str | None = None,
    token: str | None = None,
    max_concurrent: int | None = None,
    max_queue: int | None = None,
    max_starting: int | None = None,
    allow_unauthenticated: bool = False,
    data_dir: str | None = None,
    retention: Retention | None = None,
    sandbox_backend: str | None = None,
) -> int:
    problem = check_exposure(host, token, allow_unauthenticated)
    if problem:
        print(f"harness-env: error: {problem}", file=sys.stderr)
        return 2
    if not os.environ.get(STORE_URL_VAR):
        problem = data_dir_problem(Path(data_dir) if data_dir else default_data_dir())
        if problem:
            print(f"harness-env: error: {problem}", file=sys.stderr)
            return 2
    url = public_url or default_public_url(port, dict(os.environ))
    # Sandboxes on this machine reach the capture proxy over loopback, unless a public URL is given
    # (Harbor's remote sandbox providers need one they can reach).
    capture_url = public_url or f"http://127.0.0.1:{port}"
    app = create_app(
        public_url=url,
        capture_url=capture_url,
        token=token,
        max_concurrent=max_concurrent,
        max_queue=max_queue,
        max_starting=max_starting,
        data_dir=data_dir,
        retention=retention,
        sandbox_backend=sandbox_backend,
    )
    # X-Forwarded-For names the client (for the failed-authentication limit) only when the operator
    # names the proxies that set it (uvicorn's FORWARDED_ALLOW_IPS); uvicorn alone trusts loopback,
    # where any local process could claim to be any address.
    trust_proxy = bool(os.environ.get("FORWARDED_ALLOW_IPS"))
    note = raise_open_files_limit()
    if note:
        print(f"harness-env: warning: {note}", file=sys.stderr)
    make_undumpable()  # the token and keys in this process stay out of reach of its own uid (the plain sandbox's)
    freeze_long_lived()
    print(where_to_go(host, port, public_url or (url if os.environ.get("SPACE_HOST") else None)), file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level=os.environ.get("HARNESS_ENV_LOG_LEVEL", "info"), timeout_graceful_shutdown=10, proxy_headers=trust_proxy)
    return 0


def main() -> None:
    """OpenEnv's `server` entry point: serve with settings from the environment."""
    from harness_env.cli import main as cli_main

    raise SystemExit(cli_main(["serve", *sys.argv[1:]]))
