"""Pass-through: an upstream that speaks the harness's own wire API (an endpoint whose `wire_api`
is not "chat", e.g. a hosted Anthropic endpoint used for evaluation) gets the harness's request as
the harness sent it, with no translation, in `black_box` mode only, bounded first as the engine's
body is (core/capture/native_guard.py: the max-tokens cap, one answer, nothing to fetch).

Only the key changes hands (and the model's name, if the harness knows it by another): the harness
presents its capture key, and the upstream is sent the real one in its dialect's own header. The
answer goes back as it arrives, unchanged but for masked secrets (the proxy's StreamRedactor, line
by line). The turn is still recorded, read from the native
answer: text, tool calls, stop reason, usage, latency, status (token ids exist only where the
engine's chat completions give them, so there are none), and the turn limit still applies.

What differs per API (the key's header, the fields that bound an answer, reading the answer) is
the dialect's own declaration (core/capture/dialects/native.py); the call itself is the proxy's, as
for the engine (core/capture/call.py).

Why black_box only: token ids and logprobs come from the engine's chat completions; a native
upstream gives neither, so a `transparent_proxy` rollout would train on nothing (refused up front by
`check_wire_api`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode

import aiohttp

from harness_env.core.capture import fastjson, native_guard, request_guard
from harness_env.core.capture.asgi import Reply, Scope, route_path
from harness_env.core.capture.assemble import TurnDraft
from harness_env.core.capture.call import admit
from harness_env.core.capture.dialects import check_native_wire_api
from harness_env.core.capture.dialects.base import Dialect
from harness_env.core.capture.dialects.native import NativeAPI
from harness_env.core.capture.session import CaptureSession
from harness_env.core.capture.sse import SSEDecoder
from harness_env.core.errors import InvalidRequestError
from harness_env.models import RolloutRequest

# Not relayed to the upstream: the capture key (whatever header carries it), connection-level
# headers, and encodings we would have to undo (bytes are relayed as they come).
DROPPED_HEADERS = frozenset(
    {
        "authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "cookie",
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "upgrade",
        "proxy-authorization",
        "accept-encoding",
        "expect",
    }
)
VERSION_SEGMENTS = ("v1", "v1beta", "v1alpha")


def check_wire_api(request: RolloutRequest, harness_dialect: str | None) -> None:
    """Refuse, before anything starts, an endpoint whose wire API this rollout cannot use.
    `harness_dialect`: the dialect the harness speaks (None: the harness checks for itself)."""
    wire_api = request.endpoint.wire_api
    if wire_api == "chat":
        return
    native = check_native_wire_api(wire_api)  # the wire types bound the name; the registry knows it
    if request.mode != "black_box":
        raise InvalidRequestError(
            f"endpoint wire_api {wire_api!r} works only in black_box mode: token ids and logprobs come from the engine's chat "
            "completions, which a native upstream does not give; use mode='black_box', or point at a chat-completions endpoint "
            "(wire_api='chat') to train"
        )
    if harness_dialect is not None and harness_dialect != native:
        raise InvalidRequestError(
            f"harness {request.harness!r} speaks {harness_dialect}, but the endpoint's wire_api is {wire_api!r}, passed through "
            f"untranslated; use a harness that speaks {native}, or a chat-completions endpoint (wire_api='chat')"
        )


def upstream_url(base_url: str, path: str, query: bytes) -> str:
    """The upstream's own route for the harness's path: `base_url` is the API's root with or without
    its version segment (`https://api.example/v1` + `/v1/messages`, or a `/v1beta/...` path, which
    replaces a `/v1` the base URL ends in). The `key` query parameter (Google's clients may carry
    the capture key there) is left out: the key goes in a header."""
    root = base_url.rstrip("/")
    parent, last = root.rsplit("/", 1)
    if last in VERSION_SEGMENTS and path.lstrip("/").split("/", 1)[0] in VERSION_SEGMENTS:
        root = parent
    kept = [(k, v) for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True) if k != "key"]
    return root + path + (f"?{urlencode(kept)}" if kept else "")


def with_model(dialect: Dialect, path: str, raw: bytes, body: dict[str, Any], model: str) -> tuple[str, bytes]:
    """The path and body with the endpoint's model where the harness named one: a harness may know
    the model by another name (Harbor prefixes it; Gemini CLI writes `/` as `--` in the path), and the
    upstream serves the rollout's model, as the engine does for translated calls. The body is
    re-serialised only when its `model` differs."""
    for route in dialect.routes:
        params = route.match(path)
        if params and "model" in params and params["model"] != model:
            path = path.replace(f"/models/{params['model']}:", f"/models/{model}:", 1)
            break
    if isinstance(body.get("model"), str) and body["model"] != model:
        raw = fastjson.dumps({**body, "model": model})
    return path, raw


def upstream_headers(native: NativeAPI, scope: Scope, key: str) -> dict[str, str]:
    """The harness's headers (its API version and beta flags, ...) minus its capture key, plus the
    upstream key where its API expects it."""
    headers = {}
    for name, value in scope.get("headers", ()):
        lower = name.decode("latin-1").lower()
        if lower not in DROPPED_HEADERS:
            headers[lower] = value.decode("latin-1")
    headers["accept-encoding"] = "identity"
    if key:
        headers[native.auth_header] = native.auth_template.format(key=key)
    return headers


# -- reading a native answer into the turn --------------------------------------------------------
class NativeReader:
    """Reads one native answer (whole or streamed) into a turn draft, by the dialect's reader."""

    def __init__(self, native: NativeAPI, draft: TurnDraft) -> None:
        self.draft = draft
        self._reader = native.reader(draft)

    def event(self, data: str) -> None:
        try:
            obj = fastjson.loads(data)
        except ValueError:
            if data.strip() != "[DONE]":
                self.draft.errors.append(f"malformed stream event: {data[:200]!r}")
            return
        if not isinstance(obj, dict):
            return
        self.draft.chunks += 1
        self._reader.event(obj, data)

    def whole(self, content: bytes) -> None:
        try:
            obj = fastjson.loads(content)
        except ValueError:
            self.draft.errors.append(f"upstream body is not JSON: {content[:200]!r}")
            return
        for item in obj if isinstance(obj, list) else [obj]:  # Gemini's non-SSE stream is a JSON array
            if isinstance(item, dict):
                self._reader.whole(item)


