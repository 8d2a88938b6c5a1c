"""JSON on the proxy's hot path: orjson, falling back to the stdlib for what orjson refuses
(numbers it does not take, lone surrogates).

Whatever is parsed here can end up in a RolloutResult, which must always serialise: so nothing
parsed here holds a lone UTF-16 surrogate (a `\\udfff` escape is valid JSON text but no valid
Unicode, and every encoder of the result refuses it) and nothing is nested deeper than
MAX_DEPTH (the stdlib's parser recurses, so depth is checked before it runs). `loads` replaces
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
        if "depth limit" in str(e):
            raise JSONDepthError(f"nested deeper than {MAX_DEPTH} levels") from None
    check_depth(data)
    try:
        value = json.loads(data)  # raises the stdlib's JSONDecodeError (a ValueError) if truly invalid
    except RecursionError:  # pragma: no cover - check_depth bounds it first
        raise JSONDepthError(f"nested deeper than {MAX_DEPTH} levels") from None
    return _without_surrogates(value, strict)


def check_depth(data: bytes | str, limit: int = MAX_DEPTH) -> None:
    """Raise JSONDepthError if `data` opens more than `limit` arrays/objects at once (brackets in
    strings do not count). Linear and without recursion, so hostile nesting costs only a scan."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    depth, in_string, escaped = 0, False, False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                raise JSONDepthError(f"nested deeper than {limit} levels")
        elif byte in (0x5D, 0x7D):
            depth -= 1


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
