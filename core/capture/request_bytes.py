"""The request bytes the capture proxy holds at once.

A model call's body is read whole before it is parsed, checked against the rollout's budgets and
sent on. A sandbox may hold 64 connections (core/capture/listener.py), each with a body of up to
64 MiB: unbounded, one rollout could make the server hold 4 GiB before any budget is checked. So
the bytes of the requests a session has in the proxy (being read, checked or waiting for the
engine's answer) are bounded per session, and those of all sessions together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

MIB = 1024 * 1024
PER_SESSION_BYTES = 128 * MIB  # two of the largest requests at once
TOTAL_BYTES = 1024 * MIB


class TooManyBytes(Exception):
    """A request that would pass a bound: the status, message and code to answer with."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


@dataclass
class RequestBytes:
    per_session: int = PER_SESSION_BYTES
    total: int = TOTAL_BYTES
    _by_session: dict[str, int] = field(default_factory=dict)
    _all: int = 0

    @contextmanager
    def held(self, key: str) -> Iterator[Callable[[int], None]]:
        """A function that counts `n` more bytes of one request of session `key` (raising
        TooManyBytes past a bound); all of them are given back when the block ends."""
        taken = 0

        def take(n: int) -> None:
            nonlocal taken
            mine = self._by_session.get(key, 0)
            if mine + n > self.per_session:
                raise TooManyBytes(
                    429,
                    f"this rollout's model calls hold over {self.per_session // MIB} MiB of request bodies in the "
                    "proxy at once; send fewer large requests at a time",
                    "request_bytes_limit",
                )
            if self._all + n > self.total:
                raise TooManyBytes(
                    503, f"the capture proxy holds its limit of {self.total // MIB} MiB of request bodies for all rollouts; retry shortly", "proxy_busy"
                )
            self._by_session[key] = mine + n
            self._all += n
            taken += n

        try:
            yield take
        finally:
            left = self._by_session.get(key, 0) - taken
            if left > 0:
                self._by_session[key] = left
            else:
                self._by_session.pop(key, None)
            self._all -= taken
