"""One writer for the store: every write goes through it, in order, off the event loop.

Ordered, so a job's events are stored before its end and its end after its start; batched, so the
events of hundreds of rollouts in flight cost one transaction per batch, not one each (SQLite has
one writer at a time anyway). `call` waits for the write (a submission is answered once it is
stored); `post` does not (an event, from the engine's synchronous callback). After each batch the
jobs it touched are announced (`on_written`), which wakes whoever follows them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from harness_env.server.store.store import Store

logger = logging.getLogger("harness_env.store")
EventRow = tuple[str, int, float, str]


class StoreWriter:
    def __init__(self, store: Store, on_written: Callable[[set[str]], None]) -> None:
        self.store = store
        self.on_written = on_written
        self._ops: list[tuple[Callable[..., Any] | None, tuple, asyncio.Future | None, str | None]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.get_ident()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._task = asyncio.create_task(self._run(), name="store-writer")

    def _queue(self, op: tuple) -> None:
        if threading.get_ident() != self._thread and self._loop is not None:  # e.g. a harness's own thread
            self._loop.call_soon_threadsafe(self._queue, op)
            return
        self._ops.append(op)
        self._wake.set()

    def post_event(self, row: EventRow) -> None:
        self._queue((None, row, None, row[0]))

    def post(self, job_id: str | None, fn: Callable[..., Any], *args: Any) -> None:
        """Write without waiting (a failure is logged); callable from any thread."""
        self._queue((fn, args, None, job_id))

    async def call(self, job_id: str | None, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """Write and wait until it is stored; its exception, if any, is raised here."""
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._ops.append((functools.partial(fn, **kw) if kw else fn, args, fut, job_id))
        self._wake.set()
        return await asyncio.shield(fut)  # a caller that goes away does not undo the write

    async def close(self) -> None:
        """Write what is queued, then stop."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._ops = self._ops, []
            if batch:
                outcomes = await asyncio.to_thread(self._apply, batch)
                for (_, _, fut, _), (ok, value) in zip(batch, outcomes):
                    if fut is not None and not fut.done():
                        fut.set_result(value) if ok else fut.set_exception(value)
                self.on_written({job for *_, job in batch if job is not None})
            if self._closing and not self._ops:
                return

    def _apply(self, batch: list) -> list[tuple[bool, Any]]:
        """Runs in a worker thread: consecutive events in one transaction, the rest one by one."""
        outcomes: list[tuple[bool, Any]] = []
        rows: list[EventRow] = []

        def flush() -> None:
            if rows:
                try:
                    self.store.append_events(rows)
                except Exception:  # stored or not, the rollout goes on; its end is still written
                    logger.exception("could not store %d events", len(rows))
                rows.clear()

        for fn, args, fut, _ in batch:
            if fn is None:
                rows.append(args)
                outcomes.append((True, None))
                continue
            flush()
            try:
                outcomes.append((True, fn(*args)))
            except Exception as e:
                if fut is None:
                    logger.exception("store write %s failed", getattr(fn, "__name__", fn))
                outcomes.append((False, e))
        flush()
        return outcomes
