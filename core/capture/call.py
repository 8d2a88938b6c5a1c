"""One model call through the proxy, from its admission to its record: what the engine path
(core/capture/proxy.py) and pass-through (core/capture/passthrough.py) do alike.

`admit` counts the call against the rollout's limits (or answers 429) and notes what it asked; the
`ModelCall` then posts it upstream as a call the session can abort, reads or relays the answer
(secrets masked) and records how it ended, once (core/capture/record.py). A failure to get an
answer is the dialect's reply to the harness (499 aborted, 504 timeout, 502 unreachable).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from harness_env.core.capture.asgi import Reply
from harness_env.core.capture.assemble import TurnDraft
from harness_env.core.capture.dialects import Dialect, StreamTranslation
from harness_env.core.capture.record import CallOutcome, CallRequest, CapturedTurn
from harness_env.core.capture.redact import StreamRedactor, masked
from harness_env.core.capture.session import CaptureSession
from harness_env.models import TurnPurpose


def over_limit(dialect: Dialect, session: CaptureSession, purpose: TurnPurpose, size: int) -> Reply | None:
    """A 429 once a limit of the rollout is reached (a budget, or the turn limit: this request
    counts as a model call), before anything is recorded or sent; None: it may go on. A retry
    answered from the record counts too (core/capture/retries.py): replays are no way round them."""
    refused = session.over_budget(purpose, size)
    if refused is not None:
        code, message = refused
        session.log(f"{message}: answered 429")
        session.upstream_result(ok=False, infra=False)
        return dialect.error(429, f"harness-env: {message}", code)
    if purpose == "policy" and not session.admit_policy_request():
        limit = session.policy.max_turns
        session.log(f"turn limit of {limit} reached: answered 429")
        session.upstream_result(ok=False, infra=False)
        return dialect.error(429, f"harness-env: the turn limit of {limit} model calls for this rollout is reached", "turn_limit")
    return None


def admit(
    dialect: Dialect,
    session: CaptureSession,
    http: Callable[[], aiohttp.ClientSession],
    raw: bytes,
    purpose: TurnPurpose,
    stream: bool,
    messages: list[Any],
    tools: list[Any],
) -> ModelCall | Reply:
    """The call about to go upstream, or a 429 once a limit of the rollout is reached (the turn
    limit, or a budget: auxiliary calls, recorded bytes). `http`: the proxy's client, made on use."""
    if session.redactor.found_in(raw):  # the harness was shown a secret: never record it
        messages, tools = session.redactor.redact_value(messages), session.redactor.redact_value(tools)
    refused = over_limit(dialect, session, purpose, len(raw))
    if refused is not None:
        return refused
    # The record's own copies (a dialect may reuse the request's objects for the engine's body).
    request = CallRequest(session.next_index(), purpose, stream, [dict(m) for m in messages], [dict(t) for t in tools])
    session.hold(request.index, purpose, len(raw))
    return ModelCall(dialect, session, request, http)


