"""The engine's chat-completion chunks turned into a translating dialect's events, as they arrive:
the bookkeeping every such dialect shares (Responses, Messages, Gemini), and the few request pieces
they share (the engine request's start, a user turn with tool results in it).

An answer is a sequence of parts in the engine's order: reasoning, text, tool calls. One part is
open at a time; a new kind of delta (or a new tool call) closes it and opens the next. A tool call's
part is numbered (announced to the client) once the engine has named the tool, with the arguments
that came before. A dialect's builder (a `ChunkBuilder` subclass) says what its events look like
when the answer starts, when a part starts, grows and ends, and when the answer ends; `ChunkStream`
decodes the engine's SSE bytes for it and assembles the turn after the client has everything.
"""

from __future__ import annotations

import json
import secrets
from typing import TYPE_CHECKING, Any

from harness_env.core.capture import fastjson
from harness_env.core.capture.sse import SSEDecoder

if TYPE_CHECKING:
    from harness_env.core.capture.assemble import TurnDraft
    from harness_env.core.capture.dialects.base import ChatRequest

REASONING, TEXT, CALL, PENDING = "reasoning", "text", "call", "pending"  # what a part holds


def engine_request(request: ChatRequest) -> dict[str, Any]:
    """What every translated engine request starts with: the model, the messages, the stream flag
    (with usage asked for in the stream) and the tools."""
    out: dict[str, Any] = {"model": request.body.get("model"), "messages": request.messages, "stream": request.stream}
    if request.stream:
        out["stream_options"] = {"include_usage": True}
    if request.tools:
        out["tools"] = request.tools
    return out


def chat_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """One text part is a string, as chat clients send it; anything else stays a list of parts."""
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def user_turn(pieces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A user turn's pieces in order (chat content parts, and tool messages for the tool results in
    it) -> chat messages: each tool message where it stands, each run of parts between them one user
    message."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for piece in pieces:
        if piece.get("role") != "tool":
            parts.append(piece)
            continue
        if parts:
            out.append({"role": "user", "content": chat_content(parts)})
            parts = []
        out.append(piece)
    if parts or not out:
        out.append({"role": "user", "content": chat_content(parts)})
    return out


def new_id(prefix: str) -> str:
    """An id of this proxy's own (a message, an item, a tool call the engine gave none)."""
    return f"{prefix}_{secrets.token_hex(12)}"


def arguments_text(value: Any) -> str:
    """A replayed tool call's arguments object as the engine's argument string: json.dumps' layout,
    which is how vLLM's tool parsers write arguments (and chat templates re-serialise them anyway)."""
    return json.dumps(value if value is not None else {}, ensure_ascii=False)


def json_object(data: bytes | str) -> dict[str, Any] | None:
    """`data` parsed, if it is a JSON object (a tool call's arguments, an engine's answer)."""
    try:
        parsed = fastjson.loads(data)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


CHARS_PER_TOKEN = 4  # a token count's estimate when the engine gives none


