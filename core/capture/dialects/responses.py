"""The OpenAI Responses API (`POST {base}/responses`), translated to and from the engine's chat
completions. Codex speaks only this API.

Requests are read into chat messages and tools by core/capture/dialects/responses_request.py
(a pure function of the request, so a replayed history extends the previous call's prompt ids).

Answers: each engine chunk becomes Responses stream events as it arrives (`response.created`, item
and content-part events, text, reasoning and argument deltas, `response.completed` with usage), and
a whole answer a `response` object. Reasoning comes back as a reasoning item whose
`encrypted_content` carries the text (Codex replays that field, not the text), so it round-trips.

Stateless: `previous_response_id` and `item_reference` are refused (the proxy stores no response);
`store` is accepted and nothing is stored. What is not translated is listed in responses_request.py.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from harness_env.core.capture import fastjson
from harness_env.core.capture.asgi import Reply, Scope, json_reply
from harness_env.core.capture.dialects.base import ChatRequest, Route, bearer_or_api_key
from harness_env.core.capture.dialects.chunks import (
    REASONING,
    TEXT,
    ChunkBuilder,
    ChunkStream,
    Part,
    engine_error,
    engine_error_text,
    engine_request,
    new_id,
    pass_on,
    whole_answer,
)
from harness_env.core.capture.dialects.responses_api import NATIVE, REQUEST_SHAPE
from harness_env.core.capture.dialects.responses_request import (
    ResponsesChatRequest,
    ToolName,
    chat_response_format,
    chat_tool_choice,
    encode_reasoning,
    translate_input,
    translate_tools,
)
from harness_env.core.errors import InvalidRequestError

if TYPE_CHECKING:
    from harness_env.core.capture.assemble import TurnDraft
    from harness_env.core.capture.dialects.sampled import SampledArguments
    from harness_env.core.capture.session import CaptureSession


# -- answers ----------------------------------------------------------------------------------
def responses_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Chat usage -> Responses usage (Codex needs input, output and total tokens)."""
    if not isinstance(usage, dict):
        return None
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": int(cached)},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": int(reasoning)},
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
    }


class ResponseBuilder(ChunkBuilder):
    """Chat completion chunks in, Responses events and the final `response` out.

    Text and arguments are passed on as they come (a tool call's item starts once its name is known;
    a custom tool's input, wrapped in JSON by the engine, is sent whole when the call ends)."""

    def __init__(self, request: ResponsesChatRequest) -> None:
        super().__init__()
        self.request = request
        self.id = new_id("resp")
        self.created_at = int(time.time())
        self.seq = 0

    # -- events -----------------------------------------------------------------------------
    def event(self, kind: str, **fields: Any) -> bytes:
        self.seq += 1
        data = fastjson.dumps({"type": kind, "sequence_number": self.seq, **fields})
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    def response(self, status: str) -> dict[str, Any]:
        body = self.request.body
        out: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": body.get("model"),
            "output": [p.data for p in self.done] if status != "in_progress" else [],
            "usage": responses_usage(self.usage),
            "error": None,
            "incomplete_details": None,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "store": False,
            "tool_choice": body.get("tool_choice", "auto"),
            # `instructions` and `tools` are not echoed: tens of kilobytes per event that no client
            # reads, on the latency path.
        }
        if status == "incomplete":
            out["incomplete_details"] = {"reason": "content_filter" if self.finish_reason == "content_filter" else "max_output_tokens"}
        if status == "failed":
            out["error"] = {"code": "server_error", "message": self.error or "the engine's answer broke off"}
        return out

    def start_events(self) -> bytes:
        snapshot = self.response("in_progress")
        return self.event("response.created", response=snapshot) + self.event("response.in_progress", response=snapshot)

    # -- items ------------------------------------------------------------------------------
    def new_part(self, kind: str) -> dict[str, Any]:
        if kind == REASONING:
            return {"type": "reasoning", "id": new_id("rs"), "summary": [], "content": []}
        return {"type": "message", "id": new_id("msg"), "status": "in_progress", "role": "assistant", "content": []}

    def call_part(self, name: str, call_id: str) -> dict[str, Any]:
        """The harness's own call item for a chat tool call (its tool's kind, name and namespace)."""
        tool = self.request.tool_names.get(name, ToolName(name))
        call_id = call_id or new_id("call")
        if tool.kind == "custom":
            item: dict[str, Any] = {
                "type": "custom_tool_call",
                "id": new_id("ctc"),
                "status": "in_progress",
                "call_id": call_id,
                "name": tool.name,
                "input": "",
            }
        else:
            item = {"type": "function_call", "id": new_id("fc"), "status": "in_progress", "call_id": call_id, "name": tool.name, "arguments": ""}
        if tool.namespace:
            item["namespace"] = tool.namespace
        return item

    def added(self, part: Part) -> bytes:
        out = self.event("response.output_item.added", output_index=part.index, item=part.data)
        if part.kind == TEXT:
            text = {"type": "output_text", "text": "", "annotations": []}
            out += self.event("response.content_part.added", item_id=part.data["id"], output_index=part.index, content_index=0, part=text)
        return out

    def grew(self, part: Part, delta: str) -> bytes:
        ids = {"item_id": part.data["id"], "output_index": part.index}
        if part.kind == REASONING:
            return self.event("response.reasoning_text.delta", **ids, content_index=0, delta=delta)
        if part.kind == TEXT:
            return self.event("response.output_text.delta", **ids, content_index=0, delta=delta, logprobs=[])
        if part.data["type"] == "function_call":
            return self.event("response.function_call_arguments.delta", **ids, delta=delta)
        return b""  # a custom tool's input goes whole when the call ends

    def closed(self, part: Part) -> bytes:
        """The item's done events, with the whole text, reasoning or arguments."""
        raw, ids = part.raw, {"item_id": part.data["id"], "output_index": part.index}
        if part.kind == REASONING:
            part.data = {**part.data, "content": [{"type": "reasoning_text", "text": raw}], "encrypted_content": encode_reasoning(raw)}
            out = self.event("response.reasoning_text.done", **ids, content_index=0, text=raw)
        elif part.kind == TEXT:
            text = {"type": "output_text", "text": raw, "annotations": []}
            part.data = {**part.data, "status": "completed", "content": [text]}
            out = self.event("response.output_text.done", **ids, content_index=0, text=raw, logprobs=[])
            out += self.event("response.content_part.done", **ids, content_index=0, part=text)
        elif part.data["type"] == "custom_tool_call":
            value = _custom_input(raw)
            part.data = {**part.data, "status": "completed", "input": value}
            out = self.event("response.custom_tool_call_input.delta", **ids, delta=value)
            out += self.event("response.custom_tool_call_input.done", **ids, input=value)
        else:
            part.data = {**part.data, "status": "completed", "arguments": raw}
            out = self.event("response.function_call_arguments.done", **ids, name=part.data["name"], arguments=raw)
        return out + self.event("response.output_item.done", output_index=part.index, item=part.data)

    def end_events(self) -> bytes:
        status = self.status()
        kind = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(status, "response.failed")
        return self.event(kind, response=self.response(status))

    def final(self) -> dict[str, Any]:
        return self.response(self.status())

    def status(self) -> str:
        if self.error is not None:
            return "failed"
        return "incomplete" if self.finish_reason in ("length", "content_filter") else "completed"


