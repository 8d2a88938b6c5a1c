"""Keep the server's secrets out of its logs: in any position of a line, in any usual encoding.

uvicorn logs every request's path and query string as sent, so a token put in a path
(`GET /nope/<token>`), in a query parameter of any name, percent-encoded, in base64 (a Basic
credential) or as JSON escapes went to the log verbatim; so did whatever an exception or a
library's message held. Masking here is done once for every log record the process makes (a
record factory, not a filter on some loggers: a logger's filter does not see what its children
propagate, and handlers come and go with each logging configuration), before any handler formats
it.

What is masked: every secret of the process registry (core/capture/redact.py: the server token,
credential-looking variables, catalog, judge and store keys) as written and in its encoded
spellings (`log_spellings`), with a prefix or suffix at least half as long; any capture key
(`hecap-...`, core/capture/session.py); words whose percent or backslash escapes, once decoded,
hold a secret; and the value of any query parameter named like a token or key (one the server
does not know, such as a wrong guess or another service's key).
"""

from __future__ import annotations

import base64
import codecs
import json
import logging
import re
from typing import Any
from urllib.parse import quote, quote_plus, unquote_plus

from harness_env.core.capture.redact import MASK, MIN_SECRET_CHARS, Redactor, registered_secrets, registry_version

CAPTURE_KEY_PREFIX = "hecap-"  # core/capture/session.py: new_session_key, then 32 url-safe base64 characters
CAPTURE_KEY = re.compile(re.escape(CAPTURE_KEY_PREFIX) + r"[A-Za-z0-9_-]{32}")
SECRET_PARAM = re.compile(r"([?&;](?:[^=&;\s\"]*(?:token|key|secret|password|auth)[^=&;\s\"]*)=)[^&;\s\"]*", re.IGNORECASE)
WORD = re.compile(r"[^\s\"'<>()\[\]{},]+")
ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}|\\[uUx][0-9A-Fa-f]{2}|\+")
GRAM = MIN_SECRET_CHARS  # no form shorter than this is masked, so each holds a piece this long
MAX_DECODE_ROUNDS = 3  # '%2574' is '%74' is 't': twice-encoded values are common, more is not


