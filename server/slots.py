"""Admission control: N rollouts run at once, up to M wait, the rest are refused at once.

A refused call gets a clear "server busy" error instead of hanging; the client (or trainer) can
retry or spread the load over replicas.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from harness_env.core.errors import HarnessEnvError


class ServerBusy(HarnessEnvError):
    kind = "internal"


class RolloutSlots:
    def __init__(self, max_concurrent: int, max_queue: int) -> None:
        self.max_concurrent = max_concurrent
        self.max_queue = max_queue
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
