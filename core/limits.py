"""A concurrency limit shared by every event loop and thread of the process."""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Hashable


class ProcessLimiter:
    """A counting semaphore shared by every event loop and thread of the process.

    asyncio.Semaphore belongs to one loop, but rollouts may run in several (run_rollout_sync in
    worker threads), and a limit on a shared resource (a judge endpoint, browsers on this machine)
    is per process, not per loop. A waiter parks on a future
    of its own loop; a release hands the slot straight to the oldest waiter through
    call_soon_threadsafe.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = 0
        self._lock = threading.Lock()
        self._waiters: collections.deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = collections.deque()

    async def acquire(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.in_use < self.limit and not self._waiters:
                self.in_use += 1
                return
            fut: asyncio.Future[None] = loop.create_future()
            entry = (loop, fut)
            self._waiters.append(entry)
        try:
            await fut
        except asyncio.CancelledError:
            with self._lock:
                if entry in self._waiters:  # never granted
                    self._waiters.remove(entry)
                    raise
            if fut.done() and not fut.cancelled():  # granted, then cancelled: give the slot back
                self.release()
            # else: the grant is still on its way; _grant sees the cancelled future and releases
            raise

    def release(self) -> None:
        with self._lock:
            while self._waiters:
                loop, fut = self._waiters.popleft()
                try:
                    loop.call_soon_threadsafe(self._grant, fut)
                    return  # the slot passes to that waiter; in_use is unchanged
                except RuntimeError:  # its loop is closed
                    continue
            self.in_use -= 1

    def _grant(self, fut: asyncio.Future[None]) -> None:
        if fut.done():  # cancelled meanwhile
            self.release()
        else:
            fut.set_result(None)

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    @classmethod
    def named(cls, key: Hashable, limit: int) -> ProcessLimiter:
        """The process's one limiter for `key` (and `limit`)."""
        with _NAMED_LOCK:
            return _NAMED.setdefault((key, limit), cls(limit))


_NAMED: dict[tuple[Hashable, int], ProcessLimiter] = {}
_NAMED_LOCK = threading.Lock()
