"""Bearer-token auth for the whole app, as an ASGI wrapper.

Running rollouts means running commands on this machine, so when a token is set every route but
/health and the API's description (OPEN_PATHS) requires it. The capture proxy (/capture) is exempt: it authenticates harnesses by their
per-rollout capture key instead.

A browser cannot send a bearer header, so the web UI (/web) also accepts a session cookie that the
login form at /web/login sets after checking the token once (server/web/login.py). The cookie holds
an HMAC derived from the token, not the token, and is scoped to /web: it opens the UI and nothing
else.

Two more guards live here, because they are about who is asking:
- requests a browser sends from another origin (a page on another port or site) are refused, so
  no page but the server's own can read /web or start a rollout with the user's cookie;
- failed authentications are counted per client address (AuthFailureLimiter): past a few a
  minute, that address may try one new credential every few seconds (429 in between), so a token
  cannot be guessed at speed, while the right token still gets in from there. On loopback a
  sandboxed agent (network "open") is counted apart from the host's processes (server/peer.py).
Tokens and keys are masked from every log line by server/log_secrets.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs, urlsplit

from harness_env.core.capture.asgi import Receive, Reply, Scope, Send, error_reply, header, send_reply
from harness_env.server.peer import is_local_address, peer_key

# Open without a token: liveness, "/" (only a redirect to the web UI, which asks for the token), and
# what describes the API without running anything (OpenEnv's `validate --url` reads these, and a
# browser cannot send a bearer header to /docs): the project is open source, its schema no secret.
OPEN_PATHS = ("/health", "/", "/metadata", "/schema", "/openapi.json", "/docs")
OPEN_PREFIXES = ("/capture/", "/docs/assets/")
WEB_PREFIX = "/web"
WEB_LOGIN_PATH = "/web/login"
WEB_COOKIE = "harness_env_web"
# The token may also come in this header, for when Authorization carries another (a private Hugging
# Face Space's front door wants the user's Hugging Face token there).
TOKEN_HEADER = b"x-harness-env-token"


def utf8(text: str) -> bytes:
    """`text` as bytes, for any str: the bytes a str from os.environ or argv was decoded from, and
    for other lone surrogates bytes that no valid token has."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def same_secret(given: str | bytes, expected: str) -> bool:
    """Constant-time comparison that never raises: compare_digest refuses a non-ASCII str (a
    TypeError, i.e. a 500), so both sides are compared as bytes."""
    return hmac.compare_digest(given if isinstance(given, bytes) else utf8(given), utf8(expected))


def web_session_value(token: str) -> str:
    """What the /web cookie holds: derived from the token, so the browser never stores the token."""
    return hmac.new(utf8(token), b"harness-env web session v1", hashlib.sha256).hexdigest()


def cookie(scope: Scope, name: str) -> str | None:
    raw = header(scope, b"cookie")
    if not raw:
        return None
    try:
        jar = SimpleCookie(raw)
    except CookieError:
        return None
    return jar[name].value if name in jar else None


def is_web_path(path: str) -> bool:
    return path == WEB_PREFIX or path.startswith(WEB_PREFIX + "/")


