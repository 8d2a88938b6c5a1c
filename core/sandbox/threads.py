"""Blocking sandbox work (a task image's pull, making a sandbox) off the event loop, on threads of
its own, and what becomes of its result when the rollout that asked was cancelled meanwhile.

Such work may take minutes and cannot be interrupted: on its own pool, rollouts making theirs
never hold up the server's other blocking work (the event loop's default pool has a handful of
threads). A rollout cancelled while its work runs stops waiting at once; the work goes on, and
what it made is handed to `on_late` (a sandbox closed, an image released), never left for a
restart's sweep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

SANDBOX_MAKERS = ThreadPoolExecutor(max_workers=256, thread_name_prefix="harness-env-sandbox")
_LATE: set[asyncio.Task[Any]] = set()  # clean-ups of what was made after its rollout was cancelled


async def in_thread[T](work: Callable[[], T], on_late: Callable[[T], Any]) -> T:
    """`work()`'s result; if the caller is cancelled first, `on_late(result)` once the work is done
    (awaited in a task of its own when it is a coroutine)."""
    done = asyncio.get_running_loop().run_in_executor(SANDBOX_MAKERS, work)
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        done.add_done_callback(lambda f: _late(f, on_late))
        raise


def _late(done: asyncio.Future[Any], on_late: Callable[[Any], Any]) -> None:
    if done.cancelled() or done.exception() is not None:
        return  # nothing was made (a failure cleans up after itself)
    outcome = on_late(done.result())
    if asyncio.iscoroutine(outcome):
        task = asyncio.ensure_future(outcome)
        _LATE.add(task)
        task.add_done_callback(_LATE.discard)
