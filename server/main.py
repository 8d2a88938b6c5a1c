"""One server (what `harness-env serve` and OpenEnv's `server` script run without --ray), and the
`server` script itself: serve_args.py's flags, then `run`. It imports nothing of the CLI: the CLI's
`serve` (cli_serve.py) calls in here, never the other way."""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

import uvicorn

from harness_env.core.procs import make_undumpable
from harness_env.server.app import create_app
from harness_env.server.jobs.upkeep import Retention
from harness_env.server.loop_lag import freeze_long_lived
from harness_env.server.serve_args import BadServeArgs, OneServer, OnRay, check_exposure, serve_parser, serve_plan, where_to_go
from harness_env.server.store import STORE_URL_VAR, data_dir_problem, default_data_dir

OPEN_FILES_WANTED = 16384  # about 20 descriptors per rollout, for several hundred at once


def default_public_url(port: int, env: dict[str, str]) -> str:
    """Where sandboxes reach this server unless told: on a Hugging Face Space its public https
    address (SPACE_HOST), else loopback."""
    space_host = env.get("SPACE_HOST", "").strip()
    return f"https://{space_host}" if space_host else f"http://127.0.0.1:{port}"


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


def run(plan: OneServer | OnRay) -> int:
    """Serve what the checked flags say (server/serve_args.py); the exit code."""
    if isinstance(plan, OneServer):
        return serve(**vars(plan))
    try:
        from harness_env.server.ray.serve import serve_on_ray
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "ray":
            raise
        print("harness-env: error: --ray needs Ray Serve: install the ray extra (pip install 'harness-env[ray]'; ./dev test installs it)", file=sys.stderr)
        return 2
    return serve_on_ray(**vars(plan))


def main(argv: list[str] | None = None) -> None:
    """OpenEnv's `server` entry point: `harness-env serve`'s flags, defaults from the environment."""
    args = serve_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        plan = serve_plan(args)
    except BadServeArgs as e:
        print(f"harness-env: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(run(plan))
