"""The capture proxy as an ASGI app: one per process, sessions selected by the presented API key.

What a harness's wire API looks like is its dialect's business (core/capture/dialects): the routes,
reading the request, translating it for the engine and the engine's answer back, assembling the
turn. The core here does the same for every dialect: routing by the dialects' routes, sessions and
the turn limit, the engine call (the session's policy, retries without fields the upstream rejects,
aborting when the rollout ends), secret masking, recording and the endpoint probe. Each call, to the
engine or passed through to an upstream that speaks the dialect's own API (core/capture/passthrough.py),
is admitted, posted, relayed and recorded the same way (core/capture/call.py). Streamed answers
go on chunk by chunk as they arrive, so time to first token through the proxy stays the upstream's.

Secrets (the upstream key, registered ones: core/capture/redact.py) are masked in everything passed
back to the harness and everything recorded: error bodies (read whole), answers and streams (line
by line), request messages and tools as recorded, error strings and log lines. The turn records what
the harness was given.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import aiohttp

from harness_env.core.capture import fastjson, request_guard
from harness_env.core.capture.asgi import BodyTooLarge, Receive, Reply, Scope, Send, error_reply, read_body, route_path, send_reply
from harness_env.core.capture.assemble import TurnDraft
from harness_env.core.capture.call import ModelCall, admit, over_limit
from harness_env.core.capture.continuity import Continuity, as_chunks, continued_turn
from harness_env.core.capture.continuity_stream import streamed_reply
from harness_env.core.capture.dialects import CHAT_COMPLETIONS, ChatRequest, Dialect, Route, RouteTable, registered_dialects
from harness_env.core.capture.passthrough import pass_through
from harness_env.core.capture.probe import PROBE_TEMPERATURES, PROBE_TIMEOUT_S, PROBE_TOP_LOGPROBS, ProbeResult, classify, probe_body, probe_rejected_fields
from harness_env.core.capture.record import CallRequest, CapturedTurn
from harness_env.core.capture.redact import masked
from harness_env.core.capture.request_bytes import RequestBytes, TooManyBytes
from harness_env.core.capture.retries import request_key
from harness_env.core.capture.rewrite import CapturePolicy, EndpointQuirks, may_name_an_added_field, rewrite_request
from harness_env.core.capture.session import CaptureSession, new_session_key
from harness_env.core.capture.weights import WeightVersions
from harness_env.core.errors import InvalidRequestError
from harness_env.models import Endpoint

MAX_REQUEST_BYTES = 64 * 1024 * 1024
MAX_FIELD_RETRIES = 4


class CaptureProxy:
    """Owns the sessions, the upstream HTTP client, the per-endpoint quirks and the dialects' routes
    (those registered when it is made, unless `dialects` names others)."""

    def __init__(
        self,
        *,
        read_timeout_s: float = 900.0,
        connect_timeout_s: float = 10.0,
        dialects: Iterable[Dialect] | None = None,
        request_bytes: RequestBytes | None = None,
    ) -> None:
        self._routes = RouteTable(registered_dialects() if dialects is None else dialects)
        self._sessions: dict[str, CaptureSession] = {}
        self._quirks: dict[tuple[str, str], EndpointQuirks] = {}  # (base_url, model) -> what it rejects
        self._probes: dict[tuple[str, str], asyncio.Future[ProbeResult]] = {}
        self._field_probes: dict[tuple[Any, ...], asyncio.Future[bool | None]] = {}
        self._client: aiohttp.ClientSession | None = None
        self._request_bytes = request_bytes or RequestBytes()
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s)
        self.weights = WeightVersions()  # the policy's weight version, as the trainer announces it
        self._continuity = Continuity()
        self.app = self  # the proxy is its own ASGI app (an async __call__, detected as ASGI 3)

    # -- sessions ---------------------------------------------------------------------------
    def open_session(self, endpoint: Endpoint, policy: CapturePolicy, on_turn: Callable[[CapturedTurn], None] | None = None) -> CaptureSession:
        session = CaptureSession(key=new_session_key(), endpoint=endpoint, policy=policy, on_turn=on_turn, weights=self.weights)
        self._sessions[session.key] = session
        return session

    async def close_session(self, session: CaptureSession) -> None:
        """Forget the key (later requests get 401) and abort the session's upstream calls."""
        self._sessions.pop(session.key, None)
        session.close()

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
            request = CHAT_COMPLETIONS.read_request(probe_body(temperature), {})
            try:
                reply = await asyncio.wait_for(self._call_engine(self._probe_call(session), request), PROBE_TIMEOUT_S)
                if reply.after is not None and reply.stream is None:
                    reply.after()  # a whole answer is recorded once it is sent: nobody sends this one
            except TimeoutError:
                return ProbeResult("none", None, f"the probe call got no answer within {PROBE_TIMEOUT_S}s")
            turns.extend(session.sorted_turns())  # the recorded call, with its token lists
        result = classify(*turns)
        if result.capture_level == "tokens" and await self._continuity.max_model_len(self._http(), endpoint, self._headers(endpoint, False)):
            result = dataclasses.replace(result, detail=result.detail + "; it continues threads in token ids (render and generate routes)")
        return result

    async def endpoint_answers(self, endpoint: Endpoint) -> bool:
        """Whether `endpoint` answers the proxy's own one-token call now (never cached). A 5xx the
        agent's calls got while this succeeds came from what those calls carried, not from an
        endpoint that is down."""
        session = CaptureSession(key="probe", endpoint=endpoint, policy=CapturePolicy(capture=False))
        request = CHAT_COMPLETIONS.read_request(probe_body(0.0), {})
        try:
            reply = await asyncio.wait_for(self._call_engine(self._probe_call(session), request), PROBE_TIMEOUT_S)
        except TimeoutError:
            return False
        if reply.after is not None and reply.stream is None:
            reply.after()
        return any(t.upstream_status == 200 for t in session.turns)

    def _probe_call(self, session: CaptureSession) -> ModelCall:
        """The proxy's own call: not the agent's, so counted against none of its limits."""
        return ModelCall(CHAT_COMPLETIONS, session, CallRequest(0, "auxiliary", False, [], []), self._http)

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)

    def _http(self) -> aiohttp.ClientSession:
        # aiohttp, not httpx: its C HTTP parser keeps the per-call and per-chunk cost well under a
        # millisecond (bench/proxy.py). trust_env stays off: host proxy settings must not reroute
        # policy traffic.
        if self._client is None:
            self._client = aiohttp.ClientSession(
                timeout=self._timeout, connector=aiohttp.TCPConnector(limit=1024, ttl_dns_cache=300), auto_decompress=False, skip_auto_headers=("User-Agent",)
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
        found = self._routes.find(method, path)
        if found is None:
            reply = error_reply(404, f"no route {method} {path}; the proxy serves {self._routes.model_calls()}", "not_found")
        else:
            reply = await self._serve(found[0], found[1], scope, receive)
        await send_reply(send, reply)

    async def _serve(self, dialect: Dialect, route: Route, scope: Scope, receive: Receive) -> Reply:
        if route.keyless:  # a reachability probe: no model call, nothing shown but that the proxy is up
            return dialect.local_reply(route, None, scope)
        key = dialect.presented_key(scope)
        session = self._sessions.get(key) if key else None
        if session is None:
            return dialect.error(401, "unknown or expired capture key", "invalid_api_key")
        if session.quiesced and route.model_call:
            return dialect.error(409, "the agent's run is over: no more model calls for this rollout", "run_over")
        if not route.model_call:
            return dialect.local_reply(route, session, scope)
        with self._request_bytes.held(session.key) as count:
            try:
                raw = await read_body(receive, MAX_REQUEST_BYTES, count)
            except BodyTooLarge:
                return dialect.error(413, f"request body over {MAX_REQUEST_BYTES} bytes", "request_too_large")
            except TooManyBytes as e:
                if e.status == 429:  # the rollout's own doing, like its budgets
                    session.upstream_result(ok=False, infra=False)
                return dialect.error(e.status, f"harness-env: {e.message}", e.code)
            return await self._serve_body(dialect, session, scope, raw)

    async def _serve_body(self, dialect: Dialect, session: CaptureSession, scope: Scope, raw: bytes) -> Reply:
        try:  # every shape a hostile body can take is a 400 here (core/capture/request_guard.py)
            body = request_guard.parse_body(raw)
            if session.endpoint.wire_api != "chat":  # an upstream that speaks the harness's dialect: no translation
                return await pass_through(dialect, session, self._http, scope, raw, body)
            request = request_guard.read_request(dialect, body, scope, session.sampled_arguments)
            engine_body = request_guard.engine_body(dialect, request)
        except InvalidRequestError as e:
            return dialect.error(400, session.redact(str(e)), "invalid_request")
        key, arrived = request_key(scope, raw), time.monotonic()
        earlier = await session.replays.earlier_answer(key)
        if earlier is not None:  # a retry (core/capture/retries.py): the same answer, never a second sample
            refused = over_limit(dialect, session, request.purpose, len(raw))
            if refused is not None:
                return refused
            session.record_retry(earlier, request.purpose, request.stream, time.monotonic() - arrived)
            return earlier.reply()
        try:
            call = admit(dialect, session, self._http, raw, request.purpose, request.stream, request.messages, request.tools)
            if isinstance(call, Reply):  # refused before any call (a limit): nothing to give a retry
                session.replays.forget(key)
                return call
            reply = await self._call_engine(call, request, engine_body)
        except BaseException:
            session.replays.forget(key)
            raise
        return session.replays.keep(key, reply, call.index, call.answered_whole)

    # -- the engine call ----------------------------------------------------------------------
    def _endpoint_quirks(self, endpoint: Endpoint) -> EndpointQuirks:
        return self._quirks.setdefault((endpoint.base_url, endpoint.model), EndpointQuirks())

    def _headers(self, endpoint: Endpoint, stream: bool) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if stream else "application/json",
            "accept-encoding": "identity",  # bytes are relayed as they come: no compression to undo
        }
        key = endpoint.api_key.get_secret_value()
        if key:
            headers["authorization"] = f"Bearer {key}"
        return headers

    async def _probe_fields(self, endpoint: Endpoint, policy: CapturePolicy) -> None:
        """Find out, with a request of the proxy's own (no agent shaped it), which of the fields
        `policy` adds the endpoint rejects; once per endpoint and set of added fields, shared by
        concurrent sessions. A probe that got no clear answer is not remembered."""
        key = (endpoint.base_url, endpoint.model, *policy.added_fields_key)
        task = self._field_probes.get(key)
        if task is None:
            task = self._field_probes[key] = asyncio.ensure_future(
                probe_rejected_fields(self._http(), endpoint, self._headers(endpoint, False), policy, self._endpoint_quirks(endpoint))
            )
        if await asyncio.shield(task) is None:
            self._field_probes.pop(key, None)

    async def _call_engine(self, call: ModelCall, request: ChatRequest, engine_body: dict[str, Any] | None = None) -> Reply:
        dialect, session = call.dialect, call.session
        endpoint = session.endpoint
        quirks = self._endpoint_quirks(endpoint)
        headers = self._headers(endpoint, request.stream)
        url = endpoint.base_url + "/chat/completions"
        if engine_body is None:  # the probe's own request; a harness's was checked by request_guard
            engine_body = dialect.engine_body(request)
        # Decided once: the call's retries keep it, whatever calls the session admitted meanwhile.
        call.request.constrained = session.constrains(call.request.purpose)
        for _attempt in range(MAX_FIELD_RETRIES + 1):
            known = quirks.snapshot()
            upstream_body, added, dropped = rewrite_request(engine_body, session.policy, quirks, endpoint.model, constrained=call.request.constrained)
            session.note_dropped(dropped)
            held_from = time.monotonic() if self.weights.syncing else None
            call.request.weight_version = await self.weights.current(lambda: session.closed or session.quiesced)  # after a sync
            if held_from is not None:
                session.sync_held_s += time.monotonic() - held_from
            if session.closed or session.quiesced:  # ended while the sync held it back
                return call.unanswered(None, "aborted: the rollout ended", 499)
            if _attempt == 0 and session.policy.continuity == "tokens" and session.policy.capture:
                spliced = await self._continue_in_tokens(call, request, upstream_body)
                if spliced is not None:
                    return spliced
            resp = await call.post(url, fastjson.dumps(upstream_body), headers)
            if isinstance(resp, Reply):
                return resp
            if resp.status >= 400:
                content = await call.error_body(resp)
                # The agent shaped this request, and an error may quote it: only the proxy's own
                # probe says whether the endpoint rejects a field we added. Retried only when that
                # changed what is sent.
                if may_name_an_added_field(resp.status, content, added, quirks):
                    await self._probe_fields(endpoint, session.policy)
                    if quirks.snapshot() != known:
                        session.log(
                            f"turn {call.index}: the endpoint rejects fields the proxy adds "
                            f"({', '.join(sorted(quirks.dropped)) or 'max_tokens'}); retrying without them"
                        )
                        continue
                content = await call.refused(resp.status, content)
                return dialect.upstream_error(resp.status, content, call.content_type(resp))
            break
        else:  # pragma: no cover - each retry changes the request, so this needs >4 distinct rejections
            return call.unanswered(None, "upstream kept rejecting request fields", 502)

        draft = TurnDraft()
        if request.stream and "text/event-stream" in resp.headers.get("content-type", ""):
            return call.relay(dialect.stream(request, draft), draft, resp)
        content = await call.whole(resp)
        if isinstance(content, Reply):
            return content
        return self._whole_reply(call, request, resp.status, content, call.content_type(resp), draft)

    @staticmethod
    def _whole_reply(call: ModelCall, request: ChatRequest, status: int, content: bytes, content_type: str, draft: TurnDraft) -> Reply:
        answer, content_type = call.dialect.answer(request, content, content_type, draft)
        latency = time.monotonic() - call.started

        def record() -> None:  # once the harness has the answer: off its latency
            call.answered(draft, None, latency)

        return Reply(status, answer, content_type, after=record)

    async def _continue_in_tokens(self, call: ModelCall, request: ChatRequest, upstream_body: dict[str, Any]) -> Reply | None:
        """The reply to a call that continues a thread, sent as token ids (core/capture/continuity.py);
        None: it goes the normal way."""
        session = call.session
        headers = self._headers(session.endpoint, False)
        max_model_len = await self._continuity.max_model_len(self._http(), session.endpoint, headers)
        if max_model_len is None:
            return None
        session.continuity = "tokens"
        continues_final = request.body.get("continue_final_message") is True  # chat's way to go on with the last message
        prev = continued_turn(request.messages, request.tools, session.turns, continues_final)
        if prev is None or len(upstream_body.get("messages") or ()) != len(request.messages):
            return None
        endpoint_key = (session.endpoint.base_url, session.endpoint.model)
        if request.stream and endpoint_key not in self._continuity.cannot_stream:
            prepared = await self._continuity.prompt(call, upstream_body, prev, headers)
            if not isinstance(prepared, tuple):
                return prepared
            draft = TurnDraft()
            translation = call.dialect.stream(request, draft)  # fed the derendered chunks as a relayed stream is
            streamed = await streamed_reply(call, upstream_body, prepared[0], prepared[1], max_model_len, headers, translation, draft)
            if not isinstance(streamed, str):
                return streamed
            self._continuity.cannot_stream.add(endpoint_key)
        got = await self._continuity.answer(call, upstream_body, prev, max_model_len, headers)
        if got is None or isinstance(got, Reply):
            return got
        answer, version = got
        if call.request.weight_version is None:  # the trainer named none: the engine's, when it is a number
            call.request.weight_version = version
        draft = TurnDraft()
        if not request.stream:
            content = await masked(session.answer_redactor, fastjson.dumps(answer))
            return self._whole_reply(call, request, 200, content, "application/json", draft)
        translation = call.dialect.stream(request, draft)  # the engine's chunks, as a relayed stream is read
        sent = translation.feed(await masked(session.answer_redactor, as_chunks(answer))) + translation.close(None)
        ttft = time.monotonic() - call.started

        async def chunks() -> AsyncIterator[bytes]:
            yield sent

        def record() -> None:
            translation.finish()
            call.answered(draft, ttft)

        return Reply(200, content_type=translation.content_type, stream=chunks(), after=record)
