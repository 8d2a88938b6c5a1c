"""Admission control: N rollouts run at once, up to M wait, the rest are refused at once; of
those running, at most K are starting at once.

A refused call gets a clear "server busy" error instead of hanging; the client (or trainer) can
retry or spread the load over replicas.

Starting (sandbox creation, setup commands, the harness CLI's launch until its first model call)
is where a rollout spends CPU: Node alone takes about a CPU-second to start a harness. When
hundreds arrive at once, starting them all together makes every one of them slow (and the agent
timeouts tick meanwhile); StartingSlots lets K start at a time, the rest wait in arrival order.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from harness_env.core.errors import HarnessEnvError


class ServerBusy(HarnessEnvError):
    kind = "internal"


class StartingSlots:
    """At most `limit` rollouts starting at once; the others wait first come, first served (the
    engine's StartGate: core/start_gate.py)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_starting must be at least 1, not {limit}")
        self.limit = limit
        self.active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> int:
        """Wait for a place; returns how many were waiting ahead of this one when it arrived."""
        ahead = len(self._waiters)
        if self.active < self.limit and not ahead:
            self.active += 1
            return 0
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # release() handed its place over: `active` already counts this one
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the place came as it was cancelled: pass it on
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        return ahead

    def release(self) -> None:
        """Give a place back: the longest waiter gets it directly (nobody overtakes it)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.active -= 1


class RolloutSlots:
    def __init__(self, max_concurrent: int, max_queue: int, max_starting: int | None = None) -> None:
        self.max_concurrent = max_concurrent
        self.max_queue = max_queue
        self.starting = StartingSlots(max_starting or max_concurrent)
        self.running = 0
        self.queued = 0
        self._sem = asyncio.Semaphore(max_concurrent)

    def admit(self) -> None:
        """Take a place in the queue now, or raise ServerBusy: a job is refused or accepted when
        it is submitted, then enters `slot(admitted=True)` later (or gives the place back with
        `release_admission`)."""
        if self.running + self.queued >= self.max_concurrent + self.max_queue:
            raise ServerBusy(
                f"server busy: {self.running} running, {self.queued} queued "
                f"(limits: {self.max_concurrent} running, {self.max_queue} queued); retry later or use another replica"
            )
        self.queued += 1

    def release_admission(self) -> None:
        self.queued -= 1

    @asynccontextmanager
    async def slot(self, admitted: bool = False) -> AsyncIterator[None]:
        if not admitted:
            self.admit()
        try:
            await self._sem.acquire()
        finally:
            self.queued -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._sem.release()
