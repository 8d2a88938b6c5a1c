"""The FastAPI app factory: one app, one port.

Routes: POST /rollout, /rollouts (jobs: server/jobs/routes.py), GET /metrics (Prometheus:
server/metrics.py), GET /harnesses, GET /<harness>/tasks?dataset=&split= (a dataset's tasks,
as a harness that brings its own lists them), GET /catalog, GET /health, /metadata and /schema
(OpenEnv's, server/openenv_routes.py), /docs (served offline, server/docs_page.py), /mcp (MCP over
streamable HTTP, also OpenEnv's MCPToolClient), /ws (OpenEnv's session socket), /capture/v1 (the
capture proxy, where sandboxes reach the policy), /web (the Gradio UI); server/routes/ holds them by
subject, and create_app assembles them with the runner (core/runner.py), the job manager and the
lifespan (server/lifespan.py). Bad arguments answer 422,
a component the server lacks (e.g. the Harbor extra) 501, a full queue 429, a body over 32 MB 413
(counted as it arrives, so a chunked body is cut off too). No error answer echoes the request. No
state is shared between requests beyond what one rollout owns (and the failed-authentication
counts of server/auth.py) and the job store, which replicas behind a load balancer share when it
is PostgreSQL.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fastapi import FastAPI

from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.redact import register_secret
from harness_env.core.catalog import url_credentials
from harness_env.core.cpus import available_cpus
from harness_env.core.distribution import package_version
from harness_env.core.engine import CaptureAccess
from harness_env.core.registry import HARNESSES
from harness_env.core.runner import Runner
from harness_env.core.sandbox.backends import SandboxSettings, default_backend, sandbox_factory
from harness_env.server.auth import AuthFailureLimiter, TokenAuth, origin_of
from harness_env.server.body_limit import limit_body
from harness_env.server.docs_page import add_docs_routes
from harness_env.server.jobs.manager import JobManager
from harness_env.server.jobs.routes import add_job_routes
from harness_env.server.jobs.upkeep import Retention
from harness_env.server.lifespan import lifespan_of
from harness_env.server.log_secrets import mask_secrets_in_logs
from harness_env.server.metrics import ServerMetrics, log_rollouts_to_stderr
from harness_env.server.openenv_routes import DESCRIPTION, add_openenv_routes
from harness_env.server.routes import catalog, health
from harness_env.server.routes.capture import CAPTURE_PREFIX, capture_first
from harness_env.server.routes.errors import add_error_handlers
from harness_env.server.routes.rollout import rollout_router
from harness_env.server.service import RolloutService
from harness_env.server.slots import RolloutSlots
from harness_env.server.store import default_data_dir, store_password, store_url
from harness_env.server.tasks_routes import add_task_routes
from harness_env.server.weights import add_weight_routes

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
ALLOWED_ORIGINS_VAR = "HARNESS_ENV_ALLOWED_ORIGINS"  # pages of other origins that may call the server


def default_max_concurrent() -> int:
    """MAX_CONCURRENT_ROLLOUTS, else twice the CPUs this process may use (its affinity and cgroup
    quota, not the host's count a container reports): a rollout mostly waits on the model."""
    return int(os.environ.get("MAX_CONCURRENT_ROLLOUTS") or max(2, available_cpus() * 2))


def default_max_starting() -> int:
    """MAX_STARTING_ROLLOUTS, else the CPUs this process may use: a harness's start-up is mostly
    CPU (Node's is about a CPU-second), so one per CPU keeps them busy without slowing each other."""
    return int(os.environ.get("MAX_STARTING_ROLLOUTS") or available_cpus())


def api_description() -> str:
    """/docs' description: what the server is, its harnesses (the registry's, so the list cannot go
    stale) and its surfaces beyond the operations listed."""
    return (
        f"{DESCRIPTION}\n\nHarnesses: {', '.join(sorted(HARNESSES))} (`GET /harnesses`: installed versions).\n\n"
        "- `POST /rollout` runs one rollout and answers with its result; `POST /rollouts` queues one as a job "
        "(`GET /rollouts/{id}`, its events, `DELETE` cancels), kept in the job store.\n"
        "- `/web`: the web UI (run a rollout and watch it live; stored rollouts, their token view; compare two rollouts).\n"
        "- `/mcp`: the same tools for agents (MCP, streamable HTTP); `/ws`: OpenEnv's WebSocket.\n"
        "- `PUT /policy/weights`: a trainer announces its weight version; `/metrics`: Prometheus."
    )


def register_server_secrets(token: str | None) -> None:
    """Masked by the capture proxy in everything it passes back or records: the token, and every
    credential-looking variable of the server (catalog and judge keys, provider tokens); and in any
    encoding, with capture keys, in every log line (server/log_secrets.py)."""
    env = dict(os.environ)
    for secret in (token, *(v for k, v in env.items() if SECRET_NAME.search(k)), store_password(), *url_credentials(env)):
        register_secret(secret)
    mask_secrets_in_logs()


def create_app(
    *,
    public_url: str,
    capture_url: str | None = None,
    token: str | None = None,
    max_concurrent: int | None = None,
    max_queue: int | None = None,
    max_starting: int | None = None,
    sandbox_backend: str | None = None,
    sandbox_settings: SandboxSettings | None = None,
    data_dir: str | os.PathLike | None = None,
    retention: Retention | None = None,
):
    """`data_dir`: where the job store's SQLite file is (default: server/store/location.py);
    $HARNESS_ENV_STORE_URL names another store (PostgreSQL) instead. `retention`: how long and how
    much is kept (default: from the environment). `sandbox_backend`: a name in the sandbox registry
    (core/sandbox/backends.py; default $HARNESS_ENV_SANDBOX_BACKEND, else local), made with
    `sandbox_settings` (default: the backend's own); an unknown name is refused here, at start."""
    register_server_secrets(token)
    proxy = CaptureProxy()
    concurrent = max_concurrent or default_max_concurrent()
    slots = RolloutSlots(concurrent, max_queue if max_queue is not None else concurrent * 4, max_starting or default_max_starting())
    # Where sandboxes reach the capture proxy: the public URL unless told (a Space's public address
    # is its front door, which would turn away the sandboxes' per-rollout keys of a private Space).
    capture = CaptureAccess(proxy, (capture_url or public_url).rstrip("/") + CAPTURE_PREFIX + "/v1")
    backend = sandbox_backend or default_backend()
    runner = Runner(capture, sandbox_factory(backend, sandbox_settings or SandboxSettings()), start_gate=slots.starting, places=slots)
    # Every rollout is a job in the store, opened when the app starts (nothing is written before).
    jobs = JobManager(runner, slots, store_url(Path(data_dir) if data_dir else default_data_dir()))
    service = RolloutService(jobs)
    metrics = ServerMetrics(slots, jobs)  # this app's own registry: /metrics
    jobs.on_end = metrics.rollout_ended
    log_rollouts_to_stderr()

    from harness_env.server.mcp.tools import build_mcp
    from harness_env.server.web import WebUI

    mcp = build_mcp(service, jobs)
    closing: list = []  # the web UI's, once it exists
    lifespan = lifespan_of(proxy, runner, jobs, mcp, metrics, retention or Retention.from_env(), closing)
    # /docs is served from the package (server/docs_page.py), not FastAPI's CDN page; no ReDoc.
    app = FastAPI(title="harness-env", version=package_version(), lifespan=lifespan, description=api_description(), docs_url=None, redoc_url=None)
    add_error_handlers(app)
    app.include_router(health.front_router())
    add_openenv_routes(app, lambda: health.state_of(slots, backend))  # /health, /metadata, /schema
    add_docs_routes(app, app.title)
    app.include_router(rollout_router(service))
    add_job_routes(app, jobs)  # POST/GET /rollouts, GET /rollouts/{id}[/events], DELETE /rollouts/{id}
    add_task_routes(app, service)  # GET /tasks?harness= (server/tasks_routes.py)
    add_weight_routes(app, proxy.weights)  # PUT/GET /policy/weights (server/weights.py)
    app.include_router(health.metrics_router(metrics))
    app.include_router(catalog.router)
    mcp.mount(app)  # /capture is not mounted here: capture_first sends it to the proxy first
    limiter = AuthFailureLimiter()  # shared by the bearer/cookie/socket checks and the login form
    web = WebUI(app, service, token, limiter)  # the Gradio UI at /web, loaded on first use
    closing.append(web.aclose)
    origins = [origin_of(public_url), *(origin_of(o.strip()) for o in os.environ.get(ALLOWED_ORIGINS_VAR, "").split(",") if o.strip())]
    return capture_first(proxy.app, TokenAuth(limit_body(web.wrap(app), larger=web.body_limits()), token, own_origins=origins, limiter=limiter))


def __getattr__(name: str):
    """`harness_env.server.app:app` for ASGI servers and OpenEnv: built from the environment."""
    if name == "app":
        # As `harness-env serve` reads them; 8000 is uvicorn's own default port.
        port = os.environ.get("HARNESS_ENV_PORT") or os.environ.get("PORT") or "8000"
        return create_app(public_url=os.environ.get("HARNESS_ENV_PUBLIC_URL") or f"http://127.0.0.1:{port}", token=os.environ.get("HARNESS_ENV_TOKEN") or None)
    raise AttributeError(name)


def main() -> None:
    """OpenEnv's `server/app.py` entry point: `harness-env serve`'s flags (server/main.py)."""
    from harness_env.server.main import main as serve_main

    serve_main()


if __name__ == "__main__":
    main()