def _base64_runs(data: bytes) -> set[str]:
    """The base64 characters that encode `data` wherever it sits in a longer value: at each of the
    three byte offsets, only the characters that depend on `data` alone."""
    runs = set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + data).decode()
        start = -(-offset * 8 // 6)  # the first character past the padding bytes
        end = (offset + len(data)) * 8 // 6  # characters made only of whole bits of data
        for text in (encoded, encoded.translate(str.maketrans("+/", "-_"))):
            runs.add(text[start:end])
    return runs


def _capture_key_spellings() -> re.Pattern[str]:
    """Capture keys are many and short-lived, so they are masked by their shape: as is, and in hex
    or base64 (its prefix's spellings, then what the rest of a key takes in them)."""
    prefix = CAPTURE_KEY_PREFIX.encode()
    forms = [
        re.escape(CAPTURE_KEY_PREFIX) + r"[A-Za-z0-9_-]{32}",
        "(?i:" + prefix.hex() + ")[0-9A-Fa-f]{64}",
        *(re.escape(run) + r"[A-Za-z0-9+/_-]{40,}" for run in sorted(_base64_runs(prefix))),
    ]
    return re.compile("|".join(forms))


def log_spellings(secret: str) -> set[str]:
    """How `secret` can appear in a log line: as is, percent-encoded (every byte, or only what a
    URL needs, either case), as \\u or \\x escapes, hexadecimal, and base64 at any offset."""
    raw = secret.encode("utf-8", "surrogateescape")
    hex_lower = raw.hex()
    forms = {secret, quote(secret, safe=""), quote_plus(secret), hex_lower, hex_lower.upper(), *_base64_runs(raw)}
    for case in (str.lower, str.upper):
        forms.add("".join(f"%{case(f'{b:02x}')}" for b in raw))
        forms.add("".join(f"\\x{case(f'{b:02x}')}" for b in raw))
        forms.add("".join(f"\\u{case(f'{ord(c):04x}')}" for c in secret if ord(c) < 0x10000))
    return {f for f in forms if len(f) >= MIN_SECRET_CHARS}


def _unescaped(word: str) -> str:
    """`word` with one round of percent, '+' and backslash escapes decoded."""
    text = unquote_plus(word, errors="surrogateescape")
    if "\\" in text:
        try:
            text = codecs.decode(text.encode("latin-1", "backslashreplace"), "unicode_escape")
        except (UnicodeDecodeError, ValueError):
            pass
    return text


class LogMasker:
    """Masks a fixed set of secrets in log text (see the module's docstring)."""

    def __init__(self, secrets: frozenset[str] | set[str]) -> None:
        forms = {form for s in secrets for form in log_spellings(s)}
        self._plain = Redactor(secrets)
        self._encoded = Redactor(forms)
        # Every GRAM-character piece of every form, as Redactor spells it too: a line with none of
        # them holds no form nor any half of one, and most lines are let through on this alone.
        spelled = {f for form in forms for f in (form, json.dumps(form)[1:-1], json.dumps(form)[1:-1].replace("/", "\\/"))}
        self._grams = frozenset(f[i : i + GRAM] for f in spelled for i in range(len(f) - GRAM + 1))

    def _might_hold_a_form(self, text: str) -> bool:
        grams = self._grams
        return bool(grams) and any(text[i : i + GRAM] in grams for i in range(len(text) - GRAM + 1))

    def _decoded_word(self, match: re.Match[str]) -> str:
        word = match.group()
        if not ESCAPE.search(word):
            return word
        for _ in range(MAX_DECODE_ROUNDS):
            decoded = _unescaped(word)
            if decoded == word:
                break
            masked = CAPTURE_KEY.sub(MASK, self._plain.redact(decoded))
            if masked != decoded:
                return masked  # shown decoded: the escapes hid a secret
            word = decoded
        return match.group()

    def mask(self, text: str) -> str:
        if "%" in text or "\\" in text or "+" in text:  # first: a word half escaped is masked whole
            text = WORD.sub(self._decoded_word, text)
        if self._might_hold_a_form(text):
            text = self._encoded.redact(text)
        text = CAPTURE_KEYS.sub(MASK, text)
        return SECRET_PARAM.sub(r"\1" + MASK, text)


CAPTURE_KEYS = _capture_key_spellings()
_cached: tuple[int, LogMasker] | None = None


def current_masker() -> LogMasker:
    """A masker of the registry's secrets as they are now (rebuilt when the registry changes)."""
    global _cached
    version = registry_version()
    if _cached is None or _cached[0] != version:
        _cached = (version, LogMasker(registered_secrets()))
    return _cached[1]


def _masked_arg(value: Any, masker: LogMasker) -> Any:
    if isinstance(value, str):
        return masker.mask(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value  # kept as is: formats such as %d need the number
    text = str(value)
    masked = masker.mask(text)
    return masked if masked != text else value


ARGS_KEPT = frozenset({"uvicorn.access"})  # loggers whose formatter unpacks the arguments


def mask_record(record: logging.LogRecord) -> None:
    """Mask `record` in place: its message as formatted (a secret split over two arguments is still
    one), its exception and its stack. A record of ARGS_KEPT keeps its arguments, each masked
    (their number and types kept where they hold no secret: uvicorn's access formatter unpacks them)."""
    masker = current_masker()
    if record.name not in ARGS_KEPT:
        try:
            record.msg, record.args = masker.mask(record.getMessage()), ()
        except (TypeError, ValueError, KeyError):  # arguments that do not fit the message: masked one by one
            pass
    record.msg = _masked_arg(record.msg, masker)
    if isinstance(record.args, tuple):
        record.args = tuple(_masked_arg(a, masker) for a in record.args)
    elif isinstance(record.args, dict):
        record.args = {k: _masked_arg(v, masker) for k, v in record.args.items()}
    if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
        record.exc_text = masker.mask(logging.Formatter().formatException(record.exc_info))
    if record.stack_info:
        record.stack_info = masker.mask(record.stack_info)


class _MaskingFactory:
    """The process's log record factory, wrapped: every record is masked as it is made."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.inner(*args, **kwargs)
        try:
            mask_record(record)
        except Exception:  # a line that cannot be masked is not written as it was
            record.msg, record.args, record.exc_info, record.exc_text = "[a log line was left out: masking its secrets failed]", None, None, None
        return record


def mask_secrets_in_logs() -> None:
    """Mask every log record of this process from now on (once per process)."""
    factory = logging.getLogRecordFactory()
    if not isinstance(factory, _MaskingFactory):
        logging.setLogRecordFactory(_MaskingFactory(factory))