class NativeStream:
    """A StreamTranslation that translates nothing: the upstream's bytes go on as they came, and
    are read on the side into the turn."""

    def __init__(self, native: NativeAPI, draft: TurnDraft, content_type: str) -> None:
        self.content_type = content_type
        self._reader = NativeReader(native, draft)
        self._decoder = SSEDecoder()

    def feed(self, data: bytes) -> bytes:
        for event in self._decoder.feed(data):
            self._reader.event(event)
        return data

    def close(self, error: str | None) -> bytes:
        return b""  # a broken stream reaches the harness as the upstream broke it

    def finish(self) -> None:
        for event in self._decoder.flush():
            self._reader.event(event)


# -- the call ---------------------------------------------------------------------------------
def _recorded_view(dialect: Dialect, scope: Scope, body: dict[str, Any]) -> tuple[list[Any], list[Any], bool, Any]:
    """(messages, tools, stream, purpose) of the request, for the record only: what the dialect
    cannot read is still passed on."""
    try:
        request = request_guard.read_request(dialect, body, scope)
        return request.messages, request.tools, request.stream, request.purpose
    except InvalidRequestError:
        return [], [], bool(body.get("stream")) or "stream" in route_path(scope).lower(), "policy"


async def pass_through(
    dialect: Dialect, session: CaptureSession, http: Callable[[], aiohttp.ClientSession], scope: Scope, raw: bytes, body: dict[str, Any]
) -> Reply:
    """Serve one model call of `dialect` by the session's native upstream (see the module docstring);
    `http`: the proxy's client."""
    wire_api = session.endpoint.wire_api
    native = dialect.native
    if native is None or native.wire_api != wire_api:  # check_wire_api refuses this up front; a stray call gets it here
        return dialect.error(
            400, f"this rollout's endpoint speaks {wire_api!r}, passed through untranslated; it cannot answer {dialect.name}", "invalid_request"
        )
    try:  # bounded as the engine's body is (core/capture/native_guard.py): off the loop, a body may be large
        sent = await asyncio.to_thread(native_guard.bounded_body, native, route_path(scope), body, session.policy.max_tokens_cap)
    except InvalidRequestError as e:
        return dialect.error(400, session.redact(str(e)), "invalid_request")
    messages, tools, stream, purpose = _recorded_view(dialect, scope, body)
    call = admit(dialect, session, http, raw, purpose, stream, messages, tools)
    if isinstance(call, Reply):
        return call
    endpoint = session.endpoint
    if sent != body:
        raw = fastjson.dumps(sent)
    path, raw = with_model(dialect, route_path(scope), raw, sent, endpoint.model)
    url = upstream_url(endpoint.base_url, path, scope.get("query_string", b""))
    headers = upstream_headers(native, scope, endpoint.api_key.get_secret_value())
    # No redirects: the key header would follow them to wherever they point.
    resp = await call.post(url, raw, headers, allow_redirects=False)
    if isinstance(resp, Reply):
        return resp
    content_type = call.content_type(resp)
    if resp.status >= 400:  # the upstream's own error, in its own shape: relayed as is, secrets masked
        content = await call.refused(resp.status, await call.error_body(resp))
        return Reply(resp.status, content, content_type)
    draft = TurnDraft()
    if "text/event-stream" in content_type:
        return call.relay(NativeStream(native, draft, content_type), draft, resp)
    content = await call.whole(resp)
    if isinstance(content, Reply):
        return content
    NativeReader(native, draft).whole(content)
    call.answered(draft, None)
    return Reply(resp.status, content, content_type)