def client_address(scope: Scope) -> str:
    """Who is asking, as the server sees the connection (uvicorn rewrites it from X-Forwarded-For
    only for the proxies `harness-env serve` is told to trust: FORWARDED_ALLOW_IPS)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


class AuthFailureLimiter:
    """Failed authentications per client address, throttled so that guessing is slow while the
    right token keeps working from the same address (a loopback trainer, or everyone behind one
    proxy, shares it with whoever guesses).

    An address may fail `max_failures` times within `window_s` at full speed. Past that it is
    slowed for `backoff_s` after its last failure: one new guess per `slow_interval_s`, and a
    credential arriving sooner is refused unchecked (429 with Retry-After) - checking it would
    let a guesser try at the speed it can send. So the right token waits at most
    `slow_interval_s` after the last wrong guess, and only while someone at that address keeps
    guessing (before, ten wrong tokens locked it out for a minute). A wrong credential sent
    again (a stale client retrying) tells nothing new: it is answered 401 at once and neither
    counted nor slowed (`known_wrong`). In memory, bounded to `max_addresses` (the oldest
    forgotten first): a restart forgets, which only helps the guesser once."""

    def __init__(
        self,
        max_failures: int = 10,
        window_s: float = 60.0,
        backoff_s: float = 60.0,
        slow_interval_s: float = 5.0,
        max_addresses: int = 10_000,
        max_remembered: int = 8,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self.backoff_s = backoff_s
        self.slow_interval_s = slow_interval_s
        self.max_addresses = max_addresses
        self.max_remembered = max_remembered
        self.clock = clock
        self._key = os.urandom(32)  # digests of wrong credentials mean nothing outside this process
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._slowed_until: OrderedDict[str, float] = OrderedDict()
        self._last_failure: dict[str, float] = {}
        self._wrong: OrderedDict[str, deque[bytes]] = OrderedDict()

    def _digest(self, given: str | bytes, expected: str) -> bytes:
        """What is remembered of a wrong credential: keyed by the process, and by what it was
        compared with (a value wrong as a cookie may be the right bearer token)."""
        raw = given if isinstance(given, bytes) else utf8(given)
        return hmac.new(self._key, utf8(expected) + b"\0" + raw, hashlib.sha256).digest()

    def known_wrong(self, address: str, given: str | bytes, expected: str) -> bool:
        """`given` already failed from `address`: refusing it again reveals nothing."""
        return self._digest(given, expected) in self._wrong.get(address, ())

    def retry_after(self, address: str) -> int | None:
        """Whole seconds before `address` may present a new credential, or None if it may now."""
        until = self._slowed_until.get(address)
        if until is None:
            return None
        now = self.clock()
        if until <= now:  # no failure for backoff_s: full speed again, counted afresh
            del self._slowed_until[address]
            self._last_failure.pop(address, None)
            self._failures.pop(address, None)
            return None
        left = self._last_failure.get(address, 0.0) + self.slow_interval_s - now
        return max(1, math.ceil(left)) if left > 0 else None

    def slowing(self, address: str) -> bool:
        """Some peer at `address` is being slowed now (the key may carry more than the address:
        server/peer.py), so who is asking must be told apart before a check."""
        if not self._slowed_until:
            return False
        now = self.clock()
        return any(until > now and (key == address or key.startswith(address + "|")) for key, until in self._slowed_until.items())

    def failed(self, address: str, wrong: Iterable[tuple[str | bytes, str]] = ()) -> None:
        """Count a failure of `address`; `wrong`: the (credential, what it should have been)
        pairs it presented, remembered so that sending them again is not counted."""
        now = self.clock()
        if wrong:
            remembered = self._wrong.pop(address, None) or deque(maxlen=self.max_remembered)
            remembered.extend(self._digest(given, expected) for given, expected in wrong)
            self._wrong[address] = remembered
        times = self._failures.pop(address, None) or deque()
        times.append(now)
        while times and times[0] <= now - self.window_s:
            times.popleft()
        self._failures[address] = times  # re-inserted last: the most recent
        if len(times) >= self.max_failures or self._slowed_until.get(address, 0.0) > now:
            self._slowed_until.pop(address, None)
            self._slowed_until[address] = now + self.backoff_s
            self._last_failure[address] = now
        for table in (self._failures, self._slowed_until, self._wrong):
            while len(table) > self.max_addresses:
                forgotten, _ = table.popitem(last=False)
                if table is self._slowed_until:
                    self._last_failure.pop(forgotten, None)


def too_many_failures(retry_after: int) -> Reply:
    reply = error_reply(429, f"too many failed authentications from this address: retry in {retry_after} s", "rate_limited")
    reply.headers.append((b"retry-after", str(retry_after).encode()))
    return reply


def origin_of(url: str) -> str:
    """'https://h:8443/x' -> 'https://h:8443' (the form browsers send in Origin)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def is_foreign_origin(scope: Scope, own_origins: Iterable[str]) -> bool:
    """A browser request from a page of another origin (another port or site). Browsers send
    Origin on every cross-origin request and on same-origin ones that change state; non-browser
    clients send none. Same origin: the server's public URL, or the Host the request was sent to.
    'null' (a sandboxed frame, a file:// page) is foreign."""
    origin = header(scope, b"origin")
    if origin is None:
        return False
    origin = origin.strip().lower()
    if origin in own_origins:
        return False
    # The Host the browser sent to (or the one a proxy in front forwarded: a page cannot set that
    # header on a request without a preflight, which is itself refused here).
    hosts = {(header(scope, name) or "").split(",")[0].strip().lower() for name in (b"host", b"x-forwarded-host")} - {""}
    try:
        return urlsplit(origin).netloc not in hosts
    except ValueError:  # not even a URL: junk
        return True


