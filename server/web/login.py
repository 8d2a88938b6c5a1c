"""The token form of /web: asks a person for the server's token once, then sets the /web cookie.

TokenAuth (server/auth.py) lets /web/login through and accepts the cookie on /web paths. The
cookie is HttpOnly (page scripts cannot read it) and SameSite=Lax (other sites cannot make the
browser send it with their requests), and Secure when the page is served over HTTPS. On a Hugging
Face Space the page lives in an iframe of the Space's page, another site, where a Lax cookie is
never sent: there it is SameSite=None; Secure; Partitioned (kept for that embedding only), and the
origin check of server/auth.py still refuses requests from other pages. Wrong tokens
count against the client's address in the same limiter as the API's (429 past a few a minute).
"""

from __future__ import annotations

import asyncio
import os
from html import escape
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from harness_env.server.auth import WEB_COOKIE, WEB_LOGIN_PATH, WEB_PREFIX, AuthFailureLimiter, client_address, same_secret, web_session_value

MAX_FORM_BYTES = 8192
FAILED_LOGIN_DELAY_S = 0.5  # slows guessing down; a right token is not delayed
COOKIE_MAX_AGE_S = 7 * 24 * 3600

_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>harness-env: sign in</title>
<style>
body {{ font-family: system-ui, sans-serif; display: flex; justify-content: center; margin-top: 12vh; color: #1f2937; }}
form {{ border: 1px solid #e5e7eb; border-radius: 10px; padding: 24px 28px; width: 340px; }}
input {{ width: 100%; padding: 8px; margin: 8px 0 14px; box-sizing: border-box; }}
button {{ padding: 8px 18px; }}
.error {{ color: #b91c1c; }}
</style></head>
<body><form method="post" action="{action}">
<h2>harness-env</h2>
<p>This server requires its token (<code>HARNESS_ENV_TOKEN</code>).</p>
{error}
<label for="token">token</label>
<input id="token" name="token" type="password" autocomplete="current-password" autofocus required>
<button type="submit" id="sign-in">Sign in</button>
</form></body></html>
"""


def _page(request: Request, error: str = "") -> str:
    action = escape(request.scope.get("root_path", "") + WEB_LOGIN_PATH)
    return _PAGE.format(action=action, error=f'<p class="error">{escape(error)}</p>' if error else "")


def _secure(request: Request) -> bool:
    proto = request.headers.get("x-forwarded-proto", request.url.scheme)
    return proto.split(",")[0].strip() == "https"


def embedded(request: Request) -> bool:
    """Served over HTTPS on a Hugging Face Space (SPACE_ID set), whose page embeds the UI in an iframe."""
    return _secure(request) and bool(os.environ.get("SPACE_ID"))


def cookie_attributes(request: Request) -> dict[str, Any]:
    """set_cookie's keywords: SameSite=None; Secure when embedded, else SameSite=Lax."""
    if embedded(request):
        return {"secure": True, "samesite": "none"}
    return {"secure": _secure(request), "samesite": "lax"}


def partition_last_cookie(reply: Response) -> None:
    """Add `Partitioned` (CHIPS: a browser that blocks third-party cookies still keeps this one for
    the Space's page) to the cookie just set; Python's http.cookies writes it only from 3.14."""
    for i in range(len(reply.raw_headers) - 1, -1, -1):
        name, value = reply.raw_headers[i]
        if name == b"set-cookie":
            reply.raw_headers[i] = (name, value + b"; Partitioned")
            return


def add_login_routes(app: FastAPI, token: str | None, limiter: AuthFailureLimiter | None = None) -> None:
    """GET/POST /web/login and GET /web/logout; must be added before the UI is mounted at /web."""
    web_root = WEB_PREFIX + "/"
    limiter = limiter or AuthFailureLimiter()

    @app.get(WEB_LOGIN_PATH, include_in_schema=False)
    async def login_form(request: Request) -> Response:
        if not token:
            return RedirectResponse(request.scope.get("root_path", "") + web_root, status_code=303)
        return HTMLResponse(_page(request))

    @app.post(WEB_LOGIN_PATH, include_in_schema=False)
    async def login(request: Request) -> Response:
        root = request.scope.get("root_path", "")
        if not token:
            return RedirectResponse(root + web_root, status_code=303)
        address = client_address(request.scope)
        wait = limiter.retry_after(address)
        if wait is not None:
            return HTMLResponse(_page(request, f"too many wrong tokens: try again in {wait} s"), status_code=429, headers={"retry-after": str(wait)})
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                return HTMLResponse(_page(request, "form too large"), status_code=413)
        given = (parse_qs(body.decode("utf-8", "replace")).get("token") or [""])[0].strip()
        if not given or not same_secret(given, token):
            limiter.failed(address)
            await asyncio.sleep(FAILED_LOGIN_DELAY_S)
            return HTMLResponse(_page(request, "wrong token"), status_code=401)
        reply = RedirectResponse(root + web_root, status_code=303)
        reply.set_cookie(WEB_COOKIE, web_session_value(token), max_age=COOKIE_MAX_AGE_S, path=root + WEB_PREFIX, httponly=True, **cookie_attributes(request))
        if embedded(request):
            partition_last_cookie(reply)
        return reply

    @app.get(WEB_PREFIX + "/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        root = request.scope.get("root_path", "")
        reply = RedirectResponse(root + (WEB_LOGIN_PATH if token else web_root), status_code=303)
        # The same attributes as when set: a partitioned cookie is only removed by a partitioned deletion.
        reply.delete_cookie(WEB_COOKIE, path=root + WEB_PREFIX, httponly=True, **cookie_attributes(request))
        if embedded(request):
            partition_last_cookie(reply)
        return reply
