"""Keep secrets out of everything the proxy passes back to a harness or records.

An upstream that rejects a key often echoes it ("Incorrect API key provided: sk-..."); without
redaction the real key would reach the agent's tool output, the result's error, the log tails and
the recorded request messages of later turns. The Redactor removes each secret's full value and any
prefix or suffix of it at least half as long (a truncated echo such as "sk-proj-AbCd7x..."; a
masked form that keeps a few characters at the ends is left alone), in every spelling a reader may
decode back to it: raw, JSON-escaped (any character as `\\uXXXX` in either case, `\\/`, short
escapes, mixed with plain characters, escaped again inside a nested JSON string), percent-encoded,
and base64 at any alignment (whole only). A harness that decodes an error body must find only the
mask.

Secrets come from the session (the endpoint's upstream key) and from a process-wide registry where
other components add theirs (judge keys, the server token): `register_secret(value)`.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import itertools
import json
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import SecretStr

MASK = "[redacted]"
MIN_SECRET_CHARS = 8  # shorter values are too likely to occur in ordinary text to be masked
MAX_STREAM_CARRY = 64 * 1024  # a streamed line longer than this is cut without waiting for its end
MAX_BACKSLASHES = 8  # an escape inside JSON nested this deep in JSON strings is still recognised
MAX_DECODING_PASSES = 4  # escapes written with escapes (a URL-encoded JSON escape, ...) are decoded this deep
MASK_IN_THREAD_BYTES = 256 * 1024  # a body this long is masked off the event loop
MIN_BASE64_SECRET_CHARS = 12  # a shorter secret's base64 core is too short to be told from other text

_lock = threading.Lock()
_registered: dict[str, int] = {}  # secret -> registration count (two owners may register one value)
_version = 0


def register_secret(value: str | SecretStr | None) -> None:
    """Mask `value` from now on in every capture session of this process. Values shorter than
    MIN_SECRET_CHARS are ignored (they cannot be masked without mangling ordinary text)."""
    global _version
    text = value.get_secret_value() if isinstance(value, SecretStr) else value
    if not text or len(text) < MIN_SECRET_CHARS:
        return
    with _lock:
        _registered[text] = _registered.get(text, 0) + 1
        _version += 1


def unregister_secret(value: str | SecretStr | None) -> None:
    """Undo one register_secret(value) (for owners whose secret goes away, and tests)."""
    global _version
    text = value.get_secret_value() if isinstance(value, SecretStr) else value
    with _lock:
        if text in _registered:
            _registered[text] -= 1
            if _registered[text] <= 0:
                del _registered[text]
            _version += 1


def registry_version() -> int:
    """Changes whenever the registry does: a cached Redactor is stale once this moves."""
    return _version


def registered_secrets() -> frozenset[str]:
    with _lock:
        return frozenset(_registered)


def _lines(secret: str) -> list[str]:
    """A secret of several lines (a PEM key) is masked line by line, so no form spans a line break
    (what StreamRedactor relies on)."""
    return [line for line in secret.splitlines() if line]


def _spellings(secret: str, encoded: bool = True) -> set[str]:
    """The fixed forms a secret takes in text: as is, inside a JSON string (with or without "\\/"),
    and (`encoded`) its hex (either case: a gateway's dump of a header) and its base64 (standard and
    URL alphabets) at each of the three alignments it can have inside a longer encoded text: the
    encoded characters that depend on the secret's bytes only."""
    forms = set(_lines(secret))
    escaped = json.dumps(secret)[1:-1]
    forms |= {escaped, escaped.replace("/", "\\/")}
    raw = secret.encode()
    if encoded and len(secret) >= MIN_BASE64_SECRET_CHARS:
        forms |= {raw.hex(), raw.hex().upper()}
        for k in range(3):
            encoded = base64.b64encode(b"\0" * k + raw).decode()
            core = encoded[4 if k else 0 : len(encoded) - (4 if (k + len(raw)) % 3 else 0)]
            forms |= {core, core.replace("+", "-").replace("/", "_")}
    return forms


