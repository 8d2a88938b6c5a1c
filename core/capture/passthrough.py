"""Pass-through: an upstream that speaks the harness's own wire API (an endpoint whose `wire_api`
is not "chat", e.g. a hosted Anthropic endpoint used for evaluation) gets the harness's request as
the harness sent it, with no translation, in `black_box` mode only, bounded first as the engine's
body is (core/capture/native_guard.py: the max-tokens cap, one answer, nothing to fetch).

Only the key changes hands (and the model's name, if the harness knows it by another): the harness
presents its capture key, and the upstream is sent the real one in its dialect's own header. The
answer goes back as it arrives, unchanged but for masked secrets (the proxy's StreamRedactor, line
by line). The turn is still recorded, read from the native
answer: text, tool calls, stop reason, usage, latency, status (token ids exist only where the
engine's chat completions give them, so there are none), and the turn limit still applies.

Why black_box only: token ids and logprobs come from the engine's chat completions; a native
upstream gives neither, so a `transparent_proxy` rollout would train on nothing (refused up front by
`check_wire_api`).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode

import aiohttp

from harness_env.core.capture import fastjson, native_guard, request_guard
from harness_env.core.capture.asgi import Reply, Scope, route_path
from harness_env.core.capture.assemble import TurnDraft
from harness_env.core.capture.dialects.base import Dialect
from harness_env.core.capture.redact import masked
from harness_env.core.capture.session import CaptureSession
from harness_env.core.capture.sse import SSEDecoder
from harness_env.core.errors import InvalidRequestError
from harness_env.models import RolloutRequest
from harness_env.models_base import WireApi

if TYPE_CHECKING:
    from harness_env.core.capture.proxy import CaptureProxy

# An endpoint's wire_api -> the proxy dialect that serves it.
DIALECT_OF: dict[WireApi, str] = {"chat": "chat_completions", "responses": "responses", "messages": "messages", "gemini": "gemini"}
# How each passed-through dialect's upstream wants its key.
AUTH_HEADERS: dict[str, tuple[str, str]] = {
    "responses": ("authorization", "Bearer {key}"),
    "messages": ("x-api-key", "{key}"),
    "gemini": ("x-goog-api-key", "{key}"),
}
# Not relayed to the upstream: the capture key (whatever header carries it), connection-level
# headers, and encodings we would have to undo (bytes are relayed as they come).
DROPPED_HEADERS = frozenset({
    "authorization", "x-api-key", "api-key", "x-goog-api-key", "cookie", "host", "content-length", "connection",
    "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-authorization", "accept-encoding", "expect",
})
VERSION_SEGMENTS = ("v1", "v1beta", "v1alpha")


def check_wire_api(request: RolloutRequest, harness_dialect: str | None) -> None:
    """Refuse, before anything starts, an endpoint whose wire API this rollout cannot use.
    `harness_dialect`: the dialect the harness speaks (None: the harness checks for itself)."""
    wire_api = request.endpoint.wire_api
    if wire_api == "chat":
        return
    if request.mode != "black_box":
        raise InvalidRequestError(
            f"endpoint wire_api {wire_api!r} works only in black_box mode: token ids and logprobs come from the engine's chat "
            "completions, which a native upstream does not give; use mode='black_box', or point at a chat-completions endpoint "
            "(wire_api='chat') to train"
        )
    if harness_dialect is not None and harness_dialect != DIALECT_OF[wire_api]:
        raise InvalidRequestError(
            f"harness {request.harness!r} speaks {harness_dialect}, but the endpoint's wire_api is {wire_api!r}, passed through "
            f"untranslated; use a harness that speaks {DIALECT_OF[wire_api]}, or a chat-completions endpoint (wire_api='chat')"
        )


def upstream_url(base_url: str, path: str, query: bytes) -> str:
    """The upstream's own route for the harness's path: `base_url` is the API's root with or without
    its version segment (`https://api.example/v1` + `/v1/messages`, or a `/v1beta/...` path, which
    replaces a `/v1` the base URL ends in). The `key` query parameter (Google's clients may carry
    the capture key there) is left out: the key goes in a header."""
    root = base_url.rstrip("/")
    parent, last = root.rsplit("/", 1)
    if last in VERSION_SEGMENTS and path.lstrip("/").split("/", 1)[0] in VERSION_SEGMENTS:
        root = parent
    kept = [(k, v) for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True) if k != "key"]
    return root + path + (f"?{urlencode(kept)}" if kept else "")


def with_model(dialect: Dialect, path: str, raw: bytes, body: dict[str, Any], model: str) -> tuple[str, bytes]:
    """The path and body with the endpoint's model where the harness named one: a harness may know
    the model by another name (Harbor prefixes it; Gemini CLI writes `/` as `--` in the path), and the
    upstream serves the rollout's model, as the engine does for translated calls. The body is
    re-serialised only when its `model` differs."""
    for route in dialect.routes:
        params = route.match(path)
        if params and "model" in params and params["model"] != model:
            path = path.replace(f"/models/{params['model']}:", f"/models/{model}:", 1)
            break
    if isinstance(body.get("model"), str) and body["model"] != model:
        raw = fastjson.dumps({**body, "model": model})
    return path, raw


def upstream_headers(dialect: str, scope: Scope, key: str) -> dict[str, str]:
    """The harness's headers (its API version and beta flags, ...) minus its capture key, plus the
    upstream key where its dialect expects it."""
    headers = {}
    for name, value in scope.get("headers", ()):
        lower = name.decode("latin-1").lower()
        if lower not in DROPPED_HEADERS:
            headers[lower] = value.decode("latin-1")
    headers["accept-encoding"] = "identity"
    if key:
        name, template = AUTH_HEADERS[dialect]
        headers[name] = template.format(key=key)
    return headers


# -- reading a native answer into the turn --------------------------------------------------------
def _call(draft: TurnDraft, slot: int, call_id: Any, name: Any, arguments: str = "") -> dict[str, Any]:
    call = {"id": call_id, "type": "function", "function": {"name": str(name or ""), "arguments": arguments}}
    draft.tool_calls[slot] = call
    return call


def read_messages_event(draft: TurnDraft, event: dict[str, Any], blocks: dict[int, dict[str, Any]]) -> None:
    """An Anthropic Messages stream event (`blocks`: the tool calls open in this stream, by index)."""
    kind = event.get("type")
    if kind == "message_start":
        read_messages_answer(draft, event.get("message") or {})
    elif kind == "content_block_start":
        block = event.get("content_block") or {}
        if block.get("type") in ("tool_use", "server_tool_use"):
            blocks[int(event.get("index") or 0)] = _call(draft, len(draft.tool_calls), block.get("id"), block.get("name"))
    elif kind == "content_block_delta":
        delta = event.get("delta") or {}
        if delta.get("type") == "text_delta":
            draft.text_parts.append(str(delta.get("text", "")))
        elif delta.get("type") == "thinking_delta":
            draft.reasoning_parts.append(str(delta.get("thinking", "")))
        elif delta.get("type") == "input_json_delta" and int(event.get("index") or 0) in blocks:
            blocks[int(event.get("index") or 0)]["function"]["arguments"] += str(delta.get("partial_json", ""))
    elif kind == "message_delta":
        draft.finish_reason = (event.get("delta") or {}).get("stop_reason") or draft.finish_reason
        if isinstance(event.get("usage"), dict):
            draft.usage = {**(draft.usage or {}), **event["usage"]}
    elif kind == "error":
        draft.errors.append(f"error in stream: {json.dumps(event.get('error'))[:500]}")


def read_messages_answer(draft: TurnDraft, message: dict[str, Any]) -> None:
    """A whole Messages answer (or the `message` of `message_start`, whose content is empty)."""
    for block in message.get("content") or []:
        if block.get("type") == "text":
            draft.text_parts.append(str(block.get("text", "")))
        elif block.get("type") == "thinking":
            draft.reasoning_parts.append(str(block.get("thinking", "")))
        elif block.get("type") in ("tool_use", "server_tool_use"):
            _call(draft, len(draft.tool_calls), block.get("id"), block.get("name"), json.dumps(block.get("input") or {}))
    draft.finish_reason = message.get("stop_reason") or draft.finish_reason
    if isinstance(message.get("usage"), dict):
        draft.usage = {**(draft.usage or {}), **message["usage"]}


def read_responses_answer(draft: TurnDraft, response: dict[str, Any]) -> None:
    """A whole Responses object (also what `response.completed` carries: the stream's deltas are
    not read, the final object has them all)."""
    for item in response.get("output") or []:
        if item.get("type") == "message":
            draft.text_parts.extend(str(p.get("text", "")) for p in item.get("content") or [] if p.get("type") == "output_text")
        elif item.get("type") == "reasoning":
            draft.reasoning_parts.extend(str(p.get("text", "")) for p in item.get("summary") or [])
        elif item.get("type") in ("function_call", "custom_tool_call"):
            _call(draft, len(draft.tool_calls), item.get("call_id"), item.get("name"), str(item.get("arguments", item.get("input", ""))))
    draft.finish_reason = response.get("status") or draft.finish_reason
    if isinstance(response.get("usage"), dict):
        draft.usage = response["usage"]
    if isinstance(response.get("error"), dict):
        draft.errors.append(f"error in answer: {json.dumps(response['error'])[:500]}")


def read_gemini_answer(draft: TurnDraft, chunk: dict[str, Any]) -> None:
    """One generateContent answer, whole or a chunk of a stream (the same shape)."""
    for candidate in (chunk.get("candidates") or [])[:1]:
        for part in (candidate.get("content") or {}).get("parts") or []:
            if "functionCall" in part:
                call = part["functionCall"] or {}
                _call(draft, len(draft.tool_calls), call.get("id"), call.get("name"), json.dumps(call.get("args") or {}))
            elif isinstance(part.get("text"), str):
                (draft.reasoning_parts if part.get("thought") else draft.text_parts).append(part["text"])
        draft.finish_reason = candidate.get("finishReason") or draft.finish_reason
    if isinstance(chunk.get("usageMetadata"), dict):
        draft.usage = chunk["usageMetadata"]


@dataclass
class NativeReader:
    """Reads one native answer (whole or streamed) into a turn draft."""

    dialect: str
    draft: TurnDraft
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)

    def event(self, data: str) -> None:
        try:
            obj = fastjson.loads(data)
        except ValueError:
            if data.strip() != "[DONE]":
                self.draft.errors.append(f"malformed stream event: {data[:200]!r}")
            return
        if not isinstance(obj, dict):
            return
        self.draft.chunks += 1
        if self.dialect == "messages":
            read_messages_event(self.draft, obj, self.blocks)
        elif self.dialect == "responses":
            if obj.get("type") in ("response.completed", "response.incomplete", "response.failed"):
                read_responses_answer(self.draft, obj.get("response") or {})
            elif obj.get("type") == "error":
                self.draft.errors.append(f"error in stream: {data[:500]}")
        elif self.dialect == "gemini":
            read_gemini_answer(self.draft, obj)

    def whole(self, content: bytes) -> None:
        try:
            obj = fastjson.loads(content)
        except ValueError:
            self.draft.errors.append(f"upstream body is not JSON: {content[:200]!r}")
            return
        for item in obj if isinstance(obj, list) else [obj]:  # Gemini's non-SSE stream is a JSON array
            if not isinstance(item, dict):
                continue
            if self.dialect == "messages":
                read_messages_answer(self.draft, item)
            elif self.dialect == "responses":
                read_responses_answer(self.draft, item)
            elif self.dialect == "gemini":
                read_gemini_answer(self.draft, item)


class NativeStream:
    """A StreamTranslation that translates nothing: the upstream's bytes go on as they came, and
    are read on the side into the turn."""

    def __init__(self, dialect: str, draft: TurnDraft, content_type: str) -> None:
        self.content_type = content_type
        self._reader = NativeReader(dialect, draft)
        self._decoder = SSEDecoder()

    def feed(self, data: bytes) -> bytes:
        for event in self._decoder.feed(data):
            self._reader.event(event)
        return data

    def close(self, error: str | None) -> bytes:
        return b""  # a broken stream reaches the harness as the upstream broke it

    def finish(self) -> None:
        for event in self._decoder.flush():
            self._reader.event(event)


# -- the call ---------------------------------------------------------------------------------
async def pass_through(proxy: CaptureProxy, dialect: Dialect, session: CaptureSession, scope: Scope, raw: bytes, body: dict[str, Any]) -> Reply:
    """Serve one model call of `dialect` by the session's native upstream (see the module docstring)."""
    wire_api = session.endpoint.wire_api
    if dialect.name != DIALECT_OF[wire_api]:  # check_wire_api refuses this up front; a stray call gets it here
        return dialect.error(400, f"this rollout's endpoint speaks {wire_api!r}, passed through untranslated; it cannot answer {dialect.name}",
                             "invalid_request")
    try:  # bounded as the engine's body is (core/capture/native_guard.py): off the loop, a body may be large
        sent = await asyncio.to_thread(native_guard.bounded_body, dialect.name, route_path(scope), body, session.policy.max_tokens_cap)
    except InvalidRequestError as e:
        return dialect.error(400, session.redact(str(e)), "invalid_request")
    try:  # the neutral view, for the record only: what it cannot read is still passed on
        request = request_guard.read_request(dialect, body, scope)
        messages, tools, stream, purpose = request.messages, request.tools, request.stream, request.purpose
    except InvalidRequestError:
        messages, tools, purpose = [], [], "policy"
        stream = bool(body.get("stream")) or "stream" in route_path(scope).lower()
    turn = proxy._open_turn(dialect, session, raw, purpose, stream, messages, tools)
    if isinstance(turn, Reply):
        return turn
    endpoint = session.endpoint
    if sent != body:
        raw = fastjson.dumps(sent)
    path, raw = with_model(dialect, route_path(scope), raw, sent, endpoint.model)
    url = upstream_url(endpoint.base_url, path, scope.get("query_string", b""))
    headers = upstream_headers(dialect.name, scope, endpoint.api_key.get_secret_value())
    started = time.monotonic()
    # No redirects: the key header would follow them to wherever they point.
    resp = await proxy._post_upstream(dialect, session, turn, started, url, raw, headers, allow_redirects=False)
    if isinstance(resp, Reply):
        return resp
    content_type = session.redact(resp.headers.get("content-type", "application/json"))
    if resp.status >= 400:  # the upstream's own error, in its own shape: relayed as is, secrets masked
        try:
            content = await resp.read()
        except (aiohttp.ClientError, TimeoutError):
            content = b""
        finally:
            resp.release()
        session.upstream_result(ok=False, infra=resp.status >= 500)
        content = await masked(session.redactor, content)
        error = content[:2000].decode("utf-8", errors="replace")
        proxy._record_failure(session, turn, started, resp.status, error, f"upstream answered {resp.status}")
        return Reply(resp.status, content, content_type)
    turn.upstream_status = resp.status
    draft = TurnDraft()
    if "text/event-stream" in content_type:
        session.upstream_result(ok=True)
        session.add_relayed_answer(resp)
        return proxy._relay(NativeStream(dialect.name, draft, content_type), session, turn, draft, resp, started)
    try:
        content = await resp.read()
    except (aiohttp.ClientError, TimeoutError) as e:
        session.upstream_result(ok=False)
        return proxy._unanswered(dialect, session, turn, started, resp.status, f"upstream read failed: {type(e).__name__}: {e}", 502)
    finally:
        resp.release()
    session.upstream_result(ok=True)
    content = await masked(session.answer_redactor, content)
    NativeReader(dialect.name, draft).whole(content)
    proxy._record_answer(session, turn, draft, started, None)
    return Reply(resp.status, content, content_type)
