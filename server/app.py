"""The FastAPI app factory: one app, one port.

Routes: POST /rollout, /rollouts (jobs: server/jobs/routes.py), GET /metrics (Prometheus:
server/metrics.py), GET /harnesses, GET /<harness>/tasks?dataset=&split= (a dataset's tasks,
as a harness that brings its own lists them), GET /catalog, GET /health, /metadata and /schema
(OpenEnv's, server/openenv_routes.py), /docs (served offline, server/docs_page.py), /mcp (MCP over
streamable HTTP, also OpenEnv's MCPToolClient), /ws (OpenEnv's session socket), /capture/v1 (the
capture proxy, where sandboxes reach the policy), /web (the Gradio UI). Bad arguments answer 422,
a component the server lacks (e.g. the Harbor extra) 501, a full queue 429, a body over 32 MB 413
(counted as it arrives, so a chunked body is cut off too). No error answer echoes the request. No
state is shared between requests beyond what one rollout owns (and the failed-authentication
counts of server/auth.py) and the job store, which replicas behind a load balancer share when it
is PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response

from harness_env.core.capture.asgi import Receive, Scope, Send, error_reply, header, route_path, send_reply
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.redact import register_secret
from harness_env.core.capture.serve import serve_on_unix
from harness_env.core.capture.sockets import capture_socket_path
from harness_env.core.catalog import url_credentials
from harness_env.core.cpus import available_cpus
from harness_env.core.distribution import package_version
from harness_env.core.errors import InvalidRequestError, ToolMissingError, safe_text
from harness_env.core.registry import HARNESSES
from harness_env.core.sandbox.backends import DEFAULT_BACKEND, default_backend
from harness_env.core.sandbox.local import bwrap_available
from harness_env.core.sandbox.sweep import sweep_at_start
from harness_env.models import DatasetTaskInfo, HarnessInfo, RolloutArgs, RolloutResult
from harness_env.server.auth import AuthFailureLimiter, TokenAuth, origin_of
from harness_env.server.docs_page import add_docs_routes
from harness_env.server.jobs.manager import JobManager, JobService
from harness_env.server.jobs.routes import add_job_routes
from harness_env.server.jobs.upkeep import Retention, recover, upkeep
from harness_env.server.log_secrets import mask_secrets_in_logs
from harness_env.server.metrics import ServerMetrics, log_rollouts_to_stderr
from harness_env.server.openenv_routes import DESCRIPTION, ServerState, add_openenv_routes
from harness_env.server.slots import RolloutSlots, ServerBusy
from harness_env.server.store import default_data_dir, store_password, store_url
from harness_env.server.weights import add_weight_routes

CAPTURE_PREFIX = "/capture"
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_DETAIL_CHARS = 20_000
ALLOWED_ORIGINS_VAR = "HARNESS_ENV_ALLOWED_ORIGINS"  # pages of other origins that may call the server


def default_max_concurrent() -> int:
    """MAX_CONCURRENT_ROLLOUTS, else twice the CPUs this process may use (its affinity and cgroup
    quota, not the host's count a container reports): a rollout mostly waits on the model."""
    return int(os.environ.get("MAX_CONCURRENT_ROLLOUTS") or max(2, available_cpus() * 2))


def default_max_starting() -> int:
    """MAX_STARTING_ROLLOUTS, else the CPUs this process may use: a harness's start-up is mostly
    CPU (Node's is about a CPU-second), so one per CPU keeps them busy without slowing each other."""
    return int(os.environ.get("MAX_STARTING_ROLLOUTS") or available_cpus())


async def _cancel_on_disconnect(request: Request, task: asyncio.Task) -> None:
    """A client that goes away cancels its rollout (whose clean-up then runs). The body has been
    read, so the server's next message for this request is its disconnect: awaited, not polled (a
    poll every quarter second per rollout was a tenth of the event loop's work at 256 rollouts)."""
    while not task.done():
        if (await request.receive())["type"] == "http.disconnect":
            task.cancel()
            return


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


def create_app(
    *,
    public_url: str,
    capture_url: str | None = None,
    token: str | None = None,
    max_concurrent: int | None = None,
    max_queue: int | None = None,
    max_starting: int | None = None,
    use_bwrap: bool | None = None,
    sandbox_backend: str | None = None,
    data_dir: str | os.PathLike | None = None,
    retention: Retention | None = None,
):
    """`data_dir`: where the job store's SQLite file is (default: server/store/location.py);
    $HARNESS_ENV_STORE_URL names another store (PostgreSQL) instead. `retention`: how long and how
    much is kept (default: from the environment). `sandbox_backend`: a name in the sandbox registry
    (core/sandbox/backends.py; default $HARNESS_ENV_SANDBOX_BACKEND, else local)."""
    # Masked by the capture proxy in everything it passes back or records: the token, and every
    # credential-looking variable of the server (catalog and judge keys, provider tokens).
    env = dict(os.environ)
    for secret in (token, *(v for k, v in env.items() if SECRET_NAME.search(k)), store_password(), *url_credentials(env)):
        register_secret(secret)
    mask_secrets_in_logs()  # the same secrets, and capture keys, in any encoding, in every log line (server/log_secrets.py)
    proxy = CaptureProxy()
    concurrent = max_concurrent or default_max_concurrent()
    slots = RolloutSlots(concurrent, max_queue if max_queue is not None else concurrent * 4, max_starting or default_max_starting())
    # Where sandboxes reach the capture proxy: the public URL unless told (a Space's public address
    # is its front door, which would turn away the sandboxes' per-rollout keys of a private Space).
    capture_base = (capture_url or public_url).rstrip("/") + CAPTURE_PREFIX + "/v1"
    backend = sandbox_backend or default_backend()
    service = JobService(proxy, capture_base, slots, use_bwrap, backend)
    # Every rollout is a job in the store, opened when the app starts (nothing is written before).
    jobs = service.jobs = JobManager(service, store_url(Path(data_dir) if data_dir else default_data_dir()))
    retention = retention or Retention.from_env()
    metrics = ServerMetrics(slots, jobs)  # this app's own registry: /metrics
    jobs.on_end = metrics.rollout_ended
    log_rollouts_to_stderr()

    from harness_env.server.mcp.tools import build_mcp
    from harness_env.server.web import WebUI

    mcp = build_mcp(service, jobs)
    web: WebUI | None = None

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        # What killed servers and runs left: cgroups, rollout directories and their mounts,
        # capture sockets. Here, not in the CLI, so every start sweeps: `serve`, OpenEnv's
        # `harness_env.server.app:app`, each Ray replica (Ray Serve runs this lifespan).
        # Printed as `run` prints them: a library's root handler can swallow a logger's warning.
        for note in await asyncio.to_thread(sweep_at_start):
            print(f"harness-env: {note}", file=sys.stderr, flush=True)
        async with serve_on_unix(proxy.app, capture_socket_path()) as socket_path, mcp.lifespan():
            service.capture_socket = socket_path
            await jobs.start()
            await recover(jobs)  # what a dead server left running: interrupted, its sandboxes removed
            keeper = asyncio.create_task(upkeep(jobs, retention))
            metrics.loop_lag.start()
            try:
                yield
            finally:
                await metrics.loop_lag.stop()
                keeper.cancel()
                await jobs.stop()  # running jobs are interrupted and cleaned up while the proxy still serves
                service.capture_socket = None
        if web is not None:
            await web.aclose()
        await proxy.aclose()

    # /docs is served from the package (server/docs_page.py), not FastAPI's CDN page; no ReDoc.
    app = FastAPI(title="harness-env", version=package_version(), lifespan=lifespan, description=api_description(), docs_url=None, redoc_url=None)
    app.state.service = service
    app.state.jobs = jobs

    @app.exception_handler(RequestValidationError)
    async def _unvalidated(_r: Request, e: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer echoes each bad `input` (up to the whole body; NaN or a lone
        # surrogate, which JSON cannot carry, made it a 500): where and what only.
        return JSONResponse({"detail": [validation_problem(err) for err in e.errors()]}, status_code=422)

    @app.exception_handler(InvalidRequestError)
    async def _invalid(_r: Request, e: InvalidRequestError) -> JSONResponse:
        return JSONResponse({"detail": safe_text(str(e), MAX_DETAIL_CHARS)}, status_code=422)

    @app.exception_handler(ToolMissingError)
    async def _missing(_r: Request, e: ToolMissingError) -> JSONResponse:
        return JSONResponse({"detail": safe_text(str(e), MAX_DETAIL_CHARS)}, status_code=501)

    @app.exception_handler(ServerBusy)
    async def _busy(_r: Request, e: ServerBusy) -> JSONResponse:
        return JSONResponse({"detail": safe_text(str(e), MAX_DETAIL_CHARS)}, status_code=429)

    @app.get("/", include_in_schema=False)
    async def front(request: Request) -> RedirectResponse:
        """Whoever opens the server's address (a Space's page does) lands on the web UI."""
        return RedirectResponse(request.scope.get("root_path", "") + "/web", status_code=307)

    def server_state() -> ServerState:
        return ServerState(
            harnesses={h.name: h.version for h in service.list_harnesses()},
            # The local backend says which of its two kinds it is (as its rollouts' sandbox_backend does).
            sandbox_backend=backend if backend != DEFAULT_BACKEND else "bwrap" if bwrap_available() else "plain",
            rollouts_running=slots.running,
            rollouts_queued=slots.queued,
            max_concurrent=slots.max_concurrent,
            max_queue=slots.max_queue,
        )

    add_openenv_routes(app, server_state)  # /health, /metadata, /schema
    add_docs_routes(app, app.title)

    @app.post("/rollout", response_model=RolloutResult)
    async def rollout(args: RolloutArgs, request: Request) -> Response:
        """Run one rollout; the result always comes back (failures are in `error`)."""
        resolved = await asyncio.to_thread(service.resolve, args)  # a Harbor dataset is read from disk
        task = asyncio.create_task(service.run(resolved))
        watcher = asyncio.create_task(_cancel_on_disconnect(request, task))
        try:
            result = await task
        finally:
            watcher.cancel()
        # A result with its captured turns weighs megabytes: serialised once, off the event loop
        # (FastAPI's response_model path would validate and encode it again on the loop).
        return Response(await asyncio.to_thread(result.model_dump_json), media_type="application/json")

    add_job_routes(app, jobs)  # POST/GET /rollouts, GET /rollouts/{id}[/events], DELETE /rollouts/{id}
    add_weight_routes(app, proxy.weights)  # PUT/GET /policy/weights (server/weights.py)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics(request: Request) -> Response:
        """Prometheus metrics (server/metrics.py); the store is read off the event loop."""
        body, content_type = await asyncio.to_thread(metrics.render, request.headers.get("accept"))
        return Response(body, media_type=content_type)

    @app.get("/harnesses", response_model=list[HarnessInfo])
    async def harnesses() -> list[HarnessInfo]:
        return service.list_harnesses()

    @app.get("/{harness}/tasks", response_model=list[DatasetTaskInfo])
    def harness_tasks(
        harness: str = PathParam(max_length=64, description="a harness that brings tasks of its own (GET /harnesses)"),
        dataset: str = Query("", max_length=1024, description="dataset directory, relative to the harness's tasks root (empty: that root)"),
        split: str | None = Query(None, max_length=128, description="a subdirectory of the dataset"),
    ) -> list[DatasetTaskInfo]:
        """The tasks of a dataset as the harness lists them (its `list_tasks`), in the order its
        task index counts them; 404 for an unknown harness, 422 for one that brings none."""
        if harness not in HARNESSES:
            raise HTTPException(404, f"no harness {harness[:64]!r}")
        return service.list_tasks(dataset, split or None, harness)  # a plain def: FastAPI runs it off the event loop

    @app.get("/catalog")
    async def catalog() -> list[dict]:
        return service.catalog()

    mcp.mount(app)  # /capture is not mounted here: capture_first sends it to the proxy first
    limiter = AuthFailureLimiter()  # shared by the bearer/cookie/socket checks and the login form
    web = WebUI(app, service, token, limiter)  # the Gradio UI at /web, loaded on first use
    origins = [origin_of(public_url), *(origin_of(o.strip()) for o in os.environ.get(ALLOWED_ORIGINS_VAR, "").split(",") if o.strip())]
    return capture_first(proxy.app, TokenAuth(limit_body(web.wrap(app), larger=web.body_limits()), token, own_origins=origins, limiter=limiter))


def capture_first(proxy_app, app):
    """`app`, with /capture/... sent straight to the capture proxy: it authenticates harnesses by
    their capture key and bounds its own bodies (the API's token, origin and body checks exempt it
    anyway), and a model call should not pay the API's middleware and FastAPI's stack every turn."""
    prefix = CAPTURE_PREFIX + "/"

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            below = route_path(scope)
            if below.startswith(prefix):
                root = scope.get("root_path", "") + CAPTURE_PREFIX
                await proxy_app({**scope, "root_path": root, "path": root + below[len(CAPTURE_PREFIX) :]}, receive, send)
                return
        await app(scope, receive, send)

    return dispatch


def validation_problem(err: dict) -> dict:
    """One of FastAPI's validation errors without its `input`, `ctx` and `url`, in JSON-safe text."""
    return {
        "type": err.get("type", ""),
        "loc": [x if isinstance(x, int) else safe_text(str(x), 200) for x in err.get("loc", ())],
        "msg": safe_text(str(err.get("msg", "")), 2000),
    }


def _too_large(limit: int):
    reply = error_reply(413, f"request body over {limit} bytes; send less (files and commands have their own limits)", "request_too_large")
    # The rest of the body is not read: the connection closes after this answer.
    reply.headers.append((b"connection", b"close"))
    return reply


def limit_body(app, limit: int = MAX_BODY_BYTES, larger: dict[str, int] | None = None):
    """Refuse request bodies over `limit` bytes (/capture never gets here: capture_first hands it to
    the proxy, which bounds its own): a declared content-length at once, a chunked body as soon as it passes the limit. Then
    the client gets 413, the app sees a disconnect, and nothing it answers after is sent. `larger`: the
    exact paths that take more, with their own limit (the web UI's file upload)."""
    larger = larger or {}

    async def limited(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        limit_here = larger.get(scope.get("path", ""), limit)
        await bounded(scope, receive, send, limit_here)

    async def bounded(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        declared = header(scope, b"content-length") or ""
        if declared.isdigit() and int(declared) > limit:
            await send_reply(send, _too_large(limit))
            return
        received, refused, started = 0, False, False

        async def counted() -> dict:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    refused = True
                    if not started:
                        await send_reply(send, _too_large(limit))
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: dict) -> None:
            nonlocal started
            if refused:
                return  # the client has its 413
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await app(scope, counted, guarded)
        except Exception:
            if not refused:
                raise  # only a failure on the body cut short is expected here, and answered

    return limited


def __getattr__(name: str):
    """`harness_env.server.app:app` for ASGI servers and OpenEnv: built from the environment."""
    if name == "app":
        # As `harness-env serve` reads them; 8000 is uvicorn's own default port.
        port = os.environ.get("HARNESS_ENV_PORT") or os.environ.get("PORT") or "8000"
        return create_app(public_url=os.environ.get("HARNESS_ENV_PUBLIC_URL") or f"http://127.0.0.1:{port}", token=os.environ.get("HARNESS_ENV_TOKEN") or None)
    raise AttributeError(name)


def main() -> None:
    from harness_env.server.main import main as serve_main

    serve_main()


if __name__ == "__main__":
    main()
