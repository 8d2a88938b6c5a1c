"""The HTTP face of jobs: POST /rollouts (submit: 202 and an id), GET /rollouts (list, newest
first, filtered and paged), GET /rollouts/{id} (status, phases, the result once it ended),
GET /rollouts/{id}/events (Server-Sent Events: replay, then follow, ending with the job) and
DELETE /rollouts/{id} (cancel)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import FastAPI, Header, HTTPException, Path, Query, Response
from fastapi.responses import StreamingResponse

from harness_env.core.runner import resolve
from harness_env.models import (
    MAX_IDEMPOTENCY_KEY_CHARS,
    MAX_LIST_LIMIT,
    MAX_WAIT_S,
    Detail,
    JobEnd,
    JobStatus,
    RolloutAccepted,
    RolloutArgs,
    RolloutJob,
    RolloutPage,
)
from harness_env.models.jobs import ROLLOUT_ID_PATTERN
from harness_env.server.jobs.manager import JobManager

KEEP_ALIVE_S = 15.0  # a comment line this often keeps proxies from closing a quiet stream
RolloutId = Annotated[str, Path(pattern=ROLLOUT_ID_PATTERN, description="the rollout's id")]
IdempotencyKey = Annotated[
    str | None,
    Header(
        min_length=1,
        max_length=MAX_IDEMPOTENCY_KEY_CHARS,
        pattern=r"^[\x21-\x7e]+$",
        description="a key of the caller's choosing: a submission repeated with the same key runs nothing new and answers the first one's id",
    ),
]
NOT_FOUND = "no rollout with this id (never submitted here, or removed by retention)"


async def _found(job: RolloutJob | None) -> Response:
    if job is None:
        raise HTTPException(404, NOT_FOUND)
    # Serialized once here, off the event loop: a whole result can weigh megabytes.
    return Response(await asyncio.to_thread(job.model_dump_json), media_type="application/json")


async def sse(events: AsyncIterator[tuple[int, str] | JobEnd | None]) -> AsyncIterator[bytes]:
    """Server-Sent Events: `event: phase` with the event's seq as its id (a client reconnecting
    sends it back as Last-Event-ID), then `event: end` with how the job ended."""
    quiet_since = time.monotonic()
    async for item in events:
        if item is None:
            if time.monotonic() - quiet_since >= KEEP_ALIVE_S:
                quiet_since = time.monotonic()
                yield b": keep-alive\n\n"
            continue
        quiet_since = time.monotonic()
        if isinstance(item, JobEnd):
            yield f"event: end\ndata: {item.model_dump_json()}\n\n".encode()
            return
        seq, data = item
        yield f"id: {seq}\nevent: phase\ndata: {data}\n\n".encode()


def add_job_routes(app: FastAPI, jobs: JobManager) -> None:
    @app.post(
        "/rollouts",
        status_code=202,
        response_model=RolloutAccepted,
        tags=["Jobs"],
        responses={
            200: {"model": RolloutAccepted, "description": "the idempotency key named an earlier submission"},
            429: {"description": "server busy: nothing was accepted"},
        },
    )
    async def submit(args: RolloutArgs, response: Response, idempotency_key: IdempotencyKey = None) -> RolloutAccepted:
        """Submit a rollout (the arguments of POST /rollout); it runs whether or not the caller
        stays. Beyond the queue the answer is 429 at once and nothing is kept."""
        accepted = await jobs.existing(idempotency_key) if idempotency_key else None
        if accepted is None:
            resolved = await asyncio.to_thread(resolve, args, trusted=False)  # may read task directories
            accepted = await jobs.submit(resolved, key=idempotency_key)
        response.headers["location"] = f"rollouts/{accepted.rollout_id}"
        if not accepted.created:
            response.status_code = 200
        return accepted

    @app.get("/rollouts", response_model=RolloutPage, tags=["Jobs"])
    async def list_rollouts(
        status: list[JobStatus] = Query([], description="only these statuses (repeat the parameter for several)"),
        task_id: str | None = Query(None, max_length=256),
        harness: str | None = Query(None, max_length=64),
        limit: int = Query(50, ge=1, le=MAX_LIST_LIMIT),
        before: str | None = Query(None, pattern=r"^\d{1,18}$", description="the previous page's next_cursor"),
    ) -> RolloutPage:
        """Stored rollouts, newest first."""
        return await jobs.list(statuses=list(status), task_id=task_id, harness=harness, before=int(before) if before else None, limit=limit)

    @app.get("/rollouts/{rollout_id}", response_model=RolloutJob, tags=["Jobs"])
    async def get_rollout(
        rollout_id: RolloutId,
        detail: Detail = Query("summary", description="full: the whole result too"),
        wait: float = Query(0.0, ge=0.0, le=MAX_WAIT_S, description="wait up to this many seconds for it to end"),
    ) -> Response:
        """The rollout's status, phases so far and, once it ended, its summary (and with
        detail=full its whole result)."""
        return await _found(await jobs.get(rollout_id, detail, wait))

    @app.get(
        "/rollouts/{rollout_id}/events",
        tags=["Jobs"],
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}, "description": "phase events, then `end`"}},
    )
    async def rollout_events(rollout_id: RolloutId, last_event_id: str | None = Header(None, pattern=r"^\d{1,9}$")) -> StreamingResponse:
        """Server-Sent Events: the events so far, then live ones, ending when the rollout ends."""
        if await jobs.get(rollout_id) is None:
            raise HTTPException(404, NOT_FOUND)
        after = int(last_event_id) if last_event_id else -1
        return StreamingResponse(
            sse(jobs.follow(rollout_id, after)), media_type="text/event-stream", headers={"cache-control": "no-cache", "x-accel-buffering": "no"}
        )

    @app.delete("/rollouts/{rollout_id}", response_model=RolloutJob, tags=["Jobs"])
    async def cancel_rollout(rollout_id: RolloutId) -> Response:
        """Cancel the rollout (its processes and files are cleaned up as for any cancel); an
        ended one is left as it is. Answers its state after."""
        return await _found(await jobs.cancel(rollout_id))
