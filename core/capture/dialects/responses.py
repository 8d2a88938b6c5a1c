"""The OpenAI Responses API (`POST {base}/responses`), translated to and from the engine's chat
completions. Codex speaks only this API.

Requests: `instructions` and the leading system/developer messages become one system message;
`input` items become chat messages (a run of reasoning, assistant message and function-call items is
one assistant message, as the engine produced it; `function_call_output` a tool message); `tools`
of type function become chat functions, `custom` (freeform) tools a function taking one string
`input`, and the functions of a `namespace` tool chat functions named `<namespace>__<name>`. The
translation is a pure function of the request, so a harness that replays its history gets messages
that extend the previous call's, and the engine's prompt ids extend too.

Answers: each engine chunk becomes Responses stream events as it arrives (`response.created`, item
and content-part events, text, reasoning and argument deltas, `response.completed` with usage), and
a whole answer a `response` object. Reasoning comes back as a reasoning item whose
`encrypted_content` carries the text (Codex replays that field, not the text), so it round-trips.

Stateless: `previous_response_id` and `item_reference` are refused (the proxy stores no response);
`store` is accepted and nothing is stored. Not translated (dropped; the engine never sees them):
hosted tools (`web_search`, `file_search`, `code_interpreter`, `image_generation`, `mcp`,
`local_shell`, `computer_use`), `reasoning` (effort, summary), `text.verbosity`, `include`,
`truncation`, `prompt_cache_key`, `metadata`, `service_tier`, `top_logprobs` (the session's policy
decides what the engine is asked for), `background`; the reasoning of a foreign `encrypted_content`
(one this proxy did not write) is dropped on replay. Input items of other types (`file` parts,
`web_search_call`, `compaction`, ...) are refused with a 400 naming them.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from dataclasses import dataclass, field
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
from harness_env.core.errors import InvalidRequestError

if TYPE_CHECKING:
    from harness_env.core.capture.assemble import TurnDraft
    from harness_env.core.capture.dialects.sampled import SampledArguments
    from harness_env.core.capture.session import CaptureSession

NAMESPACE_SEPARATOR = "__"
REASONING_PREFIX = "harness-env.reasoning.v1:"  # our encrypted_content: this prefix, then base64 of the text
SYSTEM_ROLES = ("system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text")
CUSTOM_TOOL_PARAMETERS = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}


# -- requests ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolName:
    """What a chat function name stands for in the harness's request."""

    name: str
    kind: str = "function"  # or "custom" (freeform: the call carries one string, `input`)
    namespace: str | None = None


@dataclass(slots=True)
class ResponsesChatRequest(ChatRequest):
    tool_names: dict[str, ToolName] = field(default_factory=dict)  # chat function name -> the harness's tool


def _chat_name(name: str, namespace: str | None) -> str:
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name


