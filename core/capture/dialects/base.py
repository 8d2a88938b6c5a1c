"""The wire-dialect seam: what a dialect is, and the neutral view of a request it reads.

A harness speaks its vendor's wire API (a dialect); the engine speaks chat completions, and the
engine's token ids are the truth whatever the dialect. A dialect object is the one place that knows
its wire format; the proxy core (core/capture/proxy.py) does the rest the same way for every
dialect: session keys, the turn limit, the session's policy on the engine request (capture fields,
caps: core/capture/rewrite.py), the upstream call and its retries, secret masking, recording.

A call through the proxy, and the dialect's part in it:
1. `routes` -> the proxy finds the dialect by method and path; `presented_key(scope)` -> the session.
2. `read_request(body, scope, sampled)` (once the body has its `request_shape`) -> a `ChatRequest`: chat messages and tools (what the turn
   records), the stream flag, the purpose ("policy" counts against the turn limit, "auxiliary" does
   not); `sampled` is the session's exact tool-call arguments.
3. `engine_body(request)` -> the chat-completions body for the engine (the policy is applied after).
4. The engine's answer, whole: `answer(...)` fills the turn draft from the engine's JSON and returns
   the dialect's answer. Streamed: `stream(request, draft)` makes one `StreamTranslation` per call,
   fed the engine's bytes as they arrive and returning the dialect's bytes to send at once (time to
   first token must not grow); its `finish()` completes the draft once the client has everything.
5. Errors the proxy makes (`error`) and those the engine answers (`upstream_error`), in the
   dialect's own error shape, so a harness handles them as it would with its vendor.
6. `native`: the dialect's own API as an upstream may speak it (core/capture/dialects/native.py),
   for pass-through (core/capture/passthrough.py), or None when no upstream is reached in it.

Translation must be deterministic: a harness that replays its history must get messages that
extend the previous call's, so the engine's prompt ids extend too (one branch in the turn graph).
A dialect that hands the engine's tool-call arguments over as objects gets the engine's own texts
back for them from the session (core/capture/dialects/sampled.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from harness_env.core.capture.asgi import Reply, Scope, header
from harness_env.core.capture.dialects.sampled import SampledArguments
from harness_env.models import TurnPurpose

if TYPE_CHECKING:
    from harness_env.core.capture.assemble import TurnDraft
    from harness_env.core.capture.dialects.native import NativeAPI
    from harness_env.core.capture.session import CaptureSession


# The error codes of a rollout's own limits (turn limit, budgets): a client must not retry them.
ROLLOUT_LIMIT_CODES = frozenset({"turn_limit", "auxiliary_call_limit", "recorded_bytes_limit"})


@dataclass(slots=True)
class ChatRequest:
    """A harness's request in the engine's terms, whatever dialect it came in."""

    messages: list[dict[str, Any]]  # chat-completions messages: what the turn records
    tools: list[dict[str, Any]]  # chat-completions tools
    stream: bool
    purpose: TurnPurpose  # "policy" (counted against the turn limit) or "auxiliary" (titles, ...)
    body: dict[str, Any]  # the request as the harness sent it, in its dialect
    # The session's exact tool-call arguments (core/capture/dialects/sampled.py), read and kept by
    # dialects that hand them over as objects; a request read outside a session has its own.
    sampled: SampledArguments = field(default_factory=SampledArguments)


@dataclass(frozen=True)
class RequestShape:
    """What the proxy checks of a dialect's request before its reader runs
    (core/capture/request_guard.py), so a hostile body is one clear 400, not a crash."""

    fields: dict[str, tuple[type, ...]] = field(default_factory=dict)  # top-level fields read, and their types (null allowed)
    required: tuple[str, ...] = ()  # without these a request is no model call
    inline_media: str = ""  # how the dialect sends media inline, for the refusal of a remote one


@dataclass(frozen=True)
class Route:
    """One method and path a dialect serves, below the proxy's mount point.

    `{name}` in the path matches one run of characters without a slash (so
    `/v1beta/models/{model}:generateContent` works); paths without it are matched exactly, by a
    dictionary lookup. A model call goes through the engine; other routes (a model list, a HEAD
    probe) are answered by the dialect itself (`Dialect.local_reply`). A `keyless` route (a
    reachability probe, which a client may send before it has a key) is answered without one: it
    calls no model and tells nothing but that the proxy is up."""

    method: str
    path: str
    model_call: bool = True
    keyless: bool = False
    _regex: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if "{" in self.path:
            parts = re.split(r"\{(\w+)\}", self.path)  # literal, name, literal, name, ..., literal
            regex = "".join(re.escape(p) if i % 2 == 0 else rf"(?P<{p}>[^/]+?)" for i, p in enumerate(parts))
            object.__setattr__(self, "_regex", re.compile(regex + r"\Z"))

    @property
    def templated(self) -> bool:
        return self._regex is not None

    def match(self, path: str) -> dict[str, str] | None:
        """The path's parameters if it matches this route, else None."""
        if self._regex is None:
            return {} if path == self.path else None
        m = self._regex.match(path)
        return m.groupdict() if m else None


