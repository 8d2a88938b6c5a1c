"""The few ASGI pieces the proxy needs, without a framework on its hot path.

A framework's request/response objects and per-response task groups cost more per call and per
streamed chunk than the proxy's own work; bench/proxy.py measures the difference.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from harness_env.core.capture import fastjson

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class BodyTooLarge(Exception):
    pass


@dataclass
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    stream: AsyncIterator[bytes] | None = None  # when set, sent chunk by chunk as it yields
    after: Callable[[], None] | None = None  # runs once the whole reply is sent (or the send failed)
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # beyond content-type and -length


def json_reply(status: int, obj: Any) -> Reply:
    return Reply(status, fastjson.dumps(obj))


def error_reply(status: int, message: str, code: str) -> Reply:
    return json_reply(status, {"error": {"message": message, "type": code, "code": code}})


def route_path(scope: Scope) -> str:
    """The path below where the app is mounted (e.g. under /capture in the server)."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


async def read_body(receive: Receive, limit: int, count: Callable[[int], None] | None = None) -> bytes:
    """The request's body, at most `limit` bytes (BodyTooLarge past it); `count` is told of each
    chunk before it is kept (and may raise to refuse it)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        if count is not None:
            count(len(chunk))
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(chunks)


async def send_reply(send: Send, reply: Reply) -> None:
    headers = [(b"content-type", reply.content_type.encode()), *reply.headers]
    if reply.stream is None:
        headers.append((b"content-length", str(len(reply.body)).encode()))
        try:
            await send({"type": "http.response.start", "status": reply.status, "headers": headers})
            await send({"type": "http.response.body", "body": reply.body})
        finally:
            if reply.after is not None:
                reply.after()
        return
    headers += [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
    try:
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        async for chunk in reply.stream:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        try:
            await reply.stream.aclose()  # type: ignore[attr-defined]
        finally:  # even when closing fails or is cancelled: retries wait on it (core/capture/retries.py)
            if reply.after is not None:
                reply.after()  # bookkeeping after the client has everything: off the latency path
