"""Retried requests never sample twice: a request whose body equals one already answered, or still
in flight, in the same session gets that call's answer again (the same bytes, streamed the same
way when it was streamed), recorded as a `retry` turn without tokens (core/capture/session.py).

Harnesses do retry: Claude Code re-sends a call after its API timeout, whatever the engine was
still doing for it. A second sample of the same prompt would give the trainer two answers where
the harness acted on one. Only an answer the engine gave whole (HTTP 200, nothing broken) is kept;
a retry of a failed call is sent again, as the harness meant. The few latest answers are kept:
harnesses retry at once, and a session must not hold every answer twice.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from harness_env.core.capture.asgi import Reply, Scope, route_path

KEPT_ANSWERS = 8  # per session: answers a retry may still be given


@dataclass(frozen=True, slots=True)
class Answer:
    """What a call gave the harness, as sent: a whole body, or the stream's chunks in order."""

    index: int  # the turn it was recorded as
    status: int
    content_type: str
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""
    chunks: tuple[bytes, ...] | None = None

    def reply(self) -> Reply:
        if self.chunks is None:
            return Reply(self.status, self.body, self.content_type, headers=list(self.headers))
        return Reply(self.status, content_type=self.content_type, stream=_replayed(self.chunks), headers=list(self.headers))


async def _replayed(chunks: tuple[bytes, ...]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def request_key(scope: Scope, raw: bytes) -> bytes:
    """The request's identity: its route, query (Gemini streams by `?alt=sse`) and body bytes."""
    h = hashlib.sha256()  # OpenSSL's, on the CPU's SHA instructions where it has them: twice blake2b's speed here
    for part in (route_path(scope).encode(), scope.get("query_string", b""), raw):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()


class Replays:
    """A session's answers by request key: in flight (a future) or given (kept, the latest few)."""

    def __init__(self) -> None:
        self._calls: OrderedDict[bytes, asyncio.Future[Answer | None]] = OrderedDict()

    async def earlier_answer(self, key: bytes) -> Answer | None:
        """The answer of an equal request (awaited while it is in flight), or None: then this
        request is the one sent, and `keep` must be called with its reply."""
        while (earlier := self._calls.get(key)) is not None:
            answer = await asyncio.shield(earlier)
            if answer is not None:
                return answer
            # the earlier call failed and was forgotten: another waiter may have claimed it since
        self._calls[key] = asyncio.get_running_loop().create_future()
        return None

    def keep(self, key: bytes, reply: Reply, index: int, recorded_ok: Callable[[], bool]) -> Reply:
        """`reply`, made to keep what it sends for equal requests once it is sent whole.
        `recorded_ok()` says, once the reply is sent (its turn recorded), whether the engine's
        answer came whole; `index` is the call's turn."""
        if reply.status != 200:
            self._settle(key, None)
            return reply
        after, sent = reply.after, _Sent(reply)

        def settle() -> None:
            try:
                if after is not None:
                    after()
            finally:
                whole = sent.complete and recorded_ok()
                self._settle(key, Answer(index, reply.status, reply.content_type, reply.headers, reply.body, sent.chunks) if whole else None)

        reply.stream, reply.after = sent.stream, settle
        return reply

    def _settle(self, key: bytes, answer: Answer | None) -> None:
        future = self._calls.get(key)
        if future is not None and not future.done():
            future.set_result(answer)
        if answer is None:
            self._calls.pop(key, None)
            return
        self._calls.move_to_end(key)
        done = [k for k, f in self._calls.items() if f.done()]
        for k in done[: max(0, len(done) - KEPT_ANSWERS)]:
            del self._calls[k]

    def forget(self, key: bytes) -> None:
        """The sent call ended without a reply to keep (an exception): waiters send their own."""
        self._settle(key, None)


class _Sent:
    """Collects a streamed reply's chunks as they are sent; a whole reply is complete at once."""

    def __init__(self, reply: Reply) -> None:
        self.chunks: tuple[bytes, ...] | None = None
        self.complete = reply.stream is None
        self._kept: list[bytes] = []
        self.stream = None if reply.stream is None else self._collect(reply.stream)

    async def _collect(self, stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        try:
            async for chunk in stream:
                self._kept.append(chunk)
                yield chunk
            self.chunks, self.complete = tuple(self._kept), True
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
