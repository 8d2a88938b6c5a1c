"""Pure rewriting of the harness's request before it goes upstream, and reading what an endpoint
rejects.

The engine gets an allow-list of chat-completions fields, each bounded (`ENGINE_FIELDS`): the
harness is driven by the policy, so whatever a request carries beyond what a harness needs (`n`,
`best_of`, `logit_bias`, `min_tokens`, `ignore_eos`, `prompt_logprobs`, a template of its own,
...) would spend the engine's time on the policy's behalf or change what is sampled from what
the trainer is told. What is left out is reported (`Rewrite.dropped`). The rollout's own settings
(capture fields, temperature, the max-tokens cap, thinking) are set after, so they always win.

Engine-specific fields we add (`return_token_ids`, `logprobs`, ...) make hosted APIs answer HTTP
400. What an endpoint rejects is learned only from the proxy's own requests (its probe: see
CaptureProxy in core/capture/proxy.py), never from an answer to a request the agent shaped: a
validation error quotes the input, so an agent could make any field's name appear in it.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from harness_env.core.capture import fastjson

# Fields we may add, most specific first (the order we give up on them).
ADDED_FIELDS = ("return_token_ids", "top_logprobs", "logprobs", "chat_template_kwargs")
MAX_TOKENS_CEILING = 1_000_000  # max_tokens when the rollout sets no cap (the cap option's own bound)
MAX_STOP_SEQUENCES = 16
MAX_STOP_CHARS = 1024
MAX_SCHEMA_BYTES = 64 * 1024  # a response_format or tool_choice, as JSON
TOOL_CHOICES = frozenset({"auto", "none", "required"})
DROP: Any = object()  # what a field's check returns for a value that is not sent


@dataclass(frozen=True)
class CapturePolicy:
    """Per-rollout policy the proxy applies to every request of a session."""

    capture: bool = True  # transparent_proxy: ask for token ids and logprobs; black_box: nothing extra
    top_logprobs: int = 0
    max_tokens_cap: int | None = None
    disable_thinking: bool = False
    max_turns: int | None = None
    temperature: float | None = None
    max_auxiliary_calls: int | None = None  # model calls without tools (titles, summaries, ...)
    max_recorded_bytes: int | None = None  # what the session may hold of requests and answers
    plain_sampling: bool = False  # drop SAMPLING_SHAPERS: logprobs are log_softmax(logits / T)
    structured_regex: str | None = None  # vLLM structured outputs on policy calls
    structured_calls: int | None = None  # on the first this many (None: all)
    mask_constrained: bool = False  # those turns' tokens left out of the loss (Turn.masked)
    max_weight_lag: int | None = None  # weight versions a turn may lag the policy's at the end before it is stale
    continuity: str = "messages"  # "tokens": a call continuing a thread goes as token ids where the engine can (core/capture/continuity.py)

    @property
    def added_fields_key(self) -> tuple[bool, int, bool]:
        """What decides which fields this policy adds to a request (and so what an endpoint may
        reject): sessions with equal keys share what the proxy's probe found."""
        return self.capture, self.top_logprobs, self.disable_thinking


@dataclass
class EndpointQuirks:
    """What one upstream (base URL and model) is known to reject, from the proxy's own probe.
    Shared by all sessions on that endpoint."""

    dropped: set[str] = field(default_factory=set)
    use_max_completion_tokens: bool = False

    def snapshot(self) -> tuple[frozenset[str], bool]:
        return frozenset(self.dropped), self.use_max_completion_tokens


class Rewrite(NamedTuple):
    body: dict[str, Any]  # what goes upstream
    added: set[str]  # fields we added (ADDED_FIELDS; candidates for an endpoint to reject)
    dropped: set[str]  # fields of the harness's request not sent (not allowed, out of bounds, or rejected)


# -- the allow-list ------------------------------------------------------------------------------
def _number(lo: float, hi: float, *, above_lo: bool = False) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        return v if ok and (v > lo if above_lo else v >= lo) and v <= hi else DROP

    return check


def _integer(lo: int, hi: int) -> Callable[[Any], Any]:
    return lambda v: v if isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi else DROP


def _kind(*types: type) -> Callable[[Any], Any]:
    return lambda v: v if isinstance(v, types) and not (bool not in types and isinstance(v, bool)) else DROP


def _small_json(v: Any) -> bool:
    try:
        return len(fastjson.dumps(v)) <= MAX_SCHEMA_BYTES
    except (TypeError, ValueError, OverflowError):
        return False


def _stop(v: Any) -> Any:
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or len(items) > MAX_STOP_SEQUENCES:
        return DROP
    return v if all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in items) else DROP


def _tool_choice(v: Any) -> Any:
    return v if v in TOOL_CHOICES or isinstance(v, dict) and _small_json(v) else DROP


def _response_format(v: Any) -> Any:
    return v if isinstance(v, dict) and _small_json(v) else DROP


def _template_kwargs(v: Any) -> Any:
    # Only the thinking switch: other template variables (add_generation_prompt, ...) change what
    # the prompt's tokens are, and a template of the harness's own is not allowed at all.
    if isinstance(v, dict) and isinstance(v.get("enable_thinking"), bool):
        return {"enable_thinking": v["enable_thinking"]}
    return DROP


def _reasoning_effort(v: Any) -> Any:
    return v if isinstance(v, str) and re.fullmatch(r"[a-z]{1,16}", v) else DROP


