"""The client's side of rollouts and jobs, written once for the sync and async clients: each call
is a generator of steps (client/steps.py) that the client drives with its own httpx clients
(client/http.py); the Server-Sent Events parser, and the following of a rollout's event stream.

What makes it durable: a submission carries an idempotency key, so repeating it after a dropped
connection runs nothing twice; a busy server (429) or one restarting (502/503/504) is retried
with backoff; waiting is a long poll that reconnects after any drop. A server unreachable for
longer than `reconnect_for_s` in a row ends the wait with the last error.

With several servers (client/servers.py) a rollout goes to the one with the fewest in flight, a
busy or unreachable one passes it to the next, and a job's later calls go to the server that
took it.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from harness_env.client.servers import Servers, locate_steps, routed_steps
from harness_env.client.steps import BUSY, NEVER_REACHED, TRANSIENT, Call, HarnessEnvClientError, Patience, Steps, error_of, raise_for
from harness_env.models import MAX_WAIT_S, JobEnd, PhaseEvent, RolloutAccepted, RolloutJob, RolloutResult

POLL_SLACK_S = 30.0  # a long poll's read timeout beyond the wait it asked for


def rollout_steps(servers: Servers, args: dict[str, Any]) -> Steps:
    """POST /rollout on the server with the fewest rollouts in flight (the next on a refusal);
    the server is remembered as the result's owner."""
    url, resp = yield from routed_steps(servers, "POST", "/rollout", {"json": args}, count=True)
    result = RolloutResult.model_validate_json(resp.content)
    if result.rollout_id:
        servers.own(result.rollout_id, url)
    return result


def submit_steps(servers: Servers, args: dict[str, Any], key: str, *, retry_busy: bool, patience: Patience) -> Steps:
    """POST /rollouts until a server accepts it: the one with the fewest in flight first, the next
    when one is busy or never reached. When all are busy: 429, or with `retry_busy` all again
    after a pause. The job then belongs to its server (counted in flight until seen ended)."""
    while True:
        tried: set[str] = set()
        busy: HarnessEnvClientError | None = None
        unreachable: Exception | None = None
        while (url := servers.take(tried)) is not None:
            tried.add(url)
            try:
                outcome = yield from _submit_to(url, args, key, retry_busy=retry_busy, patience=patience)
            except BaseException:
                servers.release(url)
                raise
            if isinstance(outcome, RolloutAccepted):
                servers.reached(url)
                servers.own(outcome.rollout_id, url, counted=True)
                return outcome
            servers.release(url)
            servers.refused(url)
            if isinstance(outcome, HarnessEnvClientError):
                busy = outcome
            else:
                unreachable = outcome
        if busy is not None:
            if not retry_busy:
                raise busy
            yield patience.pause()
        else:
            assert unreachable is not None
            yield patience.unreachable(unreachable)


def _submit_to(url: str, args: dict[str, Any], key: str, *, retry_busy: bool, patience: Patience) -> Steps:
    """Submit to one server: its acceptance, or its busy refusal or never-reached error (which
    another server may then take). Once the request may have reached it, the submission stays
    with it: repeating the key there runs nothing twice, but another server would run it again."""
    sent = False
    while True:
        try:
            resp = yield Call(url, "POST", "/rollouts", {"json": args, "headers": {"idempotency-key": key}})
        except NEVER_REACHED as e:
            if not sent:
                return e
            yield patience.unreachable(e)
            continue
        except httpx.TransportError as e:  # it may have reached the server: the key makes retrying safe
            sent = True
            yield patience.unreachable(e)
            continue
        patience.reached()
        if resp.status_code == BUSY and not sent:
            return error_of(resp)
        if resp.status_code in TRANSIENT and (retry_busy or resp.status_code != BUSY):
            sent = True  # a proxy's 502/503/504: the server may have had it
            yield patience.pause()
            continue
        raise_for(resp)
        return RolloutAccepted.model_validate_json(resp.content)


