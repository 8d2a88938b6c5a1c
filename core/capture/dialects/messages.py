"""The Anthropic Messages API (`POST {base}/v1/messages`, also `?beta=true`), translated to and from
the engine's chat completions. Claude Code speaks only this API.

Requests: `system` (a string or text blocks; Claude Code's `x-anthropic-billing-header` block is
metadata for Anthropic's billing, never shown to a model, and is left out) becomes the first system
message; each message becomes one chat message, but a user message's `tool_result` blocks each
become a tool message (in place, so the order is kept); an assistant message's `thinking` blocks are
its `reasoning_content`, its text blocks its content and its `tool_use` blocks its tool calls (the
`input` object written back as the engine wrote it when it is the object Claude Code was handed,
else as `json.dumps` writes it: core/capture/dialects/sampled.py). A `system` message inside
`messages` (Claude Code sends them) stays a system message in place.
Tools become chat functions (`input_schema` is the parameters); `defer_loading` tools are left out
until a `tool_reference` block loads them, as Anthropic's tool search does; `cache_control` is
accepted everywhere and ignored. The translation is a pure function of the request (and the
session's sampled arguments), so a replayed history translates to the previous call's messages plus
the new ones.

Answers: each engine chunk becomes Messages stream events as it arrives (`message_start`,
`content_block_start` / `content_block_delta` (`thinking_delta`, `text_delta`, `input_json_delta`) /
`content_block_stop`, `message_delta` with the stop reason and usage, `message_stop`), and a whole
answer a `message` object. A thinking block's `signature` is ours (a digest of the text); the text
itself is what comes back, so reasoning round-trips.

`POST /v1/messages/count_tokens` asks the engine: the same translation with `max_tokens` 1, recorded
as an auxiliary turn, answered with the engine's own prompt length (its `usage`, else its prompt
token ids); an engine that gives neither gets an estimate (about four characters a token), said by
the answer's extra field `count_source` ("engine" or "estimate"). `HEAD`/`GET` probes of `/`, `/api/hello` and `HEAD
/v1/messages` are answered 200, with a key or without (Claude Code probes without one; a probe calls
no model).

Not translated (what a harness that sends them gets) is listed in docs/capture.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness_env.core.capture import fastjson
from harness_env.core.capture.asgi import Reply, Scope, json_reply, route_path
from harness_env.core.capture.dialects.base import ROLLOUT_LIMIT_CODES, ChatRequest, Route, bearer_or_api_key
from harness_env.core.capture.dialects.chunks import (
    CALL,
    REASONING,
    TEXT,
    ChunkBuilder,
    ChunkStream,
    Part,
    engine_error_message,
    engine_request,
    new_id,
    pass_on,
    prompt_length,
    whole_answer,
)
from harness_env.core.capture.dialects.messages_api import NATIVE, REQUEST_SHAPE
from harness_env.core.capture.dialects.messages_request import MessagesChatRequest, chat_tool_choice, thinking_signature, translate_messages, translate_tools
from harness_env.core.capture.dialects.sampled import SampledArguments

if TYPE_CHECKING:
    from harness_env.core.capture.assemble import TurnDraft
    from harness_env.core.capture.session import CaptureSession

COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use", "content_filter": "refusal"}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


# -- answers ----------------------------------------------------------------------------------
def messages_usage(usage: dict[str, Any] | None, prompt_ids: int = 0) -> dict[str, Any]:
    """Chat usage -> Messages usage (cached prompt tokens are Anthropic's cache reads, which
    `input_tokens` does not count)."""
    usage = usage if isinstance(usage, dict) else {}
    prompt = int(usage.get("prompt_tokens") or prompt_ids)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "input_tokens": prompt - cached,
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


class MessageBuilder(ChunkBuilder):
    """Chat completion chunks in, Messages stream events and the final `message` out: one content
    block per part (thinking, text, tool_use), started when the part starts."""

    def __init__(self, request: MessagesChatRequest) -> None:
        super().__init__()
        self.request = request
        self.id = new_id("msg")
        self.matched_stop: str | None = None

    @staticmethod
    def event(kind: str, **fields: Any) -> bytes:
        return b"event: " + kind.encode() + b"\ndata: " + fastjson.dumps({"type": kind, **fields}) + b"\n\n"

    def message(self) -> dict[str, Any]:
        stop_reason, stop_sequence = self.stop_reason() if self.finish_reason is not None else (None, None)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.request.body.get("model"),
            "content": [p.data for p in self.done],
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": messages_usage(self.usage, len(self.prompt_ids or ())),
        }

    def final(self) -> dict[str, Any]:
        if self.error is not None:
            return {"type": "error", "error": {"type": "api_error", "message": self.error}}
        return self.message()

    def stop_reason(self) -> tuple[str, str | None]:
        if self.matched_stop is not None:
            return "stop_sequence", self.matched_stop
        if self.finish_reason != "length" and any(p.kind == CALL for p in self.done):
            return "tool_use", None
        return STOP_REASONS.get(self.finish_reason or "stop", "end_turn"), None

    def on_choice(self, choice: dict[str, Any]) -> None:
        stop = choice.get("stop_reason")  # vLLM: the stop string that matched
        if isinstance(stop, str) and stop in self.request.stop_sequences:
            self.matched_stop = stop

    def start_events(self) -> bytes:
        return self.event("message_start", message={**self.message(), "content": [], "stop_reason": None, "stop_sequence": None})

    # -- blocks -----------------------------------------------------------------------------
    def new_part(self, kind: str) -> dict[str, Any]:
        return {"type": "thinking", "thinking": "", "signature": ""} if kind == REASONING else {"type": "text", "text": ""}

    def call_part(self, name: str, call_id: str) -> dict[str, Any]:
        return {"type": "tool_use", "id": call_id or new_id("toolu"), "name": name, "input": {}}

    def added(self, part: Part) -> bytes:
        return self.event("content_block_start", index=part.index, content_block=part.data)

    def grew(self, part: Part, delta: str) -> bytes:
        kind, key = {REASONING: ("thinking_delta", "thinking"), TEXT: ("text_delta", "text")}.get(part.kind, ("input_json_delta", "partial_json"))
        return self.event("content_block_delta", index=part.index, delta={"type": kind, key: delta})

    def closed(self, part: Part) -> bytes:
        raw, out = part.raw, b""
        if part.kind == REASONING:
            part.data = {**part.data, "thinking": raw, "signature": thinking_signature(raw)}
            out = self.event("content_block_delta", index=part.index, delta={"type": "signature_delta", "signature": part.data["signature"]})
        elif part.kind == TEXT:
            part.data = {**part.data, "text": raw}
        else:
            part.data = {**part.data, "input": self.request.sampled.handed(part.data["id"], raw)}
        return out + self.event("content_block_stop", index=part.index)

    def end_events(self) -> bytes:
        """message_delta and message_stop, or an error event when the engine's answer broke off."""
        if self.error is not None:
            return self.event("error", error={"type": "api_error", "message": self.error})
        stop_reason, stop_sequence = self.stop_reason()
        usage = messages_usage(self.usage, len(self.prompt_ids or ()))
        return self.event("message_delta", delta={"stop_reason": stop_reason, "stop_sequence": stop_sequence}, usage=usage) + self.event("message_stop")