# How a JSON string writes a character besides itself: `\\uXXXX` (hex in either case), a short
# escape; a URL writes `%XX`. A run of backslashes is one escape too (escaped again inside a JSON
# string in JSON), so nested forms decode at once.
_SHORT_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}
_UNESCAPE = {v: k for k, v in _SHORT_ESCAPES.items()}


def _escape_regexes(chars: set[str]) -> tuple[str, ...]:
    """Regexes of the escapes that can stand for a character of a secret: any `\\u` escape and the
    short escapes of the secrets' own characters only (an ordinary `\\n` is no escape then), and
    any `%XX`. Each starts with a backslash or a percent sign (what `_gates` relies on)."""
    short = "".join(sorted(_SHORT_ESCAPES[c] for c in chars & set(_SHORT_ESCAPES)))
    alternative = f"|([{re.escape(short)}])" if short else ""
    backslashed = rf"\\\\{{0,{MAX_BACKSLASHES - 1}}}(?:u([0-9a-fA-F]{{4}}){alternative})"
    return backslashed, r"%([0-9a-fA-F]{2})"


class _Decoded[T: (str, bytes)]:
    """`text` with the escapes `pattern` finds decoded (the view a reader gets back), and the way
    back from the view's offsets to the text's: one regex pass, a little per escape."""

    def __init__(self, text: T, pattern: re.Pattern[T]) -> None:
        at: list[int] = []  # per escape: where it starts in the text,
        end: list[int] = []  # where it ends,
        size: list[int] = []  # and how long what it stands for is

        known: dict[T, T] = {}

        def decode(m: re.Match[T]) -> T:
            escape = m.group()
            char = known.get(escape)
            if char is None:
                char = known[escape] = _decode(m, text)
            start, stop = m.span()
            at.append(start)
            end.append(stop)
            size.append(len(char))
            return char

        self.view: T = pattern.sub(decode, text)
        # saved[i]: how much shorter the view is than the text before escape i
        self._saved = list(itertools.accumulate((e - a - n for a, e, n in zip(at, end, size)), initial=0))
        self._view_at = [a - self._saved[i] for i, a in enumerate(at)]
        self._at, self._end, self._size = at, end, size

    def _escape_at(self, offset: int) -> int:
        """The last escape starting at or before the view's `offset` (-1: none)."""
        return bisect.bisect_right(self._view_at, offset) - 1

    def text_span(self, start: int, end: int) -> tuple[int, int]:
        """The text's span of the view's [start, end): whole escapes at both ends."""
        i, j = self._escape_at(start), self._escape_at(end - 1)
        if i >= 0 and start < self._view_at[i] + self._size[i]:
            first = self._at[i]
        else:
            first = start + self._saved[i + 1]
        if j >= 0 and end - 1 < self._view_at[j] + self._size[j]:
            last = self._end[j]
        else:
            last = end + self._saved[j + 1]
        return first, last


def _decode[T: (str, bytes)](m: re.Match[T], text: T) -> T:
    """The character an escape stands for (in bytes: its UTF-8 bytes, or the byte of a `%XX`)."""
    code, short = m.group(1), m.group(2) if m.re.groups > 1 else None
    percent = m.group(0)[:1] in ("%", b"%")
    if isinstance(text, str):
        return chr(int(code, 16)) if code is not None else _UNESCAPE[short]  # type: ignore[index,return-value]
    if code is not None:
        return bytes([int(code, 16)]) if percent else chr(int(code, 16)).encode("utf-8", "surrogatepass")  # type: ignore[return-value]
    return _UNESCAPE[short.decode()].encode()  # type: ignore[union-attr,return-value]


