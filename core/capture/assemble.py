"""Assemble a turn record from a chat completion: whole (non-streaming) or chunk by chunk (SSE).

Token ids come only from the engine (vLLM's `prompt_token_ids` and per-choice `token_ids`, or
logprob tokens of the form `token_id:N`); nothing is re-tokenized and nothing is zero-filled.
Only choice 0 is recorded: harnesses ask for one completion. The prompt's ids are cut out of the
engine's bytes as text before the rest is parsed (core/capture/tokens.py): they are most of an
answer, and the proxy needs them only when the result is built.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from harness_env.core.capture import fastjson
from harness_env.core.capture.tokens import KEY, cut_prompt_ids, ids_from_text, ids_text
from harness_env.models import CaptureLevel, TopLogprob

TOKEN_ID_PREFIX = "token_id:"
_KEY_STR = KEY.decode()


def _token_id_from_str(token: str) -> int | None:
    if token.startswith(TOKEN_ID_PREFIX):
        try:
            return int(token[len(TOKEN_ID_PREFIX) :])
        except ValueError:
            return None
    return None


@dataclass
class TurnDraft:
    prompt_text: bytes | None = None  # the prompt's ids as canonical JSON text, when cut from the bytes
    prompt_list: list[int] = field(default_factory=list)  # ... or as parsed (a translating dialect's chunk)
    completion_token_ids: list[int] = field(default_factory=list)
    per_token_logps: list[float] = field(default_factory=list)
    completion_tokens: list[str] = field(default_factory=list)
    top_logprobs: list[list[TopLogprob]] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    reasoning_parts: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)
    logprobs_invalid: bool = False  # a logprob was null, NaN or infinite (vLLM past a model's positions)
    chunks: int = 0
    unread: bytes | None = None  # a whole answer passed on as it came, read once the harness has it (`read_unread`)

    @property
    def has_prompt(self) -> bool:
        return bool(self.prompt_text or self.prompt_list)

    @property
    def prompt_token_ids(self) -> list[int]:
        return ids_from_text(self.prompt_text) if self.prompt_text else self.prompt_list

    def prompt_ids_text(self) -> bytes | None:
        """The prompt's ids as canonical text (core/capture/tokens.py), None if there are none."""
        if self.prompt_text:
            return self.prompt_text
        return ids_text(self.prompt_list) if self.prompt_list else None

    def _cut(self, content: bytes) -> bytes:
        if self.has_prompt:
            return content
        content, text = cut_prompt_ids(content)
        if text:
            self.prompt_text = text
        return content

    # -- feeding ------------------------------------------------------------------------------
    def read_unread(self) -> None:
        """Read the whole answer kept `unread` (the turn is recorded from it)."""
        if self.unread is not None:
            content, self.unread = self.unread, None
            self.add_response_body(content)

    def add_response_body(self, content: bytes) -> None:
        """A non-streaming answer as the engine sent it; what is not a JSON object is an error."""
        try:
            parsed = fastjson.loads(self._cut(content))
            if isinstance(parsed, dict):
                self.add_response(parsed)
            else:
                self.errors.append("upstream body is not a JSON object")
        except ValueError:  # not JSON, or a logprob that is not a number
            self.errors.append(f"upstream body is not JSON: {content[:200]!r}")

    def add_response(self, body: dict[str, Any]) -> None:
        """A non-streaming chat.completion body."""
        self._top_level(body)
        choices = body.get("choices") or []
        if not choices:
            return
        choice = choices[0]
        msg = choice.get("message") or {}
        self._content(msg)
        for i, call in enumerate(msg.get("tool_calls") or []):
            fn = call.get("function") or {}
            self.tool_calls[i] = {
                "id": call.get("id"),
                "type": call.get("type", "function"),
                "function": {"name": fn.get("name", ""), "arguments": fn.get("arguments", "")},
            }
        self._choice_common(choice)

    def add_chunk_text(self, data: str) -> None:
        """One SSE `data:` payload of a chat.completion.chunk stream."""
        if data == "[DONE]" or data.strip() == "[DONE]":
            return
        try:
            chunk = fastjson.loads(self._cut(data.encode()) if _KEY_STR in data else data)
        except ValueError:
            self.errors.append(f"malformed stream chunk: {data[:200]!r}")
            return
        if not isinstance(chunk, dict):
            self.errors.append(f"malformed stream chunk (not an object): {data[:200]!r}")
            return
        self.add_chunk(chunk)

    def add_chunk_bytes(self, data: bytes) -> None:
        """One SSE `data:` payload as the stream's bytes: read as add_chunk_text reads its text,
        without decoding it first; what is not a JSON object (or not UTF-8) goes the text's way,
        for its errors and replacement characters."""
        if data == b"[DONE]":
            return
        cut = not self.has_prompt and KEY in data
        try:
            chunk = fastjson.loads(self._cut(data) if cut else data)
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict):
            if cut:
                self.prompt_text = None  # as before this payload: the text's way cuts it again
            self.add_chunk_text(data.decode("utf-8", errors="replace"))
            return
        self.add_chunk(chunk)

    def add_chunk(self, chunk: dict[str, Any]) -> None:
        # Runs once per chunk of every stream: the common chunk (a piece of text, its ids and
        # logprobs) takes as few calls and lookups as the reading allows.
        self.chunks += 1
        error = chunk.get("error")
        if isinstance(error, dict):
            self.errors.append(f"error in stream: {json.dumps(error)[:500]}")
        if "usage" in chunk or (self.prompt_text is None and not self.prompt_list):
            self._top_level(chunk)
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if delta:
                content = delta.get("content")
                if type(content) is str and len(delta) == 1:
                    self.text_parts.append(content)
                else:
                    self._content(delta)
                    calls = delta.get("tool_calls")
                    if calls:
                        self._tool_call_deltas(calls)
            self._choice_common(choice)

    def _tool_call_deltas(self, calls: list[dict[str, Any]]) -> None:
        for call in calls:
            slot = self.tool_calls.setdefault(
                call.get("index", len(self.tool_calls)), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            )
            if call.get("id"):
                slot["id"] = call["id"]
            fn = call.get("function") or {}
            if fn.get("name"):
                slot["function"]["name"] += fn["name"]
            if fn.get("arguments"):
                slot["function"]["arguments"] += fn["arguments"]

    def _top_level(self, obj: dict[str, Any]) -> None:
        # Parsed prompt ids (a translating dialect's chunk) are kept as the engine sent them,
        # without a per-token conversion.
        if self.prompt_text is None and not self.prompt_list:
            ids = obj.get("prompt_token_ids")
            if ids and isinstance(ids, list):
                self.prompt_list = ids
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage

    def _content(self, msg: dict[str, Any]) -> None:
        # The common delta (a piece of text) with as few lookups as possible: this runs per chunk.
        content = msg.get("content")
        if isinstance(content, str):
            self.text_parts.append(content)
        if len(msg) > 1 or content is None:
            for key in ("reasoning_content", "reasoning"):
                value = msg.get(key)
                if isinstance(value, str):
                    self.reasoning_parts.append(value)
                    break

    def _choice_common(self, choice: dict[str, Any]) -> None:
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            self.completion_token_ids.extend(ids)
        if self.prompt_text is None and not self.prompt_list:
            ids = choice.get("prompt_token_ids")  # some servers put them on the choice
            if ids and isinstance(ids, list):
                self.prompt_list = ids
        logprobs = choice.get("logprobs")
        if logprobs and isinstance(logprobs, dict):
            tokens, logps = self.completion_tokens, self.per_token_logps
            for item in logprobs.get("content") or ():
                token, logp = item.get("token", ""), item.get("logprob")
                tokens.append(token if type(token) is str else str(token))
                if type(logp) is float and logp - logp == 0.0:  # a finite float, as the engine writes them
                    logps.append(logp)
                    tops = item.get("top_logprobs")
                    if tops:
                        self._top_logprobs(tops)
                    continue
                logp = _finite(logp)
                if logp is None and not self.logprobs_invalid:
                    self.logprobs_invalid = True
                    self.errors.append(
                        f"the engine sent a logprob that is not a finite number ({item.get('logprob')!r}) "
                        f"at completion token {len(logps)}: the turn's logprobs are left out"
                    )
                logps.append(logp if logp is not None else 0.0)
                tops = item.get("top_logprobs")
                if tops:
                    self._top_logprobs(tops)
        finish = choice.get("finish_reason")
        if finish:
            self.finish_reason = finish

    def _top_logprobs(self, tops: list[dict[str, Any]]) -> None:
        self.top_logprobs.append(
            [
                TopLogprob.model_construct(  # plain JSON values: no validation per token
                    token=str(t.get("token", "")), logprob=lp, token_id=_token_id_from_str(str(t.get("token", "")))
                )
                for t in tops
                if (lp := _finite(t.get("logprob"))) is not None
            ]
        )

    # -- results ------------------------------------------------------------------------------
    def final_completion_ids(self) -> list[int]:
        if self.completion_token_ids:
            return self.completion_token_ids
        ids = [_token_id_from_str(t) for t in self.completion_tokens]
        if ids and all(i is not None for i in ids):
            return [i for i in ids if i is not None]
        return []

    def capture_level(self) -> CaptureLevel:
        if self.has_prompt and self.final_completion_ids():
            return "tokens"
        if self.per_token_logps:
            return "logprobs"
        return "text"

    def fields(self) -> dict[str, Any]:
        """Keyword arguments for models.Turn."""
        return {"prompt_token_ids": self.prompt_token_ids, **self.record_fields()}

    def record_fields(self) -> dict[str, Any]:
        """The Turn's fields but the prompt's ids (kept as text: `prompt_ids_text`)."""
        return {
            "completion_token_ids": self.final_completion_ids(),
            # Never a made-up number: a turn with one logprob that is not one has none.
            "per_token_logps": [] if self.logprobs_invalid else self.per_token_logps,
            "completion_tokens": self.completion_tokens,
            "top_logprobs": [] if self.logprobs_invalid else self.top_logprobs,
            "completion_text": "".join(self.text_parts),
            "reasoning_text": "".join(self.reasoning_parts),
            "tool_calls": [self.tool_calls[k] for k in sorted(self.tool_calls)],
            "finish_reason": self.finish_reason,
            "usage": self.usage,
            "capture_level": self.capture_level(),
        }


def _finite(value: Any) -> float | None:
    """A logprob as a float, or None where it is not a finite number (null, NaN, infinite, text)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None
