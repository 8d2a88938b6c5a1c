"""JSON on the proxy's hot path: orjson, falling back to the stdlib for what orjson refuses
(numbers it does not take, lone surrogates).

Whatever is parsed here can end up in a RolloutResult, which must always serialise: so nothing
parsed here holds a lone UTF-16 surrogate (a `\\udfff` escape is valid JSON text but no valid
Unicode, and every encoder of the result refuses it) and nesting is bounded: orjson stops at
MAX_DEPTH; the stdlib's fallback parser counts its recursion against the interpreter's limit
(about 1000) and its RecursionError is a JSONDepthError here. Every step is C code, so a hostile
64 MB body costs a parse, not a Python loop over its bytes. `loads` replaces
lone surrogates with U+FFFD (an engine's answer: the data is kept, made valid); `loads_strict`
refuses them (a harness's request: answered 400).
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

MAX_DEPTH = 1024  # orjson's own limit; the stdlib fallback is held to the same
REPLACEMENT = "\ufffd"
LONE_SURROGATE = re.compile("[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]")


class JSONDepthError(ValueError):
    pass


class LoneSurrogateError(ValueError):
    pass


def loads(data: bytes | str) -> Any:
    """`data` parsed; lone surrogates in strings and keys become U+FFFD. Raises ValueError."""
    return _loads(data, strict=False)


def loads_strict(data: bytes | str) -> Any:
    """`data` parsed; raises LoneSurrogateError for a lone surrogate, JSONDepthError for nesting
    beyond MAX_DEPTH, ValueError for anything else that is not JSON."""
    return _loads(data, strict=True)


def _loads(data: bytes | str, *, strict: bool) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        reason = str(e)
        if "depth limit" in reason:
            raise JSONDepthError(f"nested deeper than {MAX_DEPTH} levels") from None
        if strict and "surrogate in string" in reason:  # at once: no second parse of a body that is refused anyway
            raise LoneSurrogateError(f"a string holds a lone UTF-16 surrogate ({reason})") from None
    try:
        value = json.loads(data)  # raises the stdlib's JSONDecodeError (a ValueError) if truly invalid
    except RecursionError:  # its C parser counts its depth against the interpreter's limit
        raise JSONDepthError(f"nested deeper than {MAX_DEPTH} levels") from None
    return _without_surrogates(value, strict)


def valid_unicode(value: Any) -> Any:
    """`value` (JSON data) with every lone surrogate in its strings and keys made U+FFFD."""
    return _without_surrogates(value, strict=False)


def _without_surrogates(value: Any, strict: bool) -> Any:
    try:
        text = json.dumps(value, ensure_ascii=False)
        text.encode("utf-8")
        return value
    except UnicodeEncodeError as e:
        if strict:
            bad = e.object[e.start : e.end]
            raise LoneSurrogateError(f"a string holds a lone UTF-16 surrogate ({bad!a}), which is not valid Unicode") from None
    except ValueError:  # NaN/Infinity written back by dumps are fine; anything else is left as parsed
        return value
    # Lone ones become U+FFFD; then a round trip through UTF-16 joins a pair written as two code
    # points into its character. dumps/loads of the same text keep every other value as it was.
    fixed = LONE_SURROGATE.sub(REPLACEMENT, text).encode("utf-16", "surrogatepass").decode("utf-16")
    return json.loads(fixed)


def dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError:
        return json.dumps(obj).encode()