class _Needle[T: (str, bytes)]:
    """One spelling of a secret. Echoes keep its start (truncated: "sk-proj-AbCd...") or its end,
    so any prefix or suffix at least half as long is masked: it begins with the secret's first
    `min_len` characters or ends with its last ones, two plain searches per text."""

    def __init__(self, value: T, partial: bool = True) -> None:
        self.value = value
        self.min_len = max(MIN_SECRET_CHARS, (len(value) + 1) // 2) if partial else len(value)
        self.head, self.tail = value[: self.min_len], value[-self.min_len :]

    def spans(self, text: T) -> list[tuple[int, int]]:
        value, n, found = self.value, len(self.value), []
        p = text.find(self.head)
        while p >= 0:  # a prefix: extend it to the right as far as it follows the secret
            end, j = p + self.min_len, self.min_len
            while j < n and end < len(text) and text[end] == value[j]:
                end, j = end + 1, j + 1
            found.append((p, end))
            p = text.find(self.head, p + 1)
        if self.tail == self.head:
            return found  # a short secret: masked only whole
        p = text.find(self.tail)
        while p >= 0:  # a suffix: extend it to the left
            start, j = p, n - self.min_len
            while j > 0 and start > 0 and text[start - 1] == value[j - 1]:
                start, j = start - 1, j - 1
            found.append((start, p + self.min_len))
            p = text.find(self.tail, p + 1)
        return found


def _gates[T: (str, bytes)](needles: list[_Needle[T]], backslash: T, percent: T) -> tuple[T, ...]:
    """What a text must hold for one of `needles` to be found in it, in any spelling: a backslash
    or a percent sign (every escape starts with one), or the start or end of a spelling that holds
    neither. One-character searches run at memchr speed, and most texts hold none of them."""
    if not needles:
        return ()
    plain = {part for n in needles for part in (n.head, n.tail) if backslash not in part and percent not in part}
    return (backslash, percent, *sorted(plain))


class Redactor:
    """Masks a fixed set of secrets in str, bytes and JSON-like values. `partial=False` masks only
    whole secrets: for the policy's own answers, whose text a prefix match would corrupt (the model
    never saw the key, so only an error body can echo part of it). It leaves base64 out too: every
    streamed chunk is scanned, and only an echo (an error body) writes a key's base64."""

    def __init__(self, secrets: Iterable[str], partial: bool = True) -> None:
        kept = [s for s in secrets if s and len(s) >= MIN_SECRET_CHARS]
        forms = {f for s in kept for f in _spellings(s, encoded=partial) if len(f) >= MIN_SECRET_CHARS}
        self._str = [_Needle(f, partial) for f in sorted(forms)]
        self._bytes = [_Needle(f.encode(), partial) for f in sorted(forms)]
        escapes = _escape_regexes({c for s in kept for c in s})
        self._escapes_str = tuple(re.compile(e) for e in escapes)
        self._escapes_bytes = tuple(re.compile(e.encode()) for e in escapes)
        self._gates_str: tuple[str, ...] = _gates(self._str, "\\", "%")
        self._gates_bytes: tuple[bytes, ...] = _gates(self._bytes, b"\\", b"%")
        # An escaped secret is longer than its plain form: up to a run of backslashes, "u" and 4
        # hex digits per character.
        self.longest = max((len(n.value) for n in self._bytes), default=0) * (MAX_BACKSLASHES + 5)

    def __bool__(self) -> bool:
        return bool(self._str)

    @staticmethod
    def _spans[T: (str, bytes)](text: T, needles: list[_Needle[T]]) -> list[tuple[int, int]]:
        spans: list[tuple[int, int]] = []
        for n in needles:  # per streamed chunk: no generator or sort when nothing is found
            if n.head in text or n.tail in text:
                spans += n.spans(text)
        return spans

    def _all_spans[T: (str, bytes)](self, text: T, needles: list[_Needle[T]], escapes: tuple[re.Pattern[T], ...]) -> list[tuple[int, int]]:
        """Where the secrets are in `text`: as written, and as a reader decodes it (each kind of
        escape decoded in turn, where its regex finds one)."""
        spans = self._spans(text, needles)
        views: list[_Decoded[T]] = []
        view = text
        for _ in range(MAX_DECODING_PASSES):  # again while escapes are left: `%5Cu0073`, `\\u005cu0073`
            found = False
            for pattern in escapes:
                if pattern.search(view) is not None:  # faster than a plain search for "\\u" (a slow one to find)
                    views.append(_Decoded(view, pattern))
                    found, view = True, views[-1].view
            if not found:
                break
        if views:
            for span in self._spans(view, needles):
                for decoded in reversed(views):
                    span = decoded.text_span(*span)
                spans.append(span)
        return spans

    @staticmethod
    def _clear[T: (str, bytes)](text: T, gates: tuple[T, ...]) -> bool:
        """Whether `text` holds none of `gates`: then no secret is in it, in any spelling."""
        for gate in gates:
            if gate in text:
                return False
        return True

    def _apply[T: (str, bytes)](self, text: T, needles: list[_Needle[T]], escapes: tuple[re.Pattern[T], ...], mask: T) -> T:
        if self._clear(text, self._gates_bytes if isinstance(text, bytes) else self._gates_str):  # type: ignore[arg-type]
            return text
        spans = self._all_spans(text, needles, escapes)
        if not spans:
            return text
        spans.sort()
        out, pos = [], 0
        for start, end in spans:
            if end <= pos:
                continue  # inside a span already masked
            if start > pos:
                out.append(text[pos:start])
            if start >= pos:
                out.append(mask)
            pos = end
        out.append(text[pos:])
        return mask[:0].join(out)

    def redact(self, text: str) -> str:
        return self._apply(text, self._str, self._escapes_str, MASK) if self._str and text else text

    def redact_bytes(self, data: bytes) -> bytes:
        return self._apply(data, self._bytes, self._escapes_bytes, MASK.encode()) if self._bytes and data else data

    def found_in(self, data: bytes) -> bool:
        return bool(self._bytes) and not self._clear(data, self._gates_bytes) and bool(self._all_spans(data, self._bytes, self._escapes_bytes))

    def redact_value(self, value: Any) -> Any:
        """A copy of a JSON-like value (dicts, lists, strings) with every string redacted."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, list):
            return [self.redact_value(v) for v in value]
        if isinstance(value, dict):
            return {self.redact(k) if isinstance(k, str) else k: self.redact_value(v) for k, v in value.items()}
        return value


async def masked(redactor: Redactor, content: bytes) -> bytes:
    """`content` with its secrets masked; a long body off the event loop (one dense with escapes
    costs about 0.2 s per MB to decode and scan)."""
    if len(content) < MASK_IN_THREAD_BYTES:
        return redactor.redact_bytes(content)
    return await asyncio.to_thread(redactor.redact_bytes, content)


class StreamRedactor:
    """Redacts a byte stream chunk by chunk, so a secret split across two chunks is still found.

    It holds back only what follows the last line break: a secret never spans a line break, and an
    SSE client acts on complete lines only, so this costs the client no time (SSE events end with a
    blank line, so a chunk from an engine almost always ends on one and nothing is held back).
    """

    def __init__(self, redactor: Redactor) -> None:
        self._r = redactor
        self._carry = b""

    def feed(self, chunk: bytes) -> bytes:
        if not self._r:
            return chunk
        buf = self._carry + chunk if self._carry else chunk
        if buf.endswith(b"\n"):  # the usual chunk, ending on a line break: nothing held back, nothing copied
            self._carry = b""
            return self._r.redact_bytes(buf)
        cut = max(buf.rfind(b"\n"), buf.rfind(b"\r")) + 1  # SSE lines may also end in a lone CR
        if len(buf) - cut > MAX_STREAM_CARRY:
            # A huge line with no end yet: mask it whole, and keep back only what could be the
            # start of a secret that continues in the next chunk.
            buf = self._r.redact_bytes(buf)
            cut = max(0, len(buf) - (self._r.longest - 1))
        self._carry = buf[cut:]
        return self._r.redact_bytes(buf[:cut])

    def flush(self) -> bytes:
        rest, self._carry = self._carry, b""
        return self._r.redact_bytes(rest)

    def relay(self, data: bytes, translate: Callable[[bytes], bytes], *, last: bool = False) -> bytes:
        """What the client gets of upstream bytes: redacted, then put in its dialect by `translate`
        (`last`: the stream ends here, so what was held back goes too)."""
        out = self.feed(data) if data else b""
        if last:
            out += self.flush()
        return translate(out) if out else b""
