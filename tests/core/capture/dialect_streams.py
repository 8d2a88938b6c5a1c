"""Helpers for the translating dialects' tests: an engine's SSE chunks, and a dialect's stream of
named events parsed back, fed in awkward pieces."""

import json
import threading
import time

from harness_env.core.capture.assemble import TurnDraft


def sse(*chunks) -> bytes:
    """The engine's chat-completion chunks as its SSE stream, ending with [DONE]."""
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def chunk(delta=None, finish=None, **top) -> dict:
    return {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}], **top}


# Engine answers every dialect must pass on, each in its own shape: cut by max_tokens, ended with
# no finish reason (nor [DONE]), an error mid-stream, a tool call that never got a name.
CUT_BY_LENGTH = sse(chunk({"content": "par"}), chunk(finish="length"))
NO_FINISH = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'
ENGINE_ERROR = sse(chunk({"content": "x"}), {"error": {"message": "engine overloaded"}})
NAMELESS_CALL = sse(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}), chunk(finish="tool_calls"))
NOT_JSON = b"<html>oops</html>"  # a whole answer that is not a chat completion
# "Hello" in two pieces with the engine's own ids and logprobs (prompt [1, 2, 3], completion [7, 8],
# logprobs -0.5 and -0.25), then its usage with one cached prompt token.
HELLO_WITH_IDS = sse(
    chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1, 2, 3]),
    {"choices": [{"index": 0, "delta": {"content": "Hel"}, "token_ids": [7], "logprobs": {"content": [{"token": "Hel", "logprob": -0.5}]}}]},
    {"choices": [{"index": 0, "delta": {"content": "lo"}, "token_ids": [8], "logprobs": {"content": [{"token": "lo", "logprob": -0.25}]}}]},
    chunk(finish="stop"),
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1}}},
)


def broken_stream(dialect, request) -> tuple[bytes, TurnDraft]:
    """What the client got, and the turn draft, when the engine's stream sends "par", then a chunk
    that is not JSON, then breaks."""
    draft = TurnDraft()
    stream = dialect.stream(request, draft)
    out = stream.feed(b'data: {"choices": [{"index": 0, "delta": {"content": "par"}}]}\n\ndata: {"choices": [ this is not json\n\n')
    out += stream.close("upstream stream broke: ClientPayloadError: cut")
    return out, draft


def whole_chat(tool: str, arguments: str, reasoning: str | None = None, **top) -> bytes:
    """An engine's whole chat completion: "Let me look." (after `reasoning`, if any) and a call of
    `tool` (id call_z), 9 prompt and 4 completion tokens; `top`: more fields (prompt_token_ids)."""
    message = {"role": "assistant", "content": "Let me look.", **({"reasoning_content": reasoning} if reasoning else {})}
    message["tool_calls"] = [{"id": "call_z", "type": "function", "function": {"name": tool, "arguments": arguments}}]
    usage = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
    return json.dumps({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": message}], "usage": usage, **top}).encode()


def named_events(raw: bytes) -> list[dict]:
    """The events of an SSE stream whose `event:` line names its data's type (checked)."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        event = json.loads(lines["data"])
        assert lines["event"] == event["type"]
        out.append(event)
    return out


def translate(dialect, request, raw: bytes, *, split: int = 7) -> tuple[bytes, TurnDraft]:
    """Feed the engine's SSE bytes to the dialect's stream in pieces of `split` bytes; return what
    the client got and the turn draft."""
    draft = TurnDraft()
    stream = dialect.stream(request, draft)
    out = b"".join(stream.feed(raw[i : i + split]) for i in range(0, len(raw), split)) + stream.close(None)
    stream.finish()
    return out, draft


def as_javascript_sends(value):
    """`value` as a JavaScript harness (Claude Code, Gemini CLI) sends it back after JSON.parse:
    numbers without their spelling (1.0 and 1e5 are 1 and 100000)."""
    return json.loads(json.dumps(value), parse_float=lambda s: int(float(s)) if float(s).is_integer() else float(s))


class HeldEnd(list):
    """A fake-policy step's raw chunks whose last (the end) the engine sends only once the client
    has a word: the test calls word_seen() on each word it reads. A proxy that held the stream back
    until the end would pass no word on before it (the engine gives up holding after 20 s, and
    word_seen() then fails)."""

    def __init__(self, chunks: list[str]) -> None:
        super().__init__(chunks)
        self.ended = threading.Event()
        self.released_at: float | None = None  # time.monotonic() when the end was let go
        self._go = threading.Event()

    def __iter__(self):  # iterated by the fake engine's thread as it streams
        *head, end = list.__iter__(self)
        yield from head
        self._go.wait(20)  # holds the fake engine's loop: it serves this one call
        self.ended.set()
        yield end

    def word_seen(self) -> None:
        if self.released_at is None:
            assert not self.ended.is_set(), "the first word reached the client only after the engine's end"
            self.released_at = time.monotonic()
            self._go.set()


def slow_words(*words: str, gap_s: float = 0.3) -> dict:
    """A fake-policy step streaming one word a chunk, `gap_s` apart, then the end, held (HeldEnd)."""
    pieces = [f'data: {{"choices": [{{"index": 0, "delta": {{"content": "{w} "}}}}]}}\n\n' for w in words]
    return {"raw": HeldEnd([*pieces, 'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n']), "gap_s": gap_s}


def assert_exact_tokens_one_branch(policy, session, stream: bool, tool: str) -> None:
    """Two calls through the proxy (a tool call, then an answer): the engine got chat completions
    with the session's policy, the turns hold its own ids, and the second prompt extends the first
    prompt + completion."""
    first, second = policy.sent
    assert first.request["return_token_ids"] is True and first.request["model"] == "m"
    t1, t2 = session.sorted_turns()
    assert (t1.prompt_token_ids, t1.completion_token_ids, t1.per_token_logps) == (first.prompt_token_ids, first.completion_token_ids, first.logprobs)
    assert t2.completion_token_ids == second.completion_token_ids and t1.stream is stream and (t1.ttft_s is not None) is stream
    assert t2.prompt_token_ids[: len(t1.prompt_token_ids) + len(t1.completion_token_ids)] == t1.prompt_token_ids + t1.completion_token_ids
    assert t1.request_messages == first.request["messages"] and t1.tool_calls[0]["function"]["name"] == tool


def assert_replay_extends(first, second, new: list[dict]) -> None:
    """The second request's chat messages are the first's plus `new`, with the same tools."""
    assert second.messages[: len(first.messages)] == first.messages
    assert second.messages[len(first.messages) :] == new
    assert second.tools == first.tools


def call_stream(tool: str, arguments: str) -> bytes:
    """The engine's stream of reasoning "plan", text "On it." and a call of `tool` (id call_1): what
    replayed_call's assistant message records."""
    call = {"index": 0, "id": "call_1", "function": {"name": tool, "arguments": arguments}}
    return sse(chunk({"reasoning_content": "plan"}), chunk({"content": "On it."}), chunk({"tool_calls": [call]}), chunk(finish="tool_calls"))


def replayed_call(tool: str, arguments: str) -> list[dict]:
    """The chat messages a replayed call adds: the assistant's ("On it.", reasoning "plan", a call
    of `tool` with id call_1) and the tool's answer "a\n"."""
    call = {"id": "call_1", "type": "function", "function": {"name": tool, "arguments": arguments}}
    assistant = {"role": "assistant", "content": "On it.", "reasoning_content": "plan", "tool_calls": [call]}
    return [assistant, {"role": "tool", "tool_call_id": "call_1", "content": "a\n"}]
