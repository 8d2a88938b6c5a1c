"""The client's side of jobs, written once for the sync and async clients: each call is a generator
of steps (an HTTP call to make, a pause to take) that the client drives with its own httpx client
(client/http.py), and the Server-Sent Events parser.

What makes it durable: a submission carries an idempotency key, so repeating it after a dropped
connection runs nothing twice; a busy server (429) or one restarting (502/503/504) is retried
with backoff; waiting is a long poll that reconnects after any drop. A server unreachable for
longer than `reconnect_for_s` in a row ends the wait with the last error.
"""

from __future__ import annotations

import random
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import httpx

from harness_env.models import MAX_WAIT_S, JobEnd, PhaseEvent, RolloutAccepted, RolloutJob, RolloutResult

TRANSIENT = frozenset({429, 502, 503, 504})  # busy, or a proxy in front while the server restarts
BACKOFF_START_S, BACKOFF_MAX_S = 0.5, 30.0
DEFAULT_RECONNECT_FOR_S = 600.0
POLL_SLACK_S = 30.0  # a long poll's read timeout beyond the wait it asked for


class HarnessEnvClientError(Exception):
    """The server refused the call: bad arguments (status 422), busy (429), auth (401), ..."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        body = resp.json()
        detail = body.get("detail") or (body.get("error") or {}).get("message") or resp.text
    except (ValueError, AttributeError):
        detail = resp.text
    raise HarnessEnvClientError(resp.status_code, detail if isinstance(detail, str) else str(detail))


@dataclass(frozen=True)
class Call:
    """An HTTP call for the driver to make; it sends back the response or throws the httpx error."""

    method: str
    path: str
    kw: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Pause:
    seconds: float


Steps = Generator[Call | Pause, Any, Any]


@dataclass
class Patience:
    """Backoff between retries, and how long the server may stay unreachable in a row."""

    reconnect_for_s: float = DEFAULT_RECONNECT_FOR_S
    delay: float = BACKOFF_START_S
    unreachable_since: float | None = None

    def pause(self) -> Pause:
        seconds = self.delay * (0.5 + random.random() / 2)  # jittered: retries of many rollouts do not arrive together
        self.delay = min(self.delay * 2, BACKOFF_MAX_S)
        return Pause(seconds)

    def unreachable(self, error: Exception) -> Pause:
        """A transport error: a pause before trying again, or the error once it has lasted too long."""
        now = time.monotonic()
        self.unreachable_since = self.unreachable_since or now
        if now - self.unreachable_since > self.reconnect_for_s:
            raise error
        return self.pause()

    def reached(self) -> None:
        self.unreachable_since = None


def submit_steps(args: dict[str, Any], key: str, *, retry_busy: bool, patience: Patience) -> Steps:
    """POST /rollouts until it is accepted (the same key each time: a repeat runs nothing new)."""
    while True:
        try:
            resp = yield Call("POST", "/rollouts", {"json": args, "headers": {"idempotency-key": key}})
        except httpx.TransportError as e:  # it may have reached the server: the key makes retrying safe
            yield patience.unreachable(e)
            continue
        patience.reached()
        if resp.status_code in TRANSIENT and (retry_busy or resp.status_code != 429):
            yield patience.pause()
            continue
        raise_for(resp)
        return RolloutAccepted.model_validate_json(resp.content)


def get_steps(rollout_id: str, detail: str, wait_s: float) -> Steps:
    resp = yield Call("GET", f"/rollouts/{rollout_id}", {"params": {"detail": detail, "wait": wait_s}, "timeout": wait_s + POLL_SLACK_S})
    raise_for(resp)
    return RolloutJob.model_validate_json(resp.content)


def wait_steps(rollout_id: str, timeout: float | None, patience: Patience) -> Steps:
    """Long-poll GET /rollouts/{id} until the job ended; its whole result."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = MAX_WAIT_S if deadline is None else min(MAX_WAIT_S, deadline - time.monotonic())
        if left <= 0:
            raise TimeoutError(f"rollout {rollout_id} did not end within {timeout} s (it goes on; wait again or cancel it)")
        try:
            job = yield from get_steps(rollout_id, "full", round(left, 3))
        except httpx.TransportError as e:
            yield patience.unreachable(e)
            continue
        except HarnessEnvClientError as e:
            if e.status not in TRANSIENT:
                raise
            yield patience.pause()
            continue
        patience.reached()
        if job.ended:
            if job.result is None:
                raise HarnessEnvClientError(500, f"rollout {rollout_id} ended ({job.status}) but its result is missing")
            return job.result


class SseParser:
    """Server-Sent Events, line by line: (event, id, data) for each complete event."""

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}

    def feed(self, line: str) -> tuple[str, str | None, str] | None:
        if line:
            if not line.startswith(":"):
                name, _, value = line.partition(":")
                self.fields[name] = value[1:] if value.startswith(" ") else value
            return None
        fields, self.fields = self.fields, {}
        if "data" not in fields:
            return None
        return fields.get("event", "message"), fields.get("id"), fields["data"]


def parse_event(event: str, data: str) -> PhaseEvent | JobEnd:
    return JobEnd.model_validate_json(data) if event == "end" else PhaseEvent.model_validate_json(data)


def failed(req: Any, e: Exception) -> RolloutResult:
    """A rollout the server refused or never answered, as data (run_many never raises mid-batch)."""
    task_id = getattr(req, "task_id", None) if not isinstance(req, dict) else req.get("task_id")
    return RolloutResult(task_id=task_id or None, error=f"request failed: {e}", error_kind="internal")
