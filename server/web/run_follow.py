"""Following one rollout the Run tab started: its phase events as the log and status line, while it
runs, then what stays of it in the page's history. Pure but for awaiting the events and the task."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from harness_env.core.errors import HarnessEnvError
from harness_env.models import PhaseEvent, RolloutResult
from harness_env.server.web import render

TICK_S = 0.25  # how often the elapsed time refreshes while nothing else happens


async def follow(task: asyncio.Task, events: asyncio.Queue[PhaseEvent], log: list[str], secrets: list[str], t0: float) -> AsyncIterator[tuple[str, str | None]]:
    """(status line, the log when it grew, else None) at each event and at least every TICK_S,
    until the task is done and its events are read. `log` is filled with the events' lines."""
    phase = "queued"
    while True:
        getter = asyncio.ensure_future(events.get())
        await asyncio.wait({getter, task}, timeout=TICK_S, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            batch = [getter.result()]
        else:
            getter.cancel()
            batch = []
        while not events.empty():
            batch.append(events.get_nowait())
        for ev in batch:
            log.append(render.log_line(ev))
            if ev.phase != "done":
                phase = ev.phase
        state = "cancelling" if task.cancelling() and not task.done() else "running"
        status = render.status_line(state, time.monotonic() - t0, phase)
        shown = render.redact("\n".join(log), secrets) if batch else None
        if task.done() and events.empty():
            if batch:  # the last phases (collect, done) show before the result does
                yield status, shown
            return
        yield status, shown


def outcome(task: asyncio.Task, secrets: list[str]) -> tuple[RolloutResult | None, bool, str]:
    """(the result with the secrets redacted, whether it was cancelled, why it did not run) of a
    task that is done."""
    result, cancelled, error = None, False, ""
    try:
        result = task.result()
    except asyncio.CancelledError:
        cancelled = True
    except HarnessEnvError as e:  # the server is busy: said in the status line
        error = str(e)
    if result is not None:
        result = RolloutResult.model_validate(render.redact(result.model_dump(mode="json"), secrets))
    return result, cancelled, error


def history_entry(
    n: int, key: str, form: dict[str, Any], result: RolloutResult | None, cancelled: bool, status: str, log: str, reference: str | None, wall: float
) -> dict[str, Any]:
    """What the page's history keeps of a run: enough to show it again (never the API key)."""
    return {
        "id": key,
        "cancelled": cancelled,
        "result": result.model_dump(mode="json") if result else None,
        "reference_png": reference,
        "status": status,
        "log": log,
        "form": {k: v for k, v in form.items() if k != "api_key"},
        "row": render.history_row(
            n, result, form.get("harness") or "", result.wall_s if result else wall, form.get("instruction") or (result.task_id if result else ""), cancelled
        ),
    }