def translate_tools(tools: list[Any]) -> tuple[list[dict[str, Any]], dict[str, ToolName]]:
    """Responses tools -> chat tools, and what each chat function name stands for. Hosted tools
    (web search, file search, ...) have no chat form and are left out."""
    out: list[dict[str, Any]] = []
    names: dict[str, ToolName] = {}

    def add(tool: dict[str, Any], namespace: str | None) -> None:
        kind, name = tool.get("type"), tool.get("name")
        if kind not in ("function", "custom") or not isinstance(name, str):
            return
        fn: dict[str, Any] = {"name": _chat_name(name, namespace)}
        if tool.get("description"):
            fn["description"] = tool["description"]
        if kind == "function":
            fn["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
            if tool.get("strict") is not None:
                fn["strict"] = tool["strict"]
        else:
            fn["parameters"] = CUSTOM_TOOL_PARAMETERS
        out.append({"type": "function", "function": fn})
        names[fn["name"]] = ToolName(name, kind, namespace)

    for tool in tools:
        if not isinstance(tool, dict):
            raise InvalidRequestError("each of 'tools' must be an object")
        if tool.get("type") == "namespace":
            for inner in tool.get("tools") or []:
                if isinstance(inner, dict):
                    add(inner, str(tool.get("name") or ""))
        else:
            add(tool, None)
    return out, names


def encode_reasoning(text: str) -> str:
    return REASONING_PREFIX + base64.b64encode(text.encode()).decode()


def decode_reasoning(item: dict[str, Any]) -> str:
    """The reasoning text of a replayed reasoning item: ours in `encrypted_content`, else its
    `content` text (a client that replays it); a foreign encrypted_content cannot be read."""
    encrypted = item.get("encrypted_content")
    if isinstance(encrypted, str) and encrypted.startswith(REASONING_PREFIX):
        try:
            return base64.b64decode(encrypted[len(REASONING_PREFIX) :], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise InvalidRequestError("a reasoning item's encrypted_content is damaged") from None
    return "".join(str(p.get("text", "")) for p in item.get("content") or [] if isinstance(p, dict))


def _parts(content: Any, where: str) -> list[dict[str, Any]]:
    """Responses content (a string or parts) -> chat content parts."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where}: content must be a string or a list of parts")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS:
            parts.append({"type": "text", "text": str(part.get("text", part.get("refusal", "")))})
        elif kind == "input_image" and part.get("image_url"):
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise InvalidRequestError(f"{where}: content part of type {kind!r} is not supported by this proxy")
    return parts


def _chat_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """One text part is a string, as chat clients send it; anything else stays a list of parts
    (the engine joins them as it does for any chat client)."""
    parts = _parts(content, where)
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def _text_only(content: Any, where: str) -> str:
    parts = _parts(content, where)
    if any(p["type"] != "text" for p in parts):
        raise InvalidRequestError(f"{where}: a system or developer message can hold text only")
    return "\n".join(p["text"] for p in parts)


class _Assistant:
    """One assistant chat message being gathered from a run of reasoning, message and call items."""

    def __init__(self) -> None:
        self.reasoning: list[str] = []
        self.text: list[str] = []
        self.calls: list[dict[str, Any]] = []

    def accepts(self, kind: str) -> bool:
        """Whether an item of `kind` still belongs to this turn (reasoning, then text, then calls)."""
        return kind in ("function_call", "custom_tool_call") or not (self.text or self.calls)

    def add(self, kind: str, item: dict[str, Any], where: str, chat_names: dict[tuple[str | None, str], str]) -> None:
        if kind == "message":
            self.text.append("".join(p["text"] for p in _parts(item.get("content"), where) if p["type"] == "text"))
        elif kind == "reasoning":
            text = decode_reasoning(item)
            if text:
                self.reasoning.append(text)
        else:
            name, call_id, namespace = item.get("name"), item.get("call_id"), item.get("namespace")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise InvalidRequestError(f"{where}: a {kind} needs 'name' and 'call_id'")
            if kind == "function_call":
                arguments = item.get("arguments")
                if not isinstance(arguments, str):
                    raise InvalidRequestError(f"{where}: 'arguments' must be a string")
            else:  # a freeform call, as the engine wrote it (json.dumps, as vLLM's tool parsers do)
                arguments = json.dumps({"input": str(item.get("input", ""))}, ensure_ascii=False)
            chat_name = chat_names.get((namespace, name)) or _chat_name(name, namespace)
            self.calls.append({"id": call_id, "type": "function", "function": {"name": chat_name, "arguments": arguments}})

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(self.text) if self.text else None}
        if self.calls:
            msg["tool_calls"] = self.calls
        if self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        return msg


def translate_input(body: dict[str, Any], tool_names: dict[str, ToolName]) -> list[dict[str, Any]]:
    """`instructions` and `input` -> chat messages (a pure function: replays translate alike)."""
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    elif items is None:
        items = []
    elif not isinstance(items, list):
        raise InvalidRequestError("'input' must be a string or a list of items")
    chat_names = {(t.namespace, t.name): n for n, t in tool_names.items()}
    system: list[str] = []  # the leading instructions, sent as one system message
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        system.append(body["instructions"])
    elif body.get("instructions") not in (None, ""):
        raise InvalidRequestError("'instructions' must be a string")
    messages: list[dict[str, Any]] = []
    turn: _Assistant | None = None

    def flush() -> None:
        nonlocal turn
        if turn is not None:
            messages.append(turn.message())
            turn = None

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequestError(f"{where} must be an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        role = item.get("role") if kind == "message" else None
        if role in SYSTEM_ROLES and not messages and turn is None:
            system.append(_text_only(item.get("content"), where))
            continue
        if system and not messages:
            messages.append({"role": "system", "content": "\n\n".join(system)})
        if kind in ("reasoning", "function_call", "custom_tool_call") or role == "assistant":
            if turn is None or not turn.accepts(kind):
                flush()
                turn = _Assistant()
            turn.add(kind, item, where, chat_names)
            continue
        flush()
        if role in SYSTEM_ROLES:
            messages.append({"role": "system", "content": _text_only(item.get("content"), where)})
        elif role == "user":
            messages.append({"role": "user", "content": _chat_content(item.get("content"), where)})
        elif kind == "message":
            raise InvalidRequestError(f"{where}: unknown role {item.get('role')!r}")
        elif kind in ("function_call_output", "custom_tool_call_output"):
            if not isinstance(item.get("call_id"), str):
                raise InvalidRequestError(f"{where}: a {kind} needs 'call_id'")
            output = item.get("output")
            content = output if isinstance(output, str) else _chat_content(output, where)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
        elif kind == "item_reference":
            raise InvalidRequestError(f"{where}: item_reference needs stored responses and this proxy stores none; send the items themselves")
        else:
            raise InvalidRequestError(f"{where}: input items of type {kind!r} are not supported by this proxy")
    flush()
    if system and not messages:
        messages.append({"role": "system", "content": "\n\n".join(system)})
    return messages


def _tool_choice(choice: Any, tool_names: dict[str, ToolName]) -> Any:
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom") and choice.get("name"):
        wanted = (choice.get("namespace"), choice["name"])
        name = next((n for n, t in tool_names.items() if (t.namespace, t.name) == wanted), choice["name"])
        return {"type": "function", "function": {"name": name}}
    return choice if choice in ("auto", "none", "required") else None


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    return None


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
            item: dict[str, Any] = {"type": "custom_tool_call", "id": new_id("ctc"), "status": "in_progress", "call_id": call_id,
                                    "name": tool.name, "input": ""}
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
            messages=messages,
            tools=tools,
            stream=bool(body.get("stream")),
            purpose="policy" if tools else "auxiliary",
            body=body,
            tool_names=names,
        )

    def engine_body(self, request: ChatRequest) -> dict[str, Any]:
        assert isinstance(request, ResponsesChatRequest)
        body = request.body
        out = engine_request(request)
        if request.tools:
            choice = _tool_choice(body.get("tool_choice"), request.tool_names)
            if choice is not None:
                out["tool_choice"] = choice
            if isinstance(body.get("parallel_tool_calls"), bool):
                out["parallel_tool_calls"] = body["parallel_tool_calls"]
        pass_on(out, body, {"max_tokens": "max_output_tokens", "temperature": "temperature", "top_p": "top_p"})
        response_format = _response_format(body.get("text"))
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
            return json_reply(status, {"error": {
                "message": str(err["message"]),
                "type": str(err.get("type") or ("invalid_request_error" if status < 500 else "server_error")),
                "param": err.get("param"),
                "code": code if isinstance(code, str) else None,
            }})
        return self.error(status, engine_error_text(engine_body, status), "upstream_error")

    def local_reply(self, route: Route, session: CaptureSession, scope: Scope) -> Reply:
        return self.error(404, f"no route {route.method} {route.path}", "not_found")  # it has none