def prompt_length(request: ChatRequest, engine_body: bytes) -> tuple[int, str]:
    """A token-count call's answer: the engine's prompt length (its usage, else its prompt ids),
    else an estimate from the translated request's size; and which of the two it is."""
    parsed = json_object(engine_body)
    if parsed is not None:
        usage = parsed.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            return usage["prompt_tokens"], "engine"
        ids = parsed.get("prompt_token_ids")
        if isinstance(ids, list) and ids:
            return len(ids), "engine"
    size = len(fastjson.dumps(request.messages)) + len(fastjson.dumps(request.tools))
    return -(-size // CHARS_PER_TOKEN), "estimate"


def engine_error(engine_body: bytes) -> dict[str, Any] | None:
    """The error object of an engine's error answer, when it has a message: OpenAI's
    `{"error": {...}}` or vLLM's flat `{"object": "error", "message": ...}`."""
    parsed = json_object(engine_body)
    err = parsed.get("error") if parsed is not None and isinstance(parsed.get("error"), dict) else parsed
    return err if err is not None and err.get("message") else None


def engine_error_text(engine_body: bytes, status: int) -> str:
    """An engine's error answer that is not JSON, as text."""
    return engine_body[:2000].decode("utf-8", errors="replace") or f"the engine answered {status}"


def engine_error_message(engine_body: bytes, status: int) -> str:
    """The message of an engine's error answer: its error object's, else the answer as text."""
    err = engine_error(engine_body)
    return str(err["message"]) if err is not None else engine_error_text(engine_body, status)


class Part:
    """One part of the answer while it is produced: its kind, the dialect's own object for it
    (`data`), its number once announced, and the text, reasoning or arguments so far."""

    def __init__(self, kind: str, data: dict[str, Any]) -> None:
        self.kind, self.data, self.index, self.buffer = kind, data, -1, []

    @property
    def raw(self) -> str:
        return "".join(self.buffer)


class ChunkBuilder:
    """Chat completion chunks in (`chunk`, then `end`), a dialect's events out, at once.

    Subclasses write the events: `start_events`, `new_part` (the dialect's object for a reasoning or
    text part), `call_part` (for a named tool call), `added` (a part is announced), `grew` (a delta),
    `closed` (a part ends; `part.raw` holds all of it) and `end_events` (how the answer ended, with
    `self.error` set when it broke off)."""

    def __init__(self) -> None:
        self.started = False
        self.done: list[Part] = []
        self.open: Part | None = None  # one at a time, in the engine's order
        self.calls: dict[int, Part] = {}  # engine tool-call index -> its part
        self.next_index = 0
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.prompt_ids: list[int] | None = None  # from the first chunk, when the engine sends them
        self.error: str | None = None

    # -- what a dialect writes ------------------------------------------------------------------
    def start_events(self) -> bytes:
        raise NotImplementedError

    def new_part(self, kind: str) -> dict[str, Any]:
        raise NotImplementedError

    def call_part(self, name: str, call_id: str) -> dict[str, Any]:
        raise NotImplementedError

    def added(self, part: Part) -> bytes:
        return b""

    def grew(self, part: Part, delta: str) -> bytes:
        return b""

    def closed(self, part: Part) -> bytes:
        return b""

    def end_events(self) -> bytes:
        raise NotImplementedError

    def on_choice(self, choice: dict[str, Any]) -> None:
        """A choice with a finish reason (e.g. vLLM's matched stop string)."""

    def final(self) -> dict[str, Any]:
        """The whole answer as the dialect's one JSON object (after `end`), an error object when
        the engine's answer broke off."""
        raise NotImplementedError

    stream_type = "text/event-stream"  # the content type of the events

    # -- parts ------------------------------------------------------------------------------------
    def start(self) -> bytes:
        self.started = True
        return self.start_events()

    def _open(self, kind: str, data: dict[str, Any]) -> bytes:
        out = self._close()
        self.open = Part(kind, data)
        return out if kind == PENDING else out + self._number(self.open)

    def _number(self, part: Part) -> bytes:
        part.index, self.next_index = self.next_index, self.next_index + 1
        return self.added(part)

    def _close(self) -> bytes:
        part, self.open = self.open, None
        if part is None:
            return b""
        if part.kind == PENDING:
            self.error = self.error or "the engine sent a tool call without a name"
            return b""
        self.done.append(part)
        return self.closed(part)

    def _grow(self, kind: str, delta: str) -> bytes:
        out = b""
        if self.open is None or self.open.kind != kind:
            out += self._open(kind, self.new_part(kind))
        self.open.buffer.append(delta)
        return out + self.grew(self.open, delta)

    def _call(self, call: dict[str, Any], position: int) -> bytes:
        """A chat tool-call delta: its part starts once the name is known, with the arguments so far."""
        index = call.get("index", position)
        fn = call.get("function") or {}
        out = b""
        part = self.calls.get(index)
        if part is None:
            out += self._open(PENDING, {"id": "", "name": ""})
            part = self.calls[index] = self.open
        if call.get("id") and not part.data["id"]:
            part.data["id"] = call["id"]
        arguments = fn.get("arguments") or ""
        if arguments:
            part.buffer.append(arguments)
        if part.kind == PENDING:
            part.data["name"] += fn.get("name") or ""
            if part.data["name"]:
                part.kind, part.data = CALL, self.call_part(part.data["name"], part.data["id"])
                out += self._number(part)
                if part.buffer:
                    out += self.grew(part, part.raw)
        elif arguments:
            out += self.grew(part, arguments)
        return out

    # -- feeding ----------------------------------------------------------------------------------
    def chunk(self, chunk: dict[str, Any]) -> bytes:
        out = b""
        if not self.started:
            ids = chunk.get("prompt_token_ids")
            self.prompt_ids = ids if isinstance(ids, list) else None
            out = self.start()
        if isinstance(chunk.get("error"), dict):
            self.error = str(chunk["error"].get("message") or json.dumps(chunk["error"]))[:2000]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                out += self._grow(REASONING, reasoning)
            if isinstance(delta.get("content"), str) and delta["content"]:
                out += self._grow(TEXT, delta["content"])
            for position, call in enumerate(delta.get("tool_calls") or ()):
                out += self._call(call, position)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                self.on_choice(choice)
        return out

    def end(self, error: str | None) -> bytes:
        """Close the open part and say how the answer ended (`error`: the engine's stream broke)."""
        out = (b"" if self.started else self.start()) + self._close()
        self.error = error or self.error
        if self.error is None and self.finish_reason is None:
            self.error = "the engine's stream ended without a finish reason"
        return out + self.end_events()

    def whole(self, engine_body: bytes) -> bytes:
        """A whole (non-streamed) engine answer, fed as one chunk: all its events."""
        parsed = json_object(engine_body)
        if parsed is not None:
            out = self.chunk(message_as_chunk(parsed))
        else:
            out, self.error = self.start(), "the engine's answer is not a JSON object"
        return out + self.end(None)


def whole_answer(builder: ChunkBuilder, request: ChatRequest, engine_body: bytes) -> tuple[bytes, str]:
    """A whole engine answer in the dialect: its events for a streamed request (the engine answered
    whole, the client still gets its stream), else its one object."""
    events = builder.whole(engine_body)
    if request.stream:
        return events, builder.stream_type
    return fastjson.dumps(builder.final()), "application/json"


def pass_on(out: dict[str, Any], source: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """The fields of `source` that are set, into `out` under chat's names (chat's name -> theirs)."""
    for ours, theirs in names.items():
        if source.get(theirs) is not None:
            out[ours] = source[theirs]
    return out


def message_as_chunk(body: dict[str, Any]) -> dict[str, Any]:
    """A whole chat.completion as one chunk whose delta is the message (tool calls indexed)."""
    choices = []
    for choice in body.get("choices") or ():
        msg = dict(choice.get("message") or {})
        msg["tool_calls"] = [{**c, "index": i} for i, c in enumerate(msg.get("tool_calls") or ())]
        choices.append({**choice, "delta": msg})
    return {"choices": choices, "usage": body.get("usage"), "error": body.get("error"), "prompt_token_ids": body.get("prompt_token_ids")}


class ChunkStream:
    """A streamed engine answer, translated chunk by chunk by a dialect's builder."""

    content_type = "text/event-stream"

    def __init__(self, builder: ChunkBuilder, draft: TurnDraft) -> None:
        self.builder = builder
        self.draft = draft
        self.decoder = SSEDecoder()
        self.chunks: list[dict[str, Any]] = []  # assembled into the draft after the client has everything

    def _events(self, payloads: list[str]) -> bytes:
        out = b""
        for data in payloads:
            if data.strip() == "[DONE]":
                continue
            try:
                chunk = fastjson.loads(data)
            except ValueError:
                self.draft.errors.append(f"malformed stream chunk: {data[:200]!r}")
                continue
            if not isinstance(chunk, dict):
                self.draft.errors.append(f"malformed stream chunk (not an object): {data[:200]!r}")
                continue
            self.chunks.append(chunk)
            out += self.builder.chunk(chunk)
        return out

    def feed(self, data: bytes) -> bytes:
        return self._events(self.decoder.feed(data))

    def close(self, error: str | None) -> bytes:
        return self._events(self.decoder.flush()) + self.builder.end(error)

    def finish(self) -> None:
        for chunk in self.chunks:  # off the latency path: ids, logprobs and text into the turn
            self.draft.add_chunk(chunk)
        self.chunks = []