class ModelCall:
    """An admitted call: post it, take its answer, record how it ended (see the module docstring)."""

    def __init__(self, dialect: Dialect, session: CaptureSession, request: CallRequest, http: Callable[[], aiohttp.ClientSession]) -> None:
        self.dialect, self.session, self.request, self._http = dialect, session, request, http
        self.started = time.monotonic()
        self.status: int | None = None  # the upstream's answer status, once it answered
        self.recorded: CapturedTurn | None = None  # the call's turn, once recorded

    @property
    def index(self) -> int:
        return self.request.index

    def http(self) -> aiohttp.ClientSession:
        """The proxy's upstream client (a call that makes several engine calls: continuity)."""
        return self._http()

    def answered_whole(self) -> bool:
        """The call's turn is recorded with the engine's answer, nothing broken: a retry of the
        same request may be given it (core/capture/retries.py)."""
        t = self.recorded
        return t is not None and t.upstream_status == 200 and not t.upstream_error

    async def post(self, url: str, data: bytes, headers: dict[str, str], **options: Any) -> aiohttp.ClientResponse | Reply:
        """POST upstream; the response, or the reply for a call that got none (recorded)."""
        session = self.session
        call = asyncio.ensure_future(self._http().post(url, data=data, headers=headers, **options))
        session.add_upstream_call(call)
        try:
            return await call
        except asyncio.CancelledError:
            return self.unanswered(None, "aborted: the rollout ended", 499)
        except TimeoutError as e:
            session.upstream_result(ok=False)
            return self.unanswered(None, f"upstream timeout: {type(e).__name__}", 504)
        except aiohttp.ClientError as e:
            session.upstream_result(ok=False)
            return self.unanswered(None, f"upstream unreachable: {type(e).__name__}: {e}", 502)
        finally:
            session.discard_upstream_call(call)

    def content_type(self, resp: aiohttp.ClientResponse) -> str:
        """The one upstream header relayed to the harness, masked like the body."""
        return self.session.redact(resp.headers.get("content-type", "application/json"))

    @staticmethod
    async def error_body(resp: aiohttp.ClientResponse) -> bytes:
        """An error answer, read whole (error bodies are small and not streamed), so a key echoed
        in it is masked wherever it falls."""
        try:
            return await resp.read()
        except (aiohttp.ClientError, TimeoutError):
            return b""
        finally:
            resp.release()

    async def refused(self, status: int, content: bytes) -> bytes:
        """Record the upstream's error answer; its body with secrets masked, for the harness."""
        self.session.upstream_result(ok=False, infra=status >= 500)
        content = await masked(self.session.redactor, content)
        self.failed(status, content[:2000].decode("utf-8", errors="replace"), f"upstream answered {status}")
        return content

    async def whole(self, resp: aiohttp.ClientResponse) -> bytes | Reply:
        """A whole answer, secrets masked, or the reply for a read that failed (recorded)."""
        self.status = resp.status
        try:
            content = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            self.session.upstream_result(ok=False)
            return self.unanswered(resp.status, f"upstream read failed: {type(e).__name__}: {e}", 502)
        finally:
            resp.release()
        self.session.upstream_result(ok=True)  # only once the answer was read: a failed read is a failure
        return await masked(self.session.answer_redactor, content)

    def relay(self, translation: StreamTranslation, draft: TurnDraft, resp: aiohttp.ClientResponse) -> Reply:
        """Relay an SSE answer: per chunk a secret scan and the translation (for chat completions
        and pass-through a copy), so the bytes go on at once; the turn is recorded after the client
        has it all.

        The scan holds back only an unfinished line (StreamRedactor): the client cannot act on it
        before its line break anyway, and a secret split across two chunks is still masked."""
        session, started = self.session, self.started
        self.status = resp.status
        session.upstream_result(ok=True)
        session.add_relayed_answer(resp)
        ttft: list[float] = []
        redactor = StreamRedactor(session.answer_redactor)

        async def chunks() -> AsyncIterator[bytes]:
            broke = None
            try:
                async for chunk in resp.content.iter_any():
                    if not ttft:
                        ttft.append(time.monotonic() - started)
                    chunk = redactor.relay(chunk, translation.feed)
                    if chunk:
                        yield chunk
                rest = redactor.relay(b"", translation.feed, last=True)  # a last line without its line break
                if rest:
                    yield rest
            except (aiohttp.ClientError, TimeoutError, RuntimeError) as e:
                broke = f"upstream stream broke: {type(e).__name__}: {e}"
                draft.errors.append(broke)
            finally:
                session.discard_relayed_answer(resp)
                resp.release()
            tail = translation.close(broke)
            if tail:
                yield tail

        def record() -> None:
            translation.finish()
            self.answered(draft, ttft[0] if ttft else None)

        return Reply(resp.status, content_type=translation.content_type, stream=chunks(), after=record)

    # -- recording, once ----------------------------------------------------------------------
    def answered(self, draft: TurnDraft, ttft: float | None, latency: float | None = None) -> None:
        """Record the answer `draft` assembled (`latency`: measured before, when the recording
        waits for the send)."""
        session = self.session
        latency = time.monotonic() - self.started if latency is None else latency
        draft.read_unread()
        error = session.redact("; ".join(draft.errors)[:2000]) if draft.errors else None
        turn = self.recorded = session.record(self.request, CallOutcome(self.status, error, latency, ttft), draft)
        session.log(
            f"turn {turn.index} ({turn.purpose}, stream={turn.stream}): {turn.upstream_status} in {turn.latency_s:.2f}s, "
            f"{len(turn.completion)} completion ids, {len(turn.logps)} logprobs, "
            f"{len(turn.tool_calls)} tool calls, finish={turn.finish_reason}" + (f", error: {turn.upstream_error[:200]}" if turn.upstream_error else "")
        )
        for call in turn.tool_calls:  # what a harness handed them as text may write back otherwise
            session.sampled_arguments.wrote(call.get("id"), (call.get("function") or {}).get("arguments"))

    def failed(self, status: int | None, error: str, log_line: str) -> None:
        """Record a call that got no answer to read (`status`: the upstream's, if it answered)."""
        session = self.session
        self.recorded = session.record(self.request, CallOutcome(status, session.redact(error), time.monotonic() - self.started))
        session.log(f"turn {self.index}: {log_line}")

    def unanswered(self, status: int | None, message: str, answer_status: int) -> Reply:
        """Record a call that got no usable answer and tell the harness, as an upstream would."""
        self.failed(status, message, message)
        return self.dialect.error(answer_status, self.session.redact(message), "upstream_error")
