"""One path from a caller's request to a running engine, for every face: the CLI's `run` and
`eval`, the in-process API (rollout.py), and the server's (HTTP, MCP, the web UI, the job
manager, each Ray replica).

`resolve` turns a caller's arguments into a prepared rollout: core/catalog.to_request (the
endpoint, the task), then `prepared` (core/pipeline.prepare, and for a remote caller this
server's maximums). A `Runner` runs prepared rollouts against one capture proxy, in sandboxes of
one factory (named in core/sandbox/backends.py), behind an optional queue of running places and
start gate; each rollout's phases, the queue's included, go to its event sink as they happen.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from harness_env.core.catalog import to_request
from harness_env.core.engine import CaptureAccess, RolloutRun
from harness_env.core.phases import EventSink, TimedPhase, send_event
from harness_env.core.pipeline import PreparedRollout, prepare
from harness_env.core.sandbox.base import SandboxFactory
from harness_env.core.sandbox.policy import sandbox_limits
from harness_env.core.start_gate import StartGate
from harness_env.models import Phase, RolloutArgs, RolloutRequest, RolloutResult

NOT_STARTED = "cancelled before it started"


def prepared(request: RolloutRequest | dict[str, Any], *, trusted: bool) -> PreparedRollout:
    """`request` prepared (core/pipeline.prepare). A remote caller's (`trusted` False) is also held
    to this server's maximums here, so that it is refused before any work; the in-process API's
    meets them in the engine, as a result. May read task directories: call it off the event loop."""
    out = prepare(request, trusted=trusted)
    if not trusted:
        sandbox_limits(out.request)
    return out


def resolve(args: RolloutArgs, *, trusted: bool, metadata: dict[str, Any] | None = None) -> PreparedRollout:
    """A caller's arguments, resolved (core/catalog.to_request) and prepared; InvalidRequestError
    with a clear message for bad ones. `trusted`: the caller is on this machine (its image may be a
    local one, it may name server-side paths); a remote caller is not."""
    return prepared(to_request(args, trusted=trusted, metadata=metadata), trusted=trusted)


def new_id() -> str:
    """A rollout's id: 12 hexadecimal digits."""
    return uuid.uuid4().hex[:12]


class RunningPlaces(Protocol):
    """How many rollouts run at once (e.g. server/slots.py RolloutSlots): `slot` waits for a place
    (`admitted`: the caller took its place in the queue already) and holds it while it is entered."""

    max_concurrent: int

    def slot(self, admitted: bool = False) -> AbstractAsyncContextManager[None]: ...


class Runner:
    """Runs prepared rollouts: against `capture` (the proxy and how sandboxes reach it; the server
    sets its Unix socket once it listens), in sandboxes of `sandbox_factory`, each first waiting for
    one of `places` (the `queue` phase) and starting behind `start_gate`."""

    def __init__(
        self, capture: CaptureAccess, sandbox_factory: SandboxFactory, *, start_gate: StartGate | None = None, places: RunningPlaces | None = None
    ) -> None:
        self.capture = capture
        self.sandbox_factory = sandbox_factory
        self.start_gate = start_gate
        self.places = places

    def rollout(
        self, prepared: PreparedRollout, on_event: EventSink | None = None, *, rollout_id: str | None = None, sandbox_factory: SandboxFactory | None = None
    ) -> Rollout:
        """One rollout, not started (`sandbox_factory`: this rollout's own, e.g. the runner's
        wrapped by the job manager to record where each sandbox is)."""
        return Rollout(self, prepared, on_event, rollout_id or new_id(), sandbox_factory or self.sandbox_factory)

    async def run(self, prepared: PreparedRollout, on_event: EventSink | None = None) -> RolloutResult:
        """Run one rollout; always returns its result."""
        return await self.rollout(prepared, on_event).execute()


class Rollout:
    """One rollout of a Runner. Its `result` stands whatever happens: a caller that cancels it
    (the job manager) still has what it did, and one cancelled in the queue says so."""

    def __init__(self, runner: Runner, prepared: PreparedRollout, on_event: EventSink | None, rollout_id: str, factory: SandboxFactory) -> None:
        self.runner, self.prepared, self.on_event, self.rollout_id, self.factory = runner, prepared, on_event, rollout_id, factory
        self.queued: list[Phase] = []
        self.run: RolloutRun | None = None

    @property
    def result(self) -> RolloutResult:
        if self.run is not None:
            return self.run.result
        request = self.prepared.request
        return RolloutResult(
            rollout_id=self.rollout_id,
            task_id=request.task.task_id,
            harness=self.prepared.harness.name,
            mode=request.mode,
            error=NOT_STARTED,
            error_kind="cancelled",
            phases=list(self.queued),
        )

    async def execute(self, *, admitted: bool = False, on_running: Callable[[], None] | None = None) -> RolloutResult:
        """Wait for a running place (if the runner has places), tell `on_running`, run the engine.
        Always returns the result; a cancellation is raised after the clean-up (`result` holds it)."""
        places = self.runner.places
        async with contextlib.AsyncExitStack() as stack:
            if places is not None:
                t0 = time.monotonic()

                def emit(phase: str, status: str, detail: str) -> None:
                    send_event(self.on_event, self.rollout_id, t0, phase, status, detail)

                with TimedPhase(emit, self.queued, "queue") as ph:  # the wait for a running place (--max-concurrent)
                    await stack.enter_async_context(places.slot(admitted=admitted))
                    ph.detail = f"waited for one of {places.max_concurrent} running places"
            if on_running is not None:
                on_running()
            runner = self.runner
            # Made once running: its clock (the events' elapsed time, the result's wall_s) is the rollout's own, not the queue's.
            self.run = RolloutRun(self.prepared, runner.capture, self.factory, self.on_event, start_gate=runner.start_gate, rollout_id=self.rollout_id)
            self.run.result.phases[:0] = self.queued
            return await self.run.execute()
        raise AssertionError("unreachable")  # for type checkers: the block above returns or raises