def _bearer(scope: Scope) -> bytes | None:
    value = _raw_header(scope, b"authorization")
    return value[7:].strip() if value is not None and value[:7].lower() == b"bearer " else None


def _raw_header(scope: Scope, name: bytes) -> bytes | None:
    return next((value for key, value in scope.get("headers", ()) if key == name), None)


def _query_token(scope: Scope) -> str | None:
    query = scope.get("query_string", b"").decode("latin-1")
    values = parse_qs(query, encoding="utf-8", errors="surrogateescape").get("token")
    return values[0] if values else None


class TokenAuth:
    def __init__(self, app, token: str | None, *, own_origins: Iterable[str] = (), limiter: AuthFailureLimiter | None = None) -> None:
        self.app = app
        self.token = token
        self.own_origins = frozenset(o.lower() for o in own_origins)
        self.limiter = limiter or AuthFailureLimiter()

    def _credentials(self, scope: Scope) -> list[tuple[str | bytes, str]]:
        """What the request presents as proof, each with what it must equal, in the forms this route accepts."""
        assert self.token
        given: list[tuple[str | bytes, str]] = []
        if is_web_path(scope.get("path", "")) and (value := cookie(scope, WEB_COOKIE)) is not None:
            given.append((value, web_session_value(self.token)))
        if (bearer := _bearer(scope)) is not None:
            given.append((bearer, self.token))
        if (own := _raw_header(scope, TOKEN_HEADER)) is not None:  # beside a Space's own Authorization
            given.append((own.strip(), self.token))
        if scope["type"] == "websocket" and (token := _query_token(scope)) is not None:
            given.append((token, self.token))  # browsers cannot set headers on a WebSocket
        return given

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if not path.startswith(OPEN_PREFIXES) and is_foreign_origin(scope, self.own_origins):
            await self._refuse(
                scope,
                send,
                error_reply(
                    403,
                    "cross-origin request refused: only pages served by this server may call it "
                    "(a proxy in front that rewrites Host: list the page's origin in HARNESS_ENV_ALLOWED_ORIGINS)",
                    "forbidden_origin",
                ),
            )
            return
        if not self.token or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES) or path == WEB_LOGIN_PATH:
            await self.app(scope, receive, send)
            return
        address = client_address(scope)
        given = self._credentials(scope)
        # A wrong credential is a guess; none at all (a first visit) is not, and one that failed
        # before tells nothing new: neither is throttled. A new one is checked unless its sender
        # is being slowed down (then it waits its turn), and the right token always passes a check.
        # The sender is the address, told apart by mount namespace on loopback (server/peer.py):
        # an agent on the host's network guessing does not slow the trainer beside it. /proc is
        # read only while someone at the address is slowed, or to count a failure.
        key = await self._peer(scope, address) if given and self.limiter.slowing(address) else address
        if given and not all(self.limiter.known_wrong(key, value, expected) for value, expected in given):
            wait = self.limiter.retry_after(key)
            if wait is not None:
                await self._refuse(scope, send, too_many_failures(wait))
                return
            if any(same_secret(value, expected) for value, expected in given):
                await self.app(scope, receive, send)
                return
            if key == address:
                key = await self._peer(scope, address)
            self.limiter.failed(key, given)
        if scope["type"] == "http" and scope.get("method") == "GET" and path in (WEB_PREFIX, WEB_PREFIX + "/"):
            # A person opening the UI: ask for the token once, on the login form.
            location = (scope.get("root_path", "") + WEB_LOGIN_PATH).encode()
            await send({"type": "http.response.start", "status": 303, "headers": [(b"location", location), (b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        await self._refuse(
            scope,
            send,
            error_reply(
                401,
                "missing or wrong token: send 'Authorization: Bearer <token>' (the server's HARNESS_ENV_TOKEN; behind a private "
                "Space, in 'X-Harness-Env-Token: <token>')",
                "unauthorized",
            ),
        )

    @staticmethod
    async def _peer(scope: Scope, address: str) -> str:
        return await asyncio.to_thread(peer_key, scope, address) if is_local_address(address) else address

    @staticmethod
    async def _refuse(scope: Scope, send: Send, reply: Reply) -> None:
        if scope["type"] == "websocket":
            # Closed before the handshake: uvicorn answers 403 (its ASGI extension for sending the
            # real status makes uvicorn log an error for every refusal).
            await send({"type": "websocket.close", "code": 4000 + reply.status})  # 4401, 4403, 4429
            return
        await send_reply(send, reply)