def _custom_input(arguments: str) -> str:
    """A freeform tool's input from the engine's arguments (`{"input": "..."}`, else the raw text)."""
    try:
        parsed = fastjson.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get("input"), str):
        return parsed["input"]
    return arguments


class ResponsesStream(ChunkStream):
    """A streamed engine answer, translated chunk by chunk into Responses events."""

    def __init__(self, request: ResponsesChatRequest, draft: TurnDraft) -> None:
        super().__init__(ResponseBuilder(request), draft)


class Responses:
    """POST /v1/responses, streaming or not."""

    name = "responses"
    request_shape = REQUEST_SHAPE  # what request_guard checks before read_request
    native = NATIVE  # its own API, for an upstream that speaks it
    routes = (Route("POST", "/v1/responses"),)

    def presented_key(self, scope: Scope) -> str | None:
        return bearer_or_api_key(scope)

    def read_request(self, body: dict[str, Any], scope: Scope, sampled: SampledArguments | None = None) -> ResponsesChatRequest:
        if body.get("previous_response_id"):
            raise InvalidRequestError(
                "previous_response_id is not supported: this proxy stores no responses; send the whole conversation in 'input' (store: false)"
            )
        raw_tools = body.get("tools") or []
        if not isinstance(raw_tools, list):
            raise InvalidRequestError("'tools' must be a list")
        tools, names = translate_tools(raw_tools)
        messages = translate_input(body, names)
        if sampled is not None:  # arguments the harness wrote again: the engine's own text where the value is the same
            messages = sampled.restore_history(messages)
        return ResponsesChatRequest(
            messages=messages, tools=tools, stream=bool(body.get("stream")), purpose="policy" if tools else "auxiliary", body=body, tool_names=names
        )

    def engine_body(self, request: ChatRequest) -> dict[str, Any]:
        assert isinstance(request, ResponsesChatRequest)
        body = request.body
        out = engine_request(request)
        if request.tools:
            choice = chat_tool_choice(body.get("tool_choice"), request.tool_names)
            if choice is not None:
                out["tool_choice"] = choice
            if isinstance(body.get("parallel_tool_calls"), bool):
                out["parallel_tool_calls"] = body["parallel_tool_calls"]
        pass_on(out, body, {"max_tokens": "max_output_tokens", "temperature": "temperature", "top_p": "top_p"})
        response_format = chat_response_format(body.get("text"))
        if response_format is not None:
            out["response_format"] = response_format
        return out

    def answer(self, request: ChatRequest, engine_body: bytes, content_type: str, draft: TurnDraft) -> tuple[bytes, str]:
        assert isinstance(request, ResponsesChatRequest)
        draft.add_response_body(engine_body)
        return whole_answer(ResponseBuilder(request), request, engine_body)

    def stream(self, request: ChatRequest, draft: TurnDraft) -> ResponsesStream:
        assert isinstance(request, ResponsesChatRequest)
        return ResponsesStream(request, draft)

    def error(self, status: int, message: str, code: str) -> Reply:
        kind = "invalid_request_error" if status < 500 else "server_error"
        return json_reply(status, {"error": {"message": message, "type": kind, "param": None, "code": code}})

    def upstream_error(self, status: int, engine_body: bytes, content_type: str) -> Reply:
        """The engine's error in the Responses shape: `{"error": {message, type, param, code}}`
        (vLLM's flat `{"object": "error", "message": ...}` and plain text included)."""
        err = engine_error(engine_body)
        if err is not None:
            code = err.get("code")
            return json_reply(
                status,
                {
                    "error": {
                        "message": str(err["message"]),
                        "type": str(err.get("type") or ("invalid_request_error" if status < 500 else "server_error")),
                        "param": err.get("param"),
                        "code": code if isinstance(code, str) else None,
                    }
                },
            )
        return self.error(status, engine_error_text(engine_body, status), "upstream_error")

    def local_reply(self, route: Route, session: CaptureSession, scope: Scope) -> Reply:
        return self.error(404, f"no route {route.method} {route.path}", "not_found")  # it has none