def get_steps(servers: Servers, rollout_id: str, detail: str, wait_s: float) -> Steps:
    url = yield from locate_steps(servers, rollout_id)
    resp = yield Call(url, "GET", f"/rollouts/{rollout_id}", {"params": {"detail": detail, "wait": wait_s}, "timeout": wait_s + POLL_SLACK_S})
    raise_for(resp)
    job = RolloutJob.model_validate_json(resp.content)
    if job.ended:
        servers.ended(rollout_id)
    return job


def cancel_steps(servers: Servers, rollout_id: str) -> Steps:
    """DELETE /rollouts/{id} on the server that owns it."""
    url = yield from locate_steps(servers, rollout_id)
    _, resp = yield from routed_steps(servers, "DELETE", f"/rollouts/{rollout_id}", {}, only=url)
    job = RolloutJob.model_validate_json(resp.content)
    if job.ended:
        servers.ended(rollout_id)
    return job


def wait_steps(servers: Servers, rollout_id: str, timeout: float | None, patience: Patience) -> Steps:
    """Long-poll GET /rollouts/{id} until the job ended; its whole result."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = MAX_WAIT_S if deadline is None else min(MAX_WAIT_S, deadline - time.monotonic())
        if left <= 0:
            raise TimeoutError(f"rollout {rollout_id} did not end within {timeout} s (it goes on; wait again or cancel it)")
        try:
            job = yield from get_steps(servers, rollout_id, "full", round(left, 3))
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


class EventFollower:
    """A rollout's event stream followed across reconnects, for both clients (they only open the
    connections and read their lines): each connection's headers (Last-Event-ID: resume where it
    was), what a refusal or a drop costs (seconds to wait, or the error), each line's event."""

    def __init__(self, servers: Servers, rollout_id: str, patience: Patience) -> None:
        self.servers, self.rollout_id, self.patience = servers, rollout_id, patience
        self.path = f"/rollouts/{rollout_id}/events"
        self.last: str | None = None
        self.parser = SseParser()

    def headers(self) -> dict[str, str]:
        return {"last-event-id": self.last} if self.last is not None else {}

    def refused(self, resp: httpx.Response) -> float:
        """A connection answered with an error (its body read): raised, or a pause when transient."""
        if resp.status_code not in TRANSIENT:
            raise_for(resp)
        return self.patience.pause().seconds

    def connected(self) -> None:
        self.patience.reached()
        self.parser = SseParser()

    def feed(self, line: str) -> PhaseEvent | JobEnd | None:
        """A line of the stream: the event it completes, if any (a JobEnd: the rollout ended)."""
        if (ev := self.parser.feed(line)) is None:
            return None
        item = parse_event(ev[0], ev[2])
        self.last = ev[1] if ev[1] is not None else self.last
        if isinstance(item, JobEnd):
            self.servers.ended(self.rollout_id)
        return item

    def dropped(self, error: Exception) -> float:
        return self.patience.unreachable(error).seconds


INVALID = frozenset({400, 413, 422})  # the request itself was refused: sending it again would not help
# What a batch files as a failed result (`failed`) rather than raise: a refusal, a lost connection, an answer that is no result.
REFUSED_OR_LOST: tuple[type[Exception], ...] = (HarnessEnvClientError, httpx.HTTPError, ValueError)


def failed(req: Any, e: Exception) -> RolloutResult:
    """A rollout the server refused or never answered, as data (run_many never raises mid-batch):
    a refused request is `invalid_request`, anything else (unreachable, lost) `internal`."""
    task_id = getattr(req, "task_id", None) if not isinstance(req, dict) else req.get("task_id")
    invalid = isinstance(e, HarnessEnvClientError) and e.status in INVALID
    return RolloutResult(task_id=task_id or None, error=f"request failed: {e}", error_kind="invalid_request" if invalid else "internal")