class StreamTranslation(Protocol):
    """One streamed answer's translation, made per call by `Dialect.stream`.

    `feed` gets the engine's SSE bytes as they come off the network (split anywhere, secrets already
    masked) and returns the dialect's bytes to send now (b"" to send nothing yet). `close` is called
    once the engine's stream ended (`error` says how it broke, else None) and returns the last bytes.
    `finish` runs after the client has everything (or the send failed): whatever assembly was left
    for later is done there, into the draft given to `Dialect.stream`."""

    content_type: str

    def feed(self, data: bytes) -> bytes: ...

    def close(self, error: str | None) -> bytes: ...

    def finish(self) -> None: ...


class Dialect(Protocol):
    """A wire API served by the capture proxy (see the module docstring for the call's steps)."""

    name: str
    routes: tuple[Route, ...]
    request_shape: RequestShape  # what is checked of a request before `read_request`
    native: NativeAPI | None  # its own API, for an upstream that speaks it (pass-through)

    def presented_key(self, scope: Scope) -> str | None:
        """The capture-session key as this dialect's clients present it."""
        ...

    def read_request(self, body: dict[str, Any], scope: Scope, sampled: SampledArguments | None = None) -> ChatRequest:
        """The request's neutral view; raises core.errors.InvalidRequestError (answered 400).
        `sampled`: the session's exact tool-call arguments, for a dialect that hands the harness
        objects (it restores the engine's texts from them and keeps those of its answers)."""
        ...

    def engine_body(self, request: ChatRequest) -> dict[str, Any]:
        """The chat-completions body for the engine, before the session's policy is applied
        (the proxy copies it before changing anything)."""
        ...

    def answer(self, request: ChatRequest, engine_body: bytes, content_type: str, draft: TurnDraft) -> tuple[bytes, str]:
        """A whole (non-streamed) engine answer, secrets masked: fill `draft` from it (the engine's
        ids are the truth) and return the dialect's answer and its content type."""
        ...

    def stream(self, request: ChatRequest, draft: TurnDraft) -> StreamTranslation:
        """A translation for one streamed engine answer, assembling the turn into `draft`."""
        ...

    def error(self, status: int, message: str, code: str) -> Reply:
        """An error the proxy answers itself (unknown key, turn limit, unreachable upstream, ...)."""
        ...

    def upstream_error(self, status: int, engine_body: bytes, content_type: str) -> Reply:
        """An error the engine answered (status >= 400; body read whole, secrets masked)."""
        ...

    def local_reply(self, route: Route, session: CaptureSession | None, scope: Scope) -> Reply:
        """The answer to one of its routes that is not a model call (`session` None: a keyless route)."""
        ...


def bearer_or_api_key(scope: Scope) -> str | None:
    """`Authorization: Bearer KEY`, else `x-api-key` or `api-key`: what OpenAI-style clients send."""
    auth = header(scope, b"authorization") or ""
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return header(scope, b"x-api-key") or header(scope, b"api-key")
