"""POST /rollout: one rollout, called; the caller waits for its result, and going away cancels it."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response

from harness_env.core.runner import resolve
from harness_env.models import RolloutArgs, RolloutResult
from harness_env.server.service import RolloutService


async def _cancel_on_disconnect(request: Request, task: asyncio.Task) -> None:
    """A client that goes away cancels its rollout (whose clean-up then runs). The body has been
    read, so the server's next message for this request is its disconnect: awaited, not polled (a
    poll every quarter second per rollout was a tenth of the event loop's work at 256 rollouts)."""
    while not task.done():
        if (await request.receive())["type"] == "http.disconnect":
            task.cancel()
            return


def rollout_router(service: RolloutService) -> APIRouter:
    router = APIRouter()

    @router.post("/rollout", response_model=RolloutResult)
    async def rollout(args: RolloutArgs, request: Request) -> Response:
        """Run one rollout; the result always comes back (failures are in `error`)."""
        prepared = await asyncio.to_thread(resolve, args, trusted=False)  # a Harbor dataset is read from disk
        task = asyncio.create_task(service.run(prepared))
        watcher = asyncio.create_task(_cancel_on_disconnect(request, task))
        try:
            result = await task
        finally:
            watcher.cancel()
        # A result with its captured turns weighs megabytes: serialised once, off the event loop
        # (FastAPI's response_model path would validate and encode it again on the loop).
        return Response(await asyncio.to_thread(result.model_dump_json), media_type="application/json")

    return router
