"""Token ids and logprobs held compactly while a rollout runs.

A prompt's ids are kept as the engine's own JSON text of the list (digits and commas, no
whitespace), cut out of the answer's bytes before the rest is parsed: turning 30,000 ids into
Python ints costs ~1 ms per call (and ~1 MB per turn as a list), while finding and slicing the text
costs microseconds. A prompt that extends an earlier one (the usual agent turn: the previous prompt
+ completion + the tool result) keeps only its new text, sharing the earlier pieces, so a rollout
holds its longest prompt about once. The lists of the wire format (models.Turn) are made only when
the result is built.

Completion ids and logprobs are few per turn; they are packed into arrays ('d' for logprobs: the
wire's float is a double, so each value stays exactly as the engine sent it).
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from harness_env.core.capture import fastjson

KEY = b'"prompt_token_ids"'
_WHITESPACE = b" \t\r\n"


def canonical_ids_text(inner: bytes) -> bytes | None:
    """The text between a JSON id list's brackets without whitespace; None if it holds a string
    or a nested list (then the first `]` may not end it, and the parsing path takes the answer).
    Values are taken as the engine sent them, as when it was parsed whole: checking every byte
    would cost more than the rest of the call on a long prompt."""
    if b'"' in inner or b"[" in inner:
        return None
    if b" " in inner or b"\n" in inner:  # vLLM writes none; Python's json.dumps writes ", "
        inner = inner.translate(None, _WHITESPACE)
    return inner


def cut_prompt_ids(body: bytes) -> tuple[bytes, bytes | None]:
    """`body` with its first `"prompt_token_ids": [...]` emptied (to `[]`), and that list's
    canonical text; (body, None) when there is no such list or it is not plain integers.

    The key cannot match inside a JSON string (quotes there are escaped), and an id list holds no
    nested bracket, so the first `]` after the `[` ends it."""
    k = body.find(KEY)
    if k < 0:
        return body, None
    colon = body.find(b":", k + len(KEY))
    if colon < 0 or body[k + len(KEY) : colon].strip():
        return body, None
    start = colon + 1
    while start < len(body) and body[start] in _WHITESPACE:
        start += 1
    if body[start : start + 1] != b"[":
        return body, None
    end = body.find(b"]", start)
    if end < 0:
        return body, None
    text = canonical_ids_text(body[start + 1 : end])
    if not text:
        return body, None
    return body[: start + 1] + body[end:], text


def ids_text(ids: Sequence[int]) -> bytes:
    """Canonical text of ids that were parsed already (a translating dialect's chunk)."""
    try:
        return fastjson.dumps(list(ids))[1:-1]
    except TypeError:  # pragma: no cover - fastjson falls back to json for what orjson refuses
        return json.dumps(list(ids), separators=(",", ":")).encode()[1:-1]


def ids_from_text(text: bytes) -> list[int]:
    if not text:
        return []
    try:
        return fastjson.loads(b"[" + text + b"]")
    except ValueError:  # digits JSON refuses (a leading zero): still the engine's numbers
        return [int(x) for x in text.split(b",")]


@dataclass(frozen=True, slots=True)
class PromptIds:
    """One prompt's ids: the canonical text in pieces, the first ones shared with the prompt it
    extends (the same bytes objects, held once)."""

    pieces: tuple[bytes, ...]
    size: int  # bytes of text over all pieces
    base: PromptIds | None = None  # the prompt this one extends (all pieces but the last are its)

    @classmethod
    def extending(cls, text: bytes, earlier: Iterable[PromptIds]) -> PromptIds:
        """`text` stored as its new end after the first of `earlier` whose ids it starts with."""
        for base in earlier:
            if base.is_prefix_of(text):
                tail = text[base.size :]
                return cls(base.pieces + (tail,), len(text), base) if tail else base
        return cls((text,), len(text))

    def is_prefix_of(self, text: bytes) -> bool:
        """Whether `text`'s ids start with all of these ids (compared in place, piece by piece;
        the next byte must end an id, so 12 is not taken for the start of 123)."""
        if self.size > len(text) or (self.size < len(text) and text[self.size] != 44):  # 44: ","
            return False
        at = 0
        for piece in self.pieces:
            if not text.startswith(piece, at):
                return False
            at += len(piece)
        return True

    def text(self) -> bytes:
        return b"".join(self.pieces)

    def ids(self, made: dict[int, list[int]] | None = None) -> list[int]:
        """The ids as a list. `made` holds the lists already made for other prompts (by id()):
        one that extends them is their list plus its own tail, parsed (a rollout's prompts are
        then parsed about once, not once per turn)."""
        if made is None:
            return ids_from_text(self.text())
        if id(self) in made:
            return list(made[id(self)])
        if self.base is not None and id(self.base) in made:
            out = made[id(self.base)] + ids_from_text(self.pieces[-1][1:])  # the tail starts with ","
        else:
            out = ids_from_text(self.text())
        made[id(self)] = out
        return list(out)


def pack_ids(ids: list[int]) -> array | list[int]:
    """Completion ids as an array of 32-bit ints; a list if one does not fit (never truncated)."""
    try:
        return array("i", ids)
    except OverflowError:
        return ids


def pack_logps(values: list[float]) -> array:
    return array("d", values)
