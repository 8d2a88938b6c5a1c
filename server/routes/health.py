"""The front page (GET / goes to the web UI), GET /metrics (Prometheus: server/metrics.py), and the
state /health reports (server/openenv_routes.py serves it)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from harness_env.core.sandbox.backends import DEFAULT_BACKEND
from harness_env.core.sandbox.local import bwrap_available
from harness_env.server.metrics import ServerMetrics
from harness_env.server.openenv_routes import ServerState
from harness_env.server.service import RolloutService
from harness_env.server.slots import RolloutSlots


def state_of(slots: RolloutSlots, backend: str) -> ServerState:
    return ServerState(
        harnesses={h.name: h.version for h in RolloutService.list_harnesses()},
        # The local backend says which of its two kinds it is (as its rollouts' sandbox_backend does).
        sandbox_backend=backend if backend != DEFAULT_BACKEND else "bwrap" if bwrap_available() else "plain",
        rollouts_running=slots.running,
        rollouts_queued=slots.queued,
        max_concurrent=slots.max_concurrent,
        max_queue=slots.max_queue,
    )


def front_router() -> APIRouter:
    router = APIRouter()

    @router.get("/", include_in_schema=False)
    async def front(request: Request) -> RedirectResponse:
        """Whoever opens the server's address (a Space's page does) lands on the web UI."""
        return RedirectResponse(request.scope.get("root_path", "") + "/web", status_code=307)

    return router


def metrics_router(metrics: ServerMetrics) -> APIRouter:
    router = APIRouter()

    @router.get("/metrics", include_in_schema=False)
    async def prometheus_metrics(request: Request) -> Response:
        """Prometheus metrics (server/metrics.py); the store is read off the event loop."""
        body, content_type = await asyncio.to_thread(metrics.render, request.headers.get("accept"))
        return Response(body, media_type=content_type)

    return router
