"""OpenAI chat completions: the engine's own dialect, so nothing is translated.

The harness's request goes to the engine as sent (plus the session's policy), and the engine's
answer comes back byte for byte but for masked secrets. Streams are relayed without being parsed:
per chunk only a copy is kept (bounded), and the turn is assembled from the whole stream after the
client has it all, off the latency path (bench/proxy.py measures the cost); a whole answer is read
into the turn after it is sent, too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness_env.core.capture.asgi import Reply, Scope, error_reply, json_reply
from harness_env.core.capture.dialects.base import ChatRequest, RequestShape, Route, bearer_or_api_key
from harness_env.core.capture.sse import SSEDecoder

if TYPE_CHECKING:
    from harness_env.core.capture.assemble import TurnDraft
    from harness_env.core.capture.dialects.sampled import SampledArguments
    from harness_env.core.capture.session import CaptureSession

MAX_RECORDED_STREAM_BYTES = 64 * 1024 * 1024


class ChatStreamRelay:
    """A streamed chat completion, passed on as it comes; a copy is decoded into the turn at the end."""

    content_type = "text/event-stream"

    def __init__(self, draft: TurnDraft) -> None:
        self._draft = draft
        self._copy = bytearray()  # what the client was sent, up to MAX_RECORDED_STREAM_BYTES

    def feed(self, data: bytes) -> bytes:
        if len(self._copy) < MAX_RECORDED_STREAM_BYTES:
            self._copy.extend(data)
        return data

    def close(self, error: str | None) -> bytes:
        return b""  # a broken stream ends where it broke: the client saw what the engine sent

    def finish(self) -> None:
        if len(self._copy) >= MAX_RECORDED_STREAM_BYTES:
            self._draft.errors.append(f"stream over {MAX_RECORDED_STREAM_BYTES} bytes: recorded only its start")
        for data in SSEDecoder.payloads(bytes(self._copy)):
            self._draft.add_chunk_bytes(data)


class ChatCompletions:
    """POST /v1/chat/completions (a policy call when it offers tools), and GET /v1/models."""

    name = "chat_completions"
    request_shape = RequestShape(
        {"messages": (list,), "tools": (list,), "stream": (bool,)}, required=("messages",), inline_media=" (an image_url whose url is data:<mime>;base64,...)"
    )
    native = None  # the engine's own API: served by the engine path, never passed through
    routes = (Route("POST", "/v1/chat/completions"), Route("GET", "/v1/models", model_call=False))

    def presented_key(self, scope: Scope) -> str | None:
        return bearer_or_api_key(scope)

    def read_request(self, body: dict[str, Any], scope: Scope, sampled: SampledArguments | None = None) -> ChatRequest:
        # The harness is handed the engine's argument strings; one that parses them and writes
        # them again (Pi) gets the engine's own text back where the value is the same.
        if sampled is not None and isinstance(body.get("messages"), list):
            body = {**body, "messages": sampled.restore_history(body["messages"])}
        return ChatRequest(
            messages=list(body.get("messages") or []),
            tools=list(body.get("tools") or []),
            stream=bool(body.get("stream")),
            purpose="policy" if body.get("tools") else "auxiliary",
            body=body,
        )

    def engine_body(self, request: ChatRequest) -> dict[str, Any]:
        return request.body

    def answer(self, request: ChatRequest, engine_body: bytes, content_type: str, draft: TurnDraft) -> tuple[bytes, str]:
        draft.unread = engine_body  # passed on as it is: read into the turn once the harness has it
        return engine_body, content_type

    def stream(self, request: ChatRequest, draft: TurnDraft) -> ChatStreamRelay:
        return ChatStreamRelay(draft)

    def error(self, status: int, message: str, code: str) -> Reply:
        return error_reply(status, message, code)

    def upstream_error(self, status: int, engine_body: bytes, content_type: str) -> Reply:
        return Reply(status, engine_body, content_type)

    def local_reply(self, route: Route, session: CaptureSession, scope: Scope) -> Reply:
        model = session.endpoint.model  # GET /v1/models: the session's model, whatever the upstream lists
        return json_reply(200, {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "harness-env"}]})
