"""Bearer-token auth for the whole app, as an ASGI wrapper.

Running rollouts means running commands on this machine, so when a token is set every route but
/health requires it. The capture proxy (/capture) is exempt: it authenticates harnesses by their
per-rollout capture key instead.

A browser cannot send a bearer header, so the web UI (/web) also accepts a session cookie that the
login form at /web/login sets after checking the token once (server/web/login.py). The cookie holds
an HMAC derived from the token, not the token, and is scoped to /web: it opens the UI and nothing
else.
"""

from __future__ import annotations

import hashlib
import hmac
from http.cookies import CookieError, SimpleCookie

from harness_env.core.capture.asgi import Receive, Scope, Send, error_reply, header, send_reply

OPEN_PATHS = ("/health",)
OPEN_PREFIXES = ("/capture/",)
WEB_PREFIX = "/web"
WEB_LOGIN_PATH = "/web/login"
WEB_COOKIE = "harness_env_web"


def web_session_value(token: str) -> str:
    """What the /web cookie holds: derived from the token, so the browser never stores the token."""
    return hmac.new(token.encode(), b"harness-env web session v1", hashlib.sha256).hexdigest()


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


class TokenAuth:
    def __init__(self, app, token: str | None) -> None:
        self.app = app
        self.token = token

    def _allowed(self, scope: Scope) -> bool:
        path = scope.get("path", "")
        if not self.token or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES) or path == WEB_LOGIN_PATH:
            return True
        if is_web_path(path):
            value = cookie(scope, WEB_COOKIE)
            if value and hmac.compare_digest(value, web_session_value(self.token)):
                return True
        auth = header(scope, b"authorization") or ""
        if auth.lower().startswith("bearer ") and hmac.compare_digest(auth[7:].strip(), self.token):
            return True
        if scope["type"] == "websocket":  # browsers cannot set headers on a WebSocket
            from urllib.parse import parse_qs

            qs = parse_qs(scope.get("query_string", b"").decode())
            return hmac.compare_digest((qs.get("token") or [""])[0], self.token)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and not self._allowed(scope):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 4401})
                return
            if scope.get("method") == "GET" and scope.get("path") in (WEB_PREFIX, WEB_PREFIX + "/"):
                # A person opening the UI: ask for the token once, on the login form.
                location = (scope.get("root_path", "") + WEB_LOGIN_PATH).encode()
                await send({"type": "http.response.start", "status": 303, "headers": [(b"location", location), (b"content-length", b"0")]})
                await send({"type": "http.response.body", "body": b""})
                return
            reply = error_reply(401, "missing or wrong token: send 'Authorization: Bearer <token>' (the server's HARNESS_ENV_TOKEN)", "unauthorized")
            await send_reply(send, reply)
            return
        await self.app(scope, receive, send)
