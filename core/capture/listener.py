"""Bounds on the connections of the proxy's own listeners (core/capture/serve.py).

The capture socket is bound into every network-isolated sandbox, so the agent can open as many
connections to it as it likes (socat forks one per TCP connection to its port): 22,000 idle ones
once took the server to its file-descriptor limit, and /health failed. So, on these listeners:
- one peer holds at most `per_peer` connections at once; beyond that a connection gets a 503
  saying so and is closed. A Unix socket's peer is told by the kernel (SO_PEERCRED), never by
  what it sends: the rollout whose cgroup the connecting process is in, else its pid namespace
  (each bubblewrap sandbox has its own), else its uid. The pid-namespace fallback is not the
  agent's to hold fixed (`unshare -Urpf` makes a new one per connection): without a rollout cgroup
  it is the total that protects the server;
- all peers together hold at most `total` (a quarter of the open-file limit by default), so the
  server keeps descriptors for its own API, the store and upstream calls; every listener of a
  process shares one ConnectionBounds (`process_bounds`), so the quarter is the process's;
- a connection must complete its first request's head within `header_timeout_s` of connecting,
  and one between requests (idle, or part way through the next head) is closed after
  `idle_timeout_s`. A request being served is not cut short here (the upstream's read timeout
  bounds it).
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import resource
import socket
import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

PER_PEER = 64  # a harness keeps a few pooled connections; subagents and parallel calls a few more
HEADER_TIMEOUT_S = 15.0
IDLE_TIMEOUT_S = 75.0  # longer than clients' own pool idle times, so they close first
MIN_TOTAL = 256
ROLLOUT_CGROUP = re.compile(r"/(rollout-[0-9a-f]{12})(?:/|$)", re.M)
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


def default_total() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return MIN_TOTAL if soft == resource.RLIM_INFINITY else max(MIN_TOTAL, soft // 4)


@dataclass
class ConnectionBounds:
    """The bounds of one listener, and who holds its connections now."""

    per_peer: int = PER_PEER
    total: int = field(default_factory=default_total)
    header_timeout_s: float = HEADER_TIMEOUT_S
    idle_timeout_s: float = IDLE_TIMEOUT_S
    held: Counter[str] = field(default_factory=Counter)
    refused: int = 0

    def admit(self, peer: str | None) -> str | None:
        """Count a new connection of `peer` (None: a peer it cannot tell apart) in, or say why it
        is refused."""
        if peer is not None and self.held[peer] >= self.per_peer:
            self.refused += 1
            return f"this sandbox holds {self.per_peer} connections to the capture proxy already; reuse or close them"
        if sum(self.held.values()) >= self.total:
            self.refused += 1
            return f"the capture proxy holds {self.total} connections already; retry later"
        self.held[peer or ""] += 1
        return None

    def release(self, peer: str | None) -> None:
        peer = peer or ""
        self.held[peer] -= 1
        if self.held[peer] <= 0:
            del self.held[peer]


@functools.cache
def process_bounds() -> ConnectionBounds:
    """The one ConnectionBounds of this process's listeners (loopback and Unix alike): the total
    bounds them together, so two listeners of one process never hold twice its share of descriptors."""
    return ConnectionBounds()


def peer_of(transport: asyncio.BaseTransport) -> str | None:
    """Who is at the other end, as the kernel says: for a Unix socket the connecting process's
    rollout (cgroup), else its pid namespace, else its uid. None over TCP: on loopback every
    rollout has the same address, so only the total applies."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        pid, uid, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    except OSError:
        return "unknown"
    # Two small procfs reads per connection (no disk behind them): cheap enough for the loop.
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            found = ROLLOUT_CGROUP.search(f.read())
        if found:
            return f"rollout:{found.group(1)}"
    except OSError:
        pass
    try:
        return f"pidns:{os.readlink(f'/proc/{pid}/ns/pid')}"
    except OSError:
        return f"uid:{uid}"


def refusal(message: str) -> bytes:
    body = ('{"error": {"message": "harness-env: ' + message + '", "type": "too_many_connections", "code": "too_many_connections"}}').encode()
    return (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


def bounded_protocol(bounds: ConnectionBounds) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol with `bounds` applied to every connection (for uvicorn.Config(http=...))."""

    class BoundedProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _admitted = False
        _peer: str | None = None
        _watchdog: asyncio.TimerHandle | None = None
        _served = False  # a request's head was read on this connection
        _idle_since = 0.0

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            peer = peer_of(transport)
            why = bounds.admit(peer)
            if why is not None:
                transport.write(refusal(why))
                transport.close()
                return
            self._admitted, self._peer = True, peer
            self._idle_since = self.loop.time()
            self._watchdog = self.loop.call_later(bounds.header_timeout_s, self._watch)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._watchdog is not None:
                self._watchdog.cancel()
            if self._admitted:
                bounds.release(self._peer)
                self._admitted = False
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            self._served = True
            self._idle_since = self.loop.time()
            super().on_response_complete()

        def _busy(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is not None and not cycle.response_complete

        def _watch(self) -> None:
            if self.transport.is_closing():
                return
            now = self.loop.time()
            if self._busy():  # a request being served: look again once it could have gone idle
                self._watchdog = self.loop.call_later(bounds.idle_timeout_s, self._watch)
                return
            limit = bounds.idle_timeout_s if self._served else bounds.header_timeout_s
            left = self._idle_since + limit - now
            if left <= 0:
                self.transport.close()
                return
            self._watchdog = self.loop.call_later(left, self._watch)

    return BoundedProtocol
