"""What a body passed through untranslated (core/capture/passthrough.py) may ask of the upstream.

Pass-through sends the harness's own body to a hosted API with the operator's key, so it is
bounded as the engine's body is, in the field names its dialect declares (NativeAPI:
core/capture/dialects/native.py):
- the answer's length (`max_tokens`: Messages' `max_tokens`, Responses' `max_output_tokens`,
  Gemini's `generationConfig.maxOutputTokens`) is at most the rollout's `max_tokens_cap`, else
  rewrite.MAX_TOKENS_CEILING; set to the cap when absent; anything but a positive integer is a 400;
- one answer: the count of answers, where the API has one (`count`: Gemini's
  `generationConfig.candidateCount`), is 1; a token-counting route is left as it is;
- nothing to fetch: a remote URL or stored file named anywhere in the body (content parts, MCP
  servers) is a 400 (content_parts.remote_reference).
Other fields go as the harness sent them: the upstream validates its own API.
"""

from __future__ import annotations

import copy
from typing import Any

from harness_env.core.capture.content_parts import INLINE, remote_reference
from harness_env.core.capture.dialects.native import NativeAPI
from harness_env.core.capture.rewrite import MAX_TOKENS_CEILING
from harness_env.core.errors import InvalidRequestError


def _holder(body: dict[str, Any], at: tuple[str, ...]) -> dict[str, Any]:
    """The object at `at` in `body` (made when absent); a non-object there is a 400."""
    holder = body
    for key in at:
        if holder.get(key) is None:
            holder[key] = {}
        if not isinstance(holder[key], dict):
            raise InvalidRequestError(f"field {key!r} must be an object")
        holder = holder[key]
    return holder


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def bounded_body(native: NativeAPI, path: str, body: dict[str, Any], max_tokens_cap: int | None) -> dict[str, Any]:
    """A copy of `body` bounded as the module docstring says, or InvalidRequestError."""
    where = remote_reference(body)
    if where is not None:
        raise InvalidRequestError(f"{where} names a remote URL or stored file, which the upstream would fetch; it is never made to fetch anything: {INLINE}")
    out = copy.deepcopy(body)
    if native.counts_tokens(path):  # it generates nothing, and its API refuses generation fields
        return out
    at, name = native.max_tokens
    holder = _holder(out, at)
    value = holder.get(name)
    if value is not None and not _positive_int(value):
        raise InvalidRequestError(f"field {'.'.join((*at, name))!r} must be a positive integer")
    bound = max_tokens_cap if max_tokens_cap is not None else MAX_TOKENS_CEILING
    if value is not None or max_tokens_cap is not None:
        holder[name] = min(value, bound) if value is not None else bound
    if native.count is not None:
        at, name = native.count
        _holder(out, at)[name] = 1
    return out
