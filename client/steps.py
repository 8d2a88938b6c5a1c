"""What the client's calls are made of, written once for the sync and async clients: a call is a
generator of steps (an HTTP call to make on a given server, a pause to take) that each client
drives with its own httpx clients; the error a refused call raises; the backoff between retries.
"""

from __future__ import annotations

import random
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import httpx

BUSY = 429  # the server's answer to ServerBusy: nothing was accepted
TRANSIENT = frozenset({BUSY, 502, 503, 504})  # busy, or a proxy in front while the server restarts
BACKOFF_START_S, BACKOFF_MAX_S = 0.5, 30.0
DEFAULT_RECONNECT_FOR_S = 600.0
# Errors of a call that never reached the server: another server (or a retry) cannot run it twice.
NEVER_REACHED: tuple[type[Exception], ...] = (httpx.ConnectError, httpx.ConnectTimeout)


class HarnessEnvClientError(Exception):
    """The server refused the call: bad arguments (status 422), busy (429), auth (401), ..."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


MAX_PROBLEMS = 10  # per message, as the server's own
LOCATIONS = ("body", "path", "query", "header")  # where a server's problem was: the field says enough


def invalid_request(problems: list[Any]) -> str:
    """Validation problems (pydantic's `errors()`, or a server's 422 list of them) as the one line a
    server gives for a bad request: where, and what is wrong, per problem."""
    parts = []
    for p in problems[:MAX_PROBLEMS]:
        if not isinstance(p, dict):
            parts.append(str(p))
            continue
        loc = [str(x) for x in p.get("loc", ())]
        loc = loc[1:] if loc[:1] and loc[0] in LOCATIONS else loc
        parts.append(f"{'.'.join(loc) or 'request'}: {p.get('msg', '')}")
    if len(problems) > MAX_PROBLEMS:
        parts.append(f"and {len(problems) - MAX_PROBLEMS} more")
    return "invalid request: " + "; ".join(parts)


def error_of(resp: httpx.Response) -> HarnessEnvClientError:
    try:
        body = resp.json()
        detail = body.get("detail") or (body.get("error") or {}).get("message") or resp.text
    except (ValueError, AttributeError):
        detail = resp.text
    if isinstance(detail, list):
        detail = invalid_request(detail)
    return HarnessEnvClientError(resp.status_code, detail if isinstance(detail, str) else str(detail))


def raise_for(resp: httpx.Response) -> None:
    if resp.status_code >= 400:
        raise error_of(resp)


@dataclass(frozen=True)
class Call:
    """An HTTP call for the driver to make on `server` (one of the client's base URLs); it sends
    back the response or throws the httpx error."""

    server: str
    method: str
    path: str
    kw: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Pause:
    seconds: float


Steps = Generator[Call | Pause, Any, Any]


class Driver:
    """Advances one call's steps for a client that does the I/O they ask for (all that differs
    between the sync and async clients): `next()` is the step to take, None once the call returned
    (its value then in `value`); what a Call gave goes back in `reply`, or its httpx error in `error`."""

    def __init__(self, steps: Steps) -> None:
        self.steps = steps
        self.reply: Any = None
        self.error: Exception | None = None
        self.value: Any = None

    def next(self) -> Call | Pause | None:
        reply, error = self.reply, self.error
        self.reply = self.error = None
        try:
            return self.steps.throw(error) if error is not None else self.steps.send(reply)
        except StopIteration as done:
            self.value = done.value
            return None


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
