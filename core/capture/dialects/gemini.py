"""Google's Gemini API (`POST {base}/v1beta/models/{model}:generateContent` and
`:streamGenerateContent`), translated to and from the engine's chat completions. Gemini CLI speaks
only this API.

Requests: `systemInstruction` becomes the first system message; a `model` content becomes one chat
assistant message (thought parts its `reasoning_content`, text parts its content, `functionCall`
parts its tool calls with the `args` object written as the engine wrote it when it is the object
Gemini CLI was handed, else as `json.dumps` writes it: core/capture/dialects/sampled.py); a `user`
content becomes user messages, each `functionResponse` part a tool message where it stands (its
`response`: the `output` string when that is all it holds, else the object as JSON). Call ids are
the engine's: Gemini CLI prefixes them with the tool's name (`run_shell_command__call_0`), which is
taken off again; calls without ids get one from their name and order (an engine's call without an id
is given one of ours, so it comes back with it). `tools[].functionDeclarations` become chat
functions (`parametersJsonSchema`, or `parameters` in Gemini's schema with its upper-case types
written as JSON Schema's). The translation is a pure function of the request (and the session's
sampled arguments), so a replayed history translates to the previous call's messages plus the new
ones.

Answers: each engine chunk becomes a `GenerateContentResponse` as it arrives (reasoning as
`thought` text parts, text as text parts; a function call goes whole once its arguments are
complete, as Gemini sends them), the last one with the `finishReason` and `usageMetadata`; as SSE
events with `alt=sse`, else as the parts of one JSON array. Gemini CLI keeps no thought parts in
its history, so the reasoning rides back in a `thoughtSignature` (on the first function call, else
on a last empty text part): this proxy's signatures carry the text, and a replayed one is read back
as the assistant message's reasoning. `:countTokens` asks the engine (one token, an auxiliary turn)
and answers `totalTokens`.

Not translated (what a harness that sends them gets) is listed in docs/capture.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from harness_env.core.capture import fastjson
from harness_env.core.capture.asgi import Reply, Scope, header, json_reply, route_path
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
from harness_env.core.capture.dialects.gemini_api import NATIVE, REQUEST_SHAPE
from harness_env.core.capture.dialects.gemini_request import GeminiChatRequest, chat_response_format, chat_tool_choice, translate_contents, translate_tools
from harness_env.core.capture.dialects.responses_request import encode_reasoning
from harness_env.core.capture.dialects.sampled import SampledArguments

if TYPE_CHECKING:
    from harness_env.core.capture.assemble import TurnDraft
    from harness_env.core.capture.session import CaptureSession

VERSIONS = ("v1beta", "v1")
TURN_LIMIT_RETRY_S = 86400  # the turn limit's 429 says "retry in a day": no client waits that long
FINISH_REASONS = {"stop": "STOP", "tool_calls": "STOP", "function_call": "STOP", "length": "MAX_TOKENS", "content_filter": "SAFETY"}
STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    501: "NOT_IMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


# -- answers ----------------------------------------------------------------------------------
def usage_metadata(usage: dict[str, Any] | None, prompt_ids: int = 0) -> dict[str, Any]:
    usage = usage if isinstance(usage, dict) else {}
    prompt, completion = int(usage.get("prompt_tokens") or prompt_ids), int(usage.get("completion_tokens") or 0)
    out = {"promptTokenCount": prompt, "candidatesTokenCount": completion, "totalTokenCount": int(usage.get("total_tokens") or prompt + completion)}
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if reasoning:
        out["thoughtsTokenCount"] = int(reasoning)
    if cached:
        out["cachedContentTokenCount"] = int(cached)
    return out


class ContentBuilder(ChunkBuilder):
    """Chat completion chunks in, GenerateContentResponse chunks (and the final response) out."""

    def __init__(self, request: GeminiChatRequest) -> None:
        super().__init__()
        self.request = request
        self.stream_type = "text/event-stream" if request.sse else "application/json"
        self.sent = 0  # chunks sent: in a JSON array, all but the first follow a comma
        self.signature_given = False

    def frame(self, obj: dict[str, Any]) -> bytes:
        """One chunk on the wire: an SSE event, or the next element of the JSON array."""
        data = fastjson.dumps(obj)
        self.sent += 1
        if self.request.sse:
            return b"data: " + data + b"\r\n\r\n"
        return (b"[" if self.sent == 1 else b",\r\n") + data

    def emit(self, parts: list[dict[str, Any]], candidate: dict[str, Any] | None = None, **top: Any) -> bytes:
        return self.frame({"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0, **(candidate or {})}], **top})

    def signature(self) -> str | None:
        """The reasoning as a thought signature, given once per answer."""
        reasoning = "".join(p.raw for p in self.done if p.kind == REASONING)
        if not reasoning or self.signature_given:
            return None
        self.signature_given = True
        return encode_reasoning(reasoning)

    # -- parts ------------------------------------------------------------------------------------
    def start_events(self) -> bytes:
        return b""

    def new_part(self, kind: str) -> dict[str, Any]:
        return {}

    def call_part(self, name: str, call_id: str) -> dict[str, Any]:
        # An id of ours when the engine gave none: Gemini CLI sends a call's id back, so its exact
        # arguments are found again (by name and order they could be some other call's).
        return {"name": name, "id": call_id or new_id("call")}

    def grew(self, part: Part, delta: str) -> bytes:
        if part.kind == REASONING:
            return self.emit([{"text": delta, "thought": True}])
        if part.kind == TEXT:
            return self.emit([{"text": delta}])
        return b""  # a function call goes whole when its arguments are complete

    def closed(self, part: Part) -> bytes:
        if part.kind != CALL:
            return b""
        call_id = part.data["id"]
        call: dict[str, Any] = {"functionCall": {"name": part.data["name"], "args": self.request.sampled.handed(call_id, part.raw), "id": call_id}}
        signature = self.signature()
        if signature:
            call["thoughtSignature"] = signature
        part.data = call
        return self.emit([call])

    def end_events(self) -> bytes:
        if self.error is not None:
            out = self.frame(_error_body(500, self.error))
        else:
            signature = self.signature()
            parts = [{"text": "", "thoughtSignature": signature}] if signature else []
            out = self.emit(
                parts,
                candidate={"finishReason": FINISH_REASONS.get(self.finish_reason or "stop", "OTHER")},
                usageMetadata=usage_metadata(self.usage, len(self.prompt_ids or ())),
                modelVersion=self.request.body.get("model"),
            )
        return out + (b"" if self.request.sse else (b"]" if self.sent else b"[]"))

    def final(self) -> dict[str, Any]:
        """The whole answer as one GenerateContentResponse."""
        if self.error is not None:
            return _error_body(500, self.error)
        parts: list[dict[str, Any]] = []
        for p in self.done:
            if p.kind == REASONING:
                parts.append({"text": p.raw, "thought": True})
            elif p.kind == TEXT:
                parts.append({"text": p.raw})
            else:
                parts.append(p.data)
        signature = self.signature()
        if signature:
            parts.append({"text": "", "thoughtSignature": signature})
        finish = FINISH_REASONS.get(self.finish_reason or "stop", "OTHER")
        return {
            "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": 0}],
            "usageMetadata": usage_metadata(self.usage, len(self.prompt_ids or ())),
            "modelVersion": self.request.body.get("model"),
        }


class ContentStream(ChunkStream):
    def __init__(self, request: GeminiChatRequest, draft: TurnDraft) -> None:
        super().__init__(ContentBuilder(request), draft)
        self.content_type = self.builder.stream_type


def _error_body(status: int, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": STATUSES.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")}}


class Gemini:
    """POST /v1beta/models/{model}:generateContent, :streamGenerateContent and :countTokens (and
    the same below /v1)."""

    name = "gemini"
    request_shape = REQUEST_SHAPE  # what request_guard checks before read_request
    native = NATIVE  # its own API, for an upstream that speaks it
    routes = tuple(
        Route("POST", f"/{version}/models/{{model}}:{method}") for version in VERSIONS for method in ("generateContent", "streamGenerateContent", "countTokens")
    )

    def presented_key(self, scope: Scope) -> str | None:
        key = header(scope, b"x-goog-api-key")
        if key:
            return key
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        return (query.get("key") or [None])[0] or bearer_or_api_key(scope)

    def read_request(self, body: dict[str, Any], scope: Scope, sampled: SampledArguments | None = None) -> GeminiChatRequest:
        path = route_path(scope)
        count_only = path.endswith(":countTokens")
        if count_only and isinstance(body.get("generateContentRequest"), dict):
            body = body["generateContentRequest"]
        sampled = sampled if sampled is not None else SampledArguments()  # read outside a session
        messages = translate_contents(body, sampled)
        tools = translate_tools(body.get("tools"))
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        return GeminiChatRequest(
            messages=messages,
            tools=tools,
            stream=path.endswith(":streamGenerateContent"),
            purpose="policy" if tools and not count_only else "auxiliary",
            body=body,
            sampled=sampled,
            count_only=count_only,
            sse=(query.get("alt") or [""])[0] == "sse",
        )

    def engine_body(self, request: ChatRequest) -> dict[str, Any]:
        assert isinstance(request, GeminiChatRequest)
        out = engine_request(request)
        config = request.body.get("generationConfig") or {}
        if request.tools and not request.count_only:
            choice = chat_tool_choice(request.body.get("toolConfig"))
            if choice is not None:
                out["tool_choice"] = choice
        if request.count_only:
            out["max_tokens"] = 1
            return out
        pass_on(
            out,
            config,
            {
                "max_tokens": "maxOutputTokens",
                "temperature": "temperature",
                "top_p": "topP",
                "stop": "stopSequences",
                "seed": "seed",
                "presence_penalty": "presencePenalty",
                "frequency_penalty": "frequencyPenalty",
            },
        )
        response_format = chat_response_format(config)
        if response_format is not None:
            out["response_format"] = response_format
        return out

    def answer(self, request: ChatRequest, engine_body: bytes, content_type: str, draft: TurnDraft) -> tuple[bytes, str]:
        assert isinstance(request, GeminiChatRequest)
        draft.add_response_body(engine_body)
        if request.count_only:
            count, _ = prompt_length(request, engine_body)
            return fastjson.dumps({"totalTokens": count}), "application/json"
        return whole_answer(ContentBuilder(request), request, engine_body)

    def stream(self, request: ChatRequest, draft: TurnDraft) -> ContentStream:
        assert isinstance(request, GeminiChatRequest)
        return ContentStream(request, draft)

    def error(self, status: int, message: str, code: str) -> Reply:
        body = _error_body(status, message)
        if code in ROLLOUT_LIMIT_CODES:  # Google's clients retry a 429 unless the retry is said to be far off
            body["error"]["details"] = [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{TURN_LIMIT_RETRY_S}s"}]
        return json_reply(status, body)

    def upstream_error(self, status: int, engine_body: bytes, content_type: str) -> Reply:
        """The engine's error in Google's shape: `{"error": {code, message, status}}`."""
        return self.error(status, engine_error_message(engine_body, status), "upstream_error")

    def local_reply(self, route: Route, session: CaptureSession, scope: Scope) -> Reply:
        return self.error(404, f"no route {route.method} {route.path}", "not_found")  # it has none
