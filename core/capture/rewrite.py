"""Pure rewriting of the harness's request before it goes upstream, and learning what an
endpoint rejects.

Engine-specific fields (`return_token_ids`, `logprobs`, ...) make hosted APIs answer HTTP 400. The
proxy never breaks an upstream that way: when a 400 names a field we added (or `max_tokens`, which
some models want as `max_completion_tokens`), the field is dropped or renamed, the request retried,
and the lesson remembered for the endpoint.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from typing import Any

# Fields we may add, most specific first (the order we give up on them).
ADDED_FIELDS = ("return_token_ids", "top_logprobs", "logprobs", "chat_template_kwargs")


@dataclass(frozen=True)
class CapturePolicy:
    """Per-rollout policy the proxy applies to every request of a session."""

    capture: bool = True  # transparent_proxy: ask for token ids and logprobs; black_box: nothing extra
    top_logprobs: int = 0
    max_tokens_cap: int | None = None
    disable_thinking: bool = False
    max_turns: int | None = None
    temperature: float | None = None


@dataclass
class EndpointQuirks:
    """What one upstream base URL is known to reject. Shared by all sessions on that URL."""

    dropped: set[str] = field(default_factory=set)
    use_max_completion_tokens: bool = False


def rewrite_request(
    body: dict[str, Any], policy: CapturePolicy, quirks: EndpointQuirks, model: str
) -> tuple[dict[str, Any], set[str]]:
    """Return the upstream body and the set of fields we added (candidates for dropping)."""
    out = copy.copy(body)
    added: set[str] = set()
    out["model"] = model
    if policy.capture:
        if not out.get("logprobs"):
            out["logprobs"] = True
            added.add("logprobs")
        if policy.top_logprobs and "top_logprobs" not in body:
            out["top_logprobs"] = policy.top_logprobs
            added.add("top_logprobs")
        if "return_token_ids" not in body:
            out["return_token_ids"] = True
            added.add("return_token_ids")
    if policy.temperature is not None:
        out["temperature"] = policy.temperature
    if policy.disable_thinking:
        kwargs = dict(out.get("chat_template_kwargs") or {})
        kwargs["enable_thinking"] = False
        out["chat_template_kwargs"] = kwargs
        added.add("chat_template_kwargs")
    if policy.max_tokens_cap is not None:
        present = [k for k in ("max_tokens", "max_completion_tokens") if out.get(k) is not None]
        for k in present:
            out[k] = min(int(out[k]), policy.max_tokens_cap)
        if not present:
            out["max_tokens"] = policy.max_tokens_cap
    if quirks.use_max_completion_tokens and "max_tokens" in out:
        value = out.pop("max_tokens")
        out.setdefault("max_completion_tokens", value)
    for name in quirks.dropped & added:
        out.pop(name, None)
        added.discard(name)
    return out, added


def _error_text(body: bytes) -> tuple[str, str | None]:
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return body[:2000].decode("utf-8", errors="replace"), None
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        param = err.get("param") if isinstance(err.get("param"), str) else None
        return str(err.get("message", "")) + " " + json.dumps(obj)[:2000], param
    return json.dumps(obj)[:2000], None


def learn_from_rejection(status: int, body: bytes, added: set[str], quirks: EndpointQuirks) -> str | None:
    """If a 400/422 names a field we can do without, update `quirks` and return what changed."""
    if status not in (400, 422):
        return None
    text, param = _error_text(body)
    if "max_completion_tokens" in text and re.search(r"\bmax_tokens\b", text) and not quirks.use_max_completion_tokens:
        quirks.use_max_completion_tokens = True
        return "max_tokens->max_completion_tokens"
    for name in ADDED_FIELDS:
        if name in added and (param == name or re.search(rf"\b{name}\b", text)):
            quirks.dropped.add(name)
            if name == "logprobs":  # top_logprobs is meaningless without logprobs
                quirks.dropped.add("top_logprobs")
            return name
    return None
