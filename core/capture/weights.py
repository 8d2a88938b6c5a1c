"""The policy's weight version, as the trainer announces it (PUT /policy/weights, server/weights.py).

Every engine call records the version current when it is sent (the turn's `weight_version`), so a
trainer knows which weights sampled each token. A trainer that announces a weight sync holds new
engine calls back until it says the sync ended: none is sampled by half-loaded weights. Calls
already in flight go on (never aborted: their tokens are the old version's, and say so). A sync
never ended (a trainer that died mid-way) holds calls at most `max_sync_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

MAX_SYNC_S = 900.0
CHECK_S = 0.5  # how often a held call looks whether its rollout ended meanwhile


class WeightVersions:
    """One per capture proxy: the version, and whether a sync is announced."""

    def __init__(self, max_sync_s: float = MAX_SYNC_S) -> None:
        self.version: int | None = None  # None: no trainer has said
        self.max_sync_s = max_sync_s
        self._synced = asyncio.Event()
        self._synced.set()
        self._sync_started = 0.0
        self.held = 0  # engine calls waiting for the sync's end now

    @property
    def syncing(self) -> bool:
        return not self._synced.is_set()

    def update(self, version: int | None = None, syncing: bool | None = None) -> None:
        """Set the version (when given); begin (True) or end (False) a sync."""
        if version is not None:
            self.version = version
        if syncing is True and not self.syncing:
            self._sync_started = time.monotonic()
            self._synced.clear()
        elif syncing is False:
            self._synced.set()

    async def current(self, gone: Callable[[], bool] = lambda: False) -> int | None:
        """The version an engine call sent now is sampled by: after an announced sync has ended
        (or the call's rollout is `gone`: then it is not sent at all)."""
        self.held += 1
        try:
            while self.syncing and not gone():
                left = self._sync_started + self.max_sync_s - time.monotonic()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._synced.wait(), min(left, CHECK_S))
        finally:
            self.held -= 1
        return self.version