# What a harness may ask of the engine, each field with its check (the value to send, or DROP).
# Every dialect's engine body is chat completions, so this one list covers every harness.
ENGINE_FIELDS: dict[str, Callable[[Any], Any]] = {
    "messages": _kind(list),
    "tools": _kind(list),
    "tool_choice": _tool_choice,
    "parallel_tool_calls": _kind(bool),
    "stream": _kind(bool),
    "stream_options": lambda v: {"include_usage": v["include_usage"]} if isinstance(v, dict) and isinstance(v.get("include_usage"), bool) else DROP,
    "max_tokens": _integer(1, 2**31 - 1),
    "max_completion_tokens": _integer(1, 2**31 - 1),
    "temperature": _number(0, 10),
    "top_p": _number(0, 1, above_lo=True),
    "presence_penalty": _number(-2, 2),
    "frequency_penalty": _number(-2, 2),
    "seed": _integer(-(2**63), 2**63 - 1),
    "stop": _stop,
    "response_format": _response_format,
    "reasoning_effort": _reasoning_effort,
    "chat_template_kwargs": _template_kwargs,
    "n": lambda v: v if v == 1 and not isinstance(v, bool) else DROP,  # one completion: what is recorded
}


# What reshapes the distribution tokens are drawn from beyond temperature (vLLM's processed
# logprobs are taken after them): dropped under the rollout's plain_sampling.
SAMPLING_SHAPERS = ("top_p", "presence_penalty", "frequency_penalty")


def allowed_fields(body: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """The fields of `body` the engine may get (checked and bounded), and the names of the rest
    (`model` is the endpoint's: neither kept nor reported)."""
    out: dict[str, Any] = {}
    dropped: set[str] = set()
    for name, value in body.items():
        check = ENGINE_FIELDS.get(name)
        kept = check(value) if check is not None else DROP
        if kept is not DROP:
            out[name] = kept
        elif name != "model" and value is not None:
            dropped.add(str(name)[:64])
    if "stream_options" in out and not out.get("stream"):  # engines refuse it on a whole answer
        del out["stream_options"]
    return out, dropped


# -- the rollout's policy -------------------------------------------------------------------------
def rewrite_request(body: dict[str, Any], policy: CapturePolicy, quirks: EndpointQuirks, model: str, *, constrained: bool = False) -> Rewrite:
    """The upstream body: the allowed fields of `body`, then the policy's own (`constrained`: this
    call's answer must match the policy's structured_regex)."""
    out, dropped = allowed_fields(body)
    if policy.plain_sampling:
        for name in SAMPLING_SHAPERS:
            if out.pop(name, None) is not None:
                dropped.add(name)
    added: set[str] = set()
    out["model"] = model
    if policy.capture:  # the rollout's, whatever the harness asked
        out["logprobs"] = True
        added.add("logprobs")
        if policy.top_logprobs:
            out["top_logprobs"] = policy.top_logprobs
            added.add("top_logprobs")
        out["return_token_ids"] = True
        added.add("return_token_ids")
    if policy.temperature is not None:
        out["temperature"] = policy.temperature
    if policy.disable_thinking:
        out["chat_template_kwargs"] = {"enable_thinking": False}
        added.add("chat_template_kwargs")
    if constrained and policy.structured_regex is not None:
        out["structured_outputs"] = {"regex": policy.structured_regex}
    _cap_max_tokens(out, policy.max_tokens_cap)
    if quirks.use_max_completion_tokens and "max_tokens" in out:
        value = out.pop("max_tokens")
        out.setdefault("max_completion_tokens", value)
        dropped.add("max_tokens")
    for name in quirks.dropped & added:
        out.pop(name, None)
        added.discard(name)
        dropped.add(name)
    return Rewrite(out, added, dropped)


def _cap_max_tokens(out: dict[str, Any], cap: int | None) -> None:
    present = [k for k in ("max_tokens", "max_completion_tokens") if k in out]
    for k in present:
        out[k] = min(out[k], cap if cap is not None else MAX_TOKENS_CEILING)
    if not present and cap is not None:
        out["max_tokens"] = cap


# -- what an endpoint rejects (read from the proxy's own probe only) ---------------------------
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
    """If a 400/422 names a field we can do without, update `quirks` and return what changed.
    Only for answers to the proxy's own probe requests (see the module docstring)."""
    if status not in (400, 422):
        return None
    text, param = _error_text(body)
    if "max_completion_tokens" in text and re.search(r"\bmax_tokens\b", text) and not quirks.use_max_completion_tokens:
        quirks.use_max_completion_tokens = True
        return "max_tokens->max_completion_tokens"
    for name in ADDED_FIELDS:
        if name in added and name not in quirks.dropped and (param == name or re.search(rf"\b{name}\b", text)):
            quirks.dropped.add(name)
            if name == "logprobs":  # top_logprobs is meaningless without logprobs
                quirks.dropped.add("top_logprobs")
            return name
    return None


def may_name_an_added_field(status: int, body: bytes, added: set[str], quirks: EndpointQuirks) -> bool:
    """Whether a rejection of an agent-shaped request could be about a field we added: then the
    proxy asks its own probe (the rejection itself is never learned from)."""
    return learn_from_rejection(status, body, added, copy.deepcopy(quirks)) is not None