class MessagesStream(ChunkStream):
    """A streamed engine answer, translated chunk by chunk into Messages events."""

    def __init__(self, request: MessagesChatRequest, draft: TurnDraft) -> None:
        super().__init__(MessageBuilder(request), draft)


def _error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


class Messages:
    """POST /v1/messages (streaming or not) and /v1/messages/count_tokens; HEAD/GET probes."""

    name = "messages"
    request_shape = REQUEST_SHAPE  # what request_guard checks before read_request
    native = NATIVE  # its own API, for an upstream that speaks it
    routes = (
        Route("POST", "/v1/messages"),
        Route("POST", COUNT_TOKENS_PATH),
        # Reachability probes: Claude Code sends HEAD /api/hello without its key.
        Route("HEAD", "/v1/messages", model_call=False, keyless=True),
        *(Route(method, path, model_call=False, keyless=True) for path in ("/", "/api/hello") for method in ("HEAD", "GET")),
    )

    def presented_key(self, scope: Scope) -> str | None:
        return bearer_or_api_key(scope)  # x-api-key (ANTHROPIC_API_KEY) or Bearer (ANTHROPIC_AUTH_TOKEN)

    def read_request(self, body: dict[str, Any], scope: Scope, sampled: SampledArguments | None = None) -> MessagesChatRequest:
        count_only = route_path(scope) == COUNT_TOKENS_PATH
        sampled = sampled if sampled is not None else SampledArguments()  # read outside a session
        messages, referenced = translate_messages(body, sampled)
        tools = translate_tools(body.get("tools"), referenced)
        stops = body.get("stop_sequences")
        return MessagesChatRequest(
            messages=messages,
            tools=tools,
            stream=bool(body.get("stream")) and not count_only,
            purpose="policy" if tools and not count_only else "auxiliary",
            body=body,
            sampled=sampled,
            count_only=count_only,
            stop_sequences=[s for s in stops if isinstance(s, str)] if isinstance(stops, list) else [],
        )

    def engine_body(self, request: ChatRequest) -> dict[str, Any]:
        assert isinstance(request, MessagesChatRequest)
        body = request.body
        out = engine_request(request)
        if request.tools:
            choice, parallel = chat_tool_choice(body.get("tool_choice"))
            if choice is not None and not request.count_only:
                out["tool_choice"] = choice
            if parallel is not None:
                out["parallel_tool_calls"] = parallel
        if request.count_only:
            out["max_tokens"] = 1
            return out
        pass_on(out, body, {"max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p"})
        if request.stop_sequences:
            out["stop"] = request.stop_sequences
        return out

    def answer(self, request: ChatRequest, engine_body: bytes, content_type: str, draft: TurnDraft) -> tuple[bytes, str]:
        assert isinstance(request, MessagesChatRequest)
        draft.add_response_body(engine_body)
        if request.count_only:
            count, source = prompt_length(request, engine_body)
            return fastjson.dumps({"input_tokens": count, "count_source": source}), "application/json"
        return whole_answer(MessageBuilder(request), request, engine_body)

    def stream(self, request: ChatRequest, draft: TurnDraft) -> MessagesStream:
        assert isinstance(request, MessagesChatRequest)
        return MessagesStream(request, draft)

    def error(self, status: int, message: str, code: str) -> Reply:
        reply = json_reply(status, {"type": "error", "error": {"type": _error_type(status), "message": message}})
        if code in ROLLOUT_LIMIT_CODES:  # Anthropic's clients retry a 429 unless told not to
            reply.headers.append((b"x-should-retry", b"false"))
        return reply

    def upstream_error(self, status: int, engine_body: bytes, content_type: str) -> Reply:
        """The engine's error in Anthropic's shape: `{"type": "error", "error": {type, message}}`
        (OpenAI's `{"error": {...}}`, vLLM's flat `{"object": "error", ...}` and plain text)."""
        message = engine_error_message(engine_body, status)
        return json_reply(status, {"type": "error", "error": {"type": _error_type(status), "message": message}})

    def local_reply(self, route: Route, session: CaptureSession | None, scope: Scope) -> Reply:
        return json_reply(200, {})  # a reachability probe
