"""A rollout's phases as they happen: each sent as an event to the caller's listener when it starts
and ends (the web UI's live log, MCP progress, the CLI's bar), and kept as a Phase record with its
timing on the result. The engine (core/engine.py) opens one per lifecycle method."""

from __future__ import annotations

import time
from collections.abc import Callable

from harness_env.models import Phase, PhaseEvent, Turn

EventSink = Callable[[PhaseEvent], None]
Emit = Callable[[str, str, str], None]  # (phase, status, detail)


def send_event(on_event: EventSink | None, rollout_id: str, t0: float, phase: str, status: str, detail: str = "") -> None:
    """One phase event to the listener, with the time since the rollout began (`t0`, monotonic)."""
    if on_event is None:
        return
    try:
        on_event(PhaseEvent(rollout_id=rollout_id, phase=phase, status=status, elapsed_s=round(time.monotonic() - t0, 3), detail=detail))
    except Exception:
        pass  # a broken listener must not break the rollout


class TimedPhase:
    """One phase of the rollout: an event when it starts, a Phase record and an event when it ends."""

    def __init__(self, emit: Emit, phases: list[Phase], name: str) -> None:
        self.emit, self.phases, self.name, self.detail, self.ok = emit, phases, name, "", True

    def __enter__(self) -> TimedPhase:
        self.started_wall = time.time()
        self.started = time.monotonic()
        self.emit(self.name, "started", "")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        ok = self.ok and exc_type is None
        if exc is not None and not self.detail:
            self.detail = str(exc)[:300]
        self.phases.append(Phase(name=self.name, started=self.started_wall, duration_s=round(time.monotonic() - self.started, 4), ok=ok, detail=self.detail))
        self.emit(self.name, "finished" if ok else "failed", self.detail)


def turn_line(turn: Turn) -> str:
    """The agent phase's event line for one model call, as the capture session records it."""
    if turn.upstream_error and turn.upstream_status != 200:
        return f"model call {turn.index}: failed ({turn.upstream_status}): {turn.upstream_error[:160]}"
    return (
        f"model call {turn.index} ({turn.purpose}): {len(turn.completion_token_ids) or len(turn.per_token_logps)} tokens, "
        f"{len(turn.tool_calls)} tool calls, {turn.latency_s:.2f}s"
    )
