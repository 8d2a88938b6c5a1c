"""Keep secrets out of everything the proxy passes back to a harness or records.

An upstream that rejects a key often echoes it ("Incorrect API key provided: sk-..."); without
redaction the real key would reach the agent's tool output, the result's error, the log tails and
the recorded request messages of later turns. The Redactor removes each secret's full value and any
prefix or suffix of it at least half as long (a truncated echo such as "sk-proj-AbCd7x..."; a
masked form that keeps a few characters at the ends is left alone), in its raw and JSON-escaped
spellings.

Secrets come from the session (the endpoint's upstream key) and from a process-wide registry where
other components add theirs (judge keys, the server token): `register_secret(value)`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from pydantic import SecretStr

MASK = "[redacted]"
MIN_SECRET_CHARS = 8  # shorter values are too likely to occur in ordinary text to be masked
MAX_STREAM_CARRY = 64 * 1024  # a streamed line longer than this is cut without waiting for its end

_lock = threading.Lock()
_registered: dict[str, int] = {}  # secret -> registration count (two owners may register one value)
_version = 0

T = TypeVar("T", str, bytes)


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


def _spellings(secret: str) -> set[str]:
    """The forms a secret takes in text: as is, and inside a JSON string (with or without "\\/").
    A secret of several lines (a PEM key) is also masked line by line, so no form spans a line
    break (what StreamRedactor relies on)."""
    escaped = json.dumps(secret)[1:-1]
    return {*secret.splitlines(), escaped, escaped.replace("/", "\\/")}


class _Needle(Generic[T]):
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


class Redactor:
    """Masks a fixed set of secrets in str, bytes and JSON-like values. `partial=False` masks only
    whole secrets: for the policy's own answers, whose text a prefix match would corrupt (the model
    never saw the key, so only an error body can echo part of it)."""

    def __init__(self, secrets: Iterable[str], partial: bool = True) -> None:
        forms = {f for s in secrets if s and len(s) >= MIN_SECRET_CHARS for f in _spellings(s) if len(f) >= MIN_SECRET_CHARS}
        self._str = [_Needle(f, partial) for f in sorted(forms)]
        self._bytes = [_Needle(f.encode(), partial) for f in sorted(forms)]
        self.longest = max((len(n.value) for n in self._bytes), default=0)

    def __bool__(self) -> bool:
        return bool(self._str)

    def _apply(self, text: T, needles: list[_Needle[T]], mask: T) -> T:
        spans: list[tuple[int, int]] = []
        for n in needles:  # per streamed chunk: no generator or sort when nothing is found
            if n.head in text or n.tail in text:
                spans += n.spans(text)
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
        return self._apply(text, self._str, MASK) if self._str and text else text

    def redact_bytes(self, data: bytes) -> bytes:
        return self._apply(data, self._bytes, MASK.encode()) if self._bytes and data else data

    def found_in(self, data: bytes) -> bool:
        return bool(self._bytes) and any(n.spans(data) for n in self._bytes)

    def redact_value(self, value: Any) -> Any:
        """A copy of a JSON-like value (dicts, lists, strings) with every string redacted."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, list):
            return [self.redact_value(v) for v in value]
        if isinstance(value, dict):
            return {self.redact(k) if isinstance(k, str) else k: self.redact_value(v) for k, v in value.items()}
        return value


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
