"""The capture proxy as an ASGI app: one per process, sessions selected by the presented API key.

Streaming answers are forwarded chunk by chunk as they arrive (the raw bytes, untouched but for
secrets), while a decoder on the side assembles the turn record; time to first token through the
proxy stays that of the upstream.

Secrets (the upstream key, registered ones: core/capture/redact.py) are masked in everything passed
back to the harness and everything recorded: error bodies (read whole), answers and streams (line
by line), request messages and tools as recorded, error strings and log lines. The turn records what
the harness was given.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from harness_env.core.capture import fastjson
from harness_env.core.capture.asgi import (
    BodyTooLarge,
    Receive,
    Reply,
    Scope,
    Send,
    error_reply,
    header,
    json_reply,
    read_body,
    route_path,
    send_reply,
)
from harness_env.core.capture.assemble import TurnDraft
from harness_env.core.capture.probe import PROBE_TEMPERATURES, PROBE_TIMEOUT_S, PROBE_TOP_LOGPROBS, ProbeResult, classify, probe_body
from harness_env.core.capture.redact import StreamRedactor
from harness_env.core.capture.rewrite import CapturePolicy, EndpointQuirks, learn_from_rejection, rewrite_request
from harness_env.core.capture.session import CaptureSession, new_session_key
from harness_env.core.capture.sse import SSEDecoder
from harness_env.models import Endpoint, Turn

MAX_REQUEST_BYTES = 64 * 1024 * 1024
MAX_FIELD_RETRIES = 4
MAX_RECORDED_STREAM_BYTES = 64 * 1024 * 1024


def _presented_key(scope: Scope) -> str | None:
    auth = header(scope, b"authorization") or ""
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return header(scope, b"x-api-key") or header(scope, b"api-key")


class CaptureProxy:
    """Owns the sessions, the upstream HTTP client and the per-endpoint quirks."""

    def __init__(self, *, read_timeout_s: float = 900.0, connect_timeout_s: float = 10.0) -> None:
        self._sessions: dict[str, CaptureSession] = {}
        self._quirks: dict[str, EndpointQuirks] = {}
        self._probes: dict[tuple[str, str], asyncio.Future[ProbeResult]] = {}
        self._client: aiohttp.ClientSession | None = None
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s)
        self.app = self  # the proxy is its own ASGI app (an async __call__, detected as ASGI 3)

    # -- sessions ---------------------------------------------------------------------------
    def open_session(
        self, endpoint: Endpoint, policy: CapturePolicy, on_turn: Callable[[Turn], None] | None = None
    ) -> CaptureSession:
        session = CaptureSession(key=new_session_key(), endpoint=endpoint, policy=policy, on_turn=on_turn)
        self._sessions[session.key] = session
        return session

    async def close_session(self, session: CaptureSession) -> None:
        """Forget the key (later requests get 401) and abort the session's upstream calls."""
        session.closed = True
        self._sessions.pop(session.key, None)
        for fut in list(session._pending):
            fut.cancel()
        for resp in list(session._responses):
            resp.close()

    async def probe(self, endpoint: Endpoint) -> ProbeResult:
        """What `endpoint` gives a trainer (core/capture/probe.py); asked once per endpoint and
        model, shared by concurrent rollouts. A failed probe is not remembered."""
        key = (endpoint.base_url, endpoint.model)
        task = self._probes.get(key)
        if task is None:
            task = self._probes[key] = asyncio.ensure_future(self._probe(endpoint))
        result = await asyncio.shield(task)
        if result.capture_level == "none":
            self._probes.pop(key, None)
        return result

    async def _probe(self, endpoint: Endpoint) -> ProbeResult:
        policy = CapturePolicy(capture=True, top_logprobs=PROBE_TOP_LOGPROBS)
        turns = []
        for temperature in PROBE_TEMPERATURES:
            session = CaptureSession(key="probe", endpoint=endpoint, policy=policy)
            turn = Turn(index=0, purpose="auxiliary")
            try:
                await asyncio.wait_for(self._forward(session, probe_body(temperature), turn), PROBE_TIMEOUT_S)
            except TimeoutError:
                return ProbeResult("none", None, f"the probe call got no answer within {PROBE_TIMEOUT_S}s")
            turns.append(turn)
        return classify(*turns)

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)

    def _http(self) -> aiohttp.ClientSession:
        # aiohttp, not httpx: its C HTTP parser keeps the per-call and per-chunk cost well under a
        # millisecond (bench/proxy.py). trust_env stays off: host proxy settings must not reroute
        # policy traffic.
        if self._client is None:
            self._client = aiohttp.ClientSession(
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=1024, ttl_dns_cache=300),
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
        return self._client

    async def aclose(self) -> None:
        for session in list(self._sessions.values()):
            await self.close_session(session)
        if self._client is not None:
            await self._client.close()
            self._client = None

    # -- routes -----------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        path, method = route_path(scope), scope["method"]
        if path == "/v1/chat/completions" and method == "POST":
            reply = await self._chat(scope, receive)
        elif path == "/v1/models" and method == "GET":
            reply = self._models(scope)
        else:
            reply = error_reply(404, f"no route {method} {path}; the proxy serves POST /v1/chat/completions", "not_found")
        await send_reply(send, reply)

    def _session_for(self, scope: Scope) -> CaptureSession | None:
        key = _presented_key(scope)
        return self._sessions.get(key) if key else None

    def _models(self, scope: Scope) -> Reply:
        session = self._session_for(scope)
        if session is None:
            return error_reply(401, "unknown or expired capture key", "invalid_api_key")
        model = session.endpoint.model
        return json_reply(200, {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "harness-env"}]})

    async def _chat(self, scope: Scope, receive: Receive) -> Reply:
        session = self._session_for(scope)
        if session is None:
            return error_reply(401, "unknown or expired capture key", "invalid_api_key")
        try:
            raw = await read_body(receive, MAX_REQUEST_BYTES)
        except BodyTooLarge:
            return error_reply(413, f"request body over {MAX_REQUEST_BYTES} bytes", "request_too_large")
        try:
            body = fastjson.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError as e:
            return error_reply(400, f"request body is not a JSON object: {e}", "invalid_request")
        purpose = "policy" if body.get("tools") else "auxiliary"
        messages, tools = list(body.get("messages") or []), list(body.get("tools") or [])
        if session.redactor.found_in(raw):  # the harness was shown a secret: never record it
            messages, tools = session.redactor.redact_value(messages), session.redactor.redact_value(tools)
        if purpose == "policy" and not session.admit_policy_request():
            limit = session.policy.max_turns
            session.log(f"turn limit of {limit} reached: answered 429")
            session.upstream_result(ok=False, infra=False)
            return error_reply(429, f"harness-env: the turn limit of {limit} model calls for this rollout is reached", "turn_limit")
        turn = Turn(
            index=session.next_index(),
            purpose=purpose,
            stream=bool(body.get("stream")),
            request_messages=messages,
            request_tools=tools,
        )
        return await self._forward(session, body, turn)

    async def _forward(self, session: CaptureSession, body: dict[str, Any], turn: Turn) -> Reply:
        endpoint = session.endpoint
        quirks = self._quirks.setdefault(endpoint.base_url, EndpointQuirks())
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if turn.stream else "application/json",
            "accept-encoding": "identity",  # bytes are relayed as they come: no compression to undo
        }
        key = endpoint.api_key.get_secret_value()
        if key:
            headers["authorization"] = f"Bearer {key}"
        started = time.monotonic()
        url = endpoint.base_url + "/chat/completions"
        for _attempt in range(MAX_FIELD_RETRIES + 1):
            upstream_body, added = rewrite_request(body, session.policy, quirks, endpoint.model)
            session.dropped_fields |= quirks.dropped
            if quirks.use_max_completion_tokens:
                session.dropped_fields.add("max_tokens")
            send = asyncio.ensure_future(self._http().post(url, data=fastjson.dumps(upstream_body), headers=headers))
            session._pending.add(send)
            try:
                resp = await send
            except asyncio.CancelledError:
                return self._finish_error(session, turn, started, None, "aborted: the rollout ended", 499)
            except TimeoutError as e:
                session.upstream_result(ok=False)
                return self._finish_error(session, turn, started, None, f"upstream timeout: {type(e).__name__}", 504)
            except aiohttp.ClientError as e:
                session.upstream_result(ok=False)
                return self._finish_error(session, turn, started, None, f"upstream unreachable: {type(e).__name__}: {e}", 502)
            finally:
                session._pending.discard(send)
            if resp.status >= 400:
                # Read whole (error bodies are small and not streamed), so a key echoed in it is
                # masked wherever it falls.
                try:
                    content = await resp.read()
                except (aiohttp.ClientError, TimeoutError):
                    content = b""
                finally:
                    resp.release()
                changed = learn_from_rejection(resp.status, content, added, quirks)
                if changed:
                    session.log(f"turn {turn.index}: upstream rejected {changed!r}; retrying without it")
                    continue
                session.upstream_result(ok=False, infra=resp.status >= 500)
                content = session.redactor.redact_bytes(content)
                error = content[:2000].decode("utf-8", errors="replace")
                self._record_failure(session, turn, started, resp.status, error, f"upstream answered {resp.status}")
                return Reply(resp.status, content, self._content_type(session, resp, "application/json"))
            break
        else:  # pragma: no cover - each retry changes the request, so this needs >4 distinct rejections
            return self._finish_error(session, turn, started, None, "upstream kept rejecting request fields", 502)

        turn.upstream_status = resp.status
        is_sse = "text/event-stream" in resp.headers.get("content-type", "")
        if turn.stream and is_sse:
            session.upstream_result(ok=True)
            session._responses.add(resp)
            return self._relay(session, turn, resp, started)
        try:
            content = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            session.upstream_result(ok=False)
            return self._finish_error(session, turn, started, resp.status, f"upstream read failed: {type(e).__name__}: {e}", 502)
        finally:
            resp.release()
        session.upstream_result(ok=True)  # only once the answer was read: a failed read is a failure
        content = session.answer_redactor.redact_bytes(content)
        draft = TurnDraft()
        try:
            parsed = fastjson.loads(content)
            if isinstance(parsed, dict):
                draft.add_response(parsed)
            else:
                draft.errors.append("upstream body is not a JSON object")
        except ValueError:
            draft.errors.append(f"upstream body is not JSON: {content[:200]!r}")
        self._finish(session, turn, draft, started, None)
        return Reply(resp.status, content, self._content_type(session, resp, "application/json"))

    @staticmethod
    def _content_type(session: CaptureSession, resp: aiohttp.ClientResponse, default: str) -> str:
        """The one upstream header relayed to the harness, masked like the body."""
        return session.redact(resp.headers.get("content-type", default))

    def _relay(self, session: CaptureSession, turn: Turn, resp: aiohttp.ClientResponse, started: float) -> Reply:
        """Relay an SSE answer: per chunk only a secret scan, a copy and a send, so the bytes go on
        at once; the turn is assembled from the whole stream after the client has it all.

        The scan holds back only an unfinished line (StreamRedactor): the client cannot act on it
        before its line break anyway, and a secret split across two chunks is still masked."""
        raw = bytearray()
        draft = TurnDraft()
        ttft: list[float] = []
        redactor = StreamRedactor(session.answer_redactor)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.content.iter_any():
                    if not ttft:
                        ttft.append(time.monotonic() - started)
                    chunk = redactor.feed(chunk)
                    if chunk:
                        if len(raw) < MAX_RECORDED_STREAM_BYTES:
                            raw.extend(chunk)
                        yield chunk
                rest = redactor.flush()  # a last line without its line break
                if rest:
                    if len(raw) < MAX_RECORDED_STREAM_BYTES:
                        raw.extend(rest)
                    yield rest
            except (aiohttp.ClientError, TimeoutError, RuntimeError) as e:
                draft.errors.append(f"upstream stream broke: {type(e).__name__}: {e}")
            finally:
                session._responses.discard(resp)
                resp.release()

        def record() -> None:
            if len(raw) >= MAX_RECORDED_STREAM_BYTES:
                draft.errors.append(f"stream over {MAX_RECORDED_STREAM_BYTES} bytes: recorded only its start")
            decoder = SSEDecoder()
            for data in [*decoder.feed(bytes(raw)), *decoder.flush()]:
                draft.add_chunk_text(data)
            self._finish(session, turn, draft, started, ttft[0] if ttft else None)

        return Reply(resp.status, content_type="text/event-stream", stream=chunks(), after=record)

    # -- recording --------------------------------------------------------------------------
    def _finish(self, session: CaptureSession, turn: Turn, draft: TurnDraft, started: float, ttft: float | None) -> None:
        for name, value in draft.fields().items():
            setattr(turn, name, value)
        turn.latency_s = time.monotonic() - started
        turn.ttft_s = ttft
        if draft.errors:
            turn.upstream_error = session.redact("; ".join(draft.errors)[:2000])
        session.log(
            f"turn {turn.index} ({turn.purpose}, stream={turn.stream}): {turn.upstream_status} in {turn.latency_s:.2f}s, "
            f"{len(turn.completion_token_ids)} completion ids, {len(turn.per_token_logps)} logprobs, "
            f"{len(turn.tool_calls)} tool calls, finish={turn.finish_reason}"
            + (f", error: {turn.upstream_error[:200]}" if turn.upstream_error else "")
        )
        session.record(turn)

    @staticmethod
    def _record_failure(session: CaptureSession, turn: Turn, started: float, status: int | None, error: str, log_line: str) -> None:
        turn.upstream_status = status
        turn.upstream_error = session.redact(error)
        turn.latency_s = time.monotonic() - started
        session.log(f"turn {turn.index}: {log_line}")
        session.record(turn)

    def _finish_error(
        self, session: CaptureSession, turn: Turn, started: float, status: int | None, message: str, answer_status: int
    ) -> Reply:
        """Record a call that got no usable answer and tell the harness, as an upstream would."""
        self._record_failure(session, turn, started, status, message, message)
        return error_reply(answer_status, session.redact(message), "upstream_error")
