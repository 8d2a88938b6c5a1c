"""Bounded start-up: how many rollouts start at once (a StartGate, e.g. server/slots.py
StartingSlots), and one rollout's place among them (StartPlace), held from before its sandbox is
made until its agent is up. That is the CPU-heavy stretch (Node start-up, bwrap, installs); once the
agent is calling the model it mostly waits. The engine (core/engine.py) takes the place in its
`start_wait` phase."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

# A launched agent counts as up at its first model call, or this long after its launch (one that
# thinks long before calling, or never calls, must not hold a start-up place for its whole run).
START_HOLD_S = 10.0
START_POLL_S = 0.02


class StartGate(Protocol):
    """Bounds how many rollouts start at once (e.g. server/slots.py StartingSlots). `acquire`
    waits for a place in arrival order and returns how many waited ahead; `release` gives it back."""

    async def acquire(self) -> int: ...

    def release(self) -> None: ...


class StartPlace:
    """One rollout's start-up place: taken once, given back once (when the agent is up, when it
    ends before that, or when the rollout ends). `agent_up` says whether its first model call came."""

    def __init__(self, gate: StartGate | None, agent_up: Callable[[], bool]) -> None:
        self.gate = gate
        self.agent_up = agent_up
        self.held = False
        self._watch: asyncio.Task | None = None

    async def take(self) -> int:
        """Wait for a place; how many rollouts were waiting ahead of this one."""
        assert self.gate is not None
        ahead = await self.gate.acquire()
        self.held = True
        return ahead

    def agent_launched(self) -> None:
        """The harness is being launched: give the place back once the agent is up (its first
        model call arrives at the proxy, or START_HOLD_S after the launch)."""
        if self.held and self._watch is None:
            self._watch = asyncio.ensure_future(self._release_when_up())

    async def _release_when_up(self) -> None:
        deadline = time.monotonic() + START_HOLD_S
        while not self.agent_up() and time.monotonic() < deadline:
            await asyncio.sleep(START_POLL_S)
        self.release()

    def release(self) -> None:
        """Give the place back (once; idempotent)."""
        if self._watch is not None and self._watch is not asyncio.current_task():
            self._watch.cancel()
        if self.held:
            self.held = False
            assert self.gate is not None
            self.gate.release()
