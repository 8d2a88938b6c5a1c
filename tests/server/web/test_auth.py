"""/web with a token: the login form sets a cookie that opens /web and nothing else."""

import httpx
import pytest
from fastapi import FastAPI

from harness_env.server.auth import WEB_COOKIE, TokenAuth, web_session_value
from harness_env.server.web.login import add_login_routes


def _app(token):
    app = FastAPI()
    add_login_routes(app, token)

    @app.get("/web/")
    async def web():
        return {"page": True}

    @app.get("/web/config")
    async def config():
        return {"config": True}

    @app.get("/harnesses")
    async def harnesses():
        return []

    return TokenAuth(app, token)


@pytest.fixture
async def client():
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app("tok-123")), base_url="http://t") as c:
        yield c


async def test_browser_is_sent_to_the_login_form_then_kept_signed_in(client):
    r = await client.get("/web/")
    assert r.status_code == 303 and r.headers["location"] == "/web/login"
    assert (await client.get("/web/config")).status_code == 401
    form = await client.get("/web/login")
    assert form.status_code == 200 and 'type="password"' in form.text
    bad = await client.post("/web/login", data={"token": "nope"})
    assert bad.status_code == 401 and "wrong token" in bad.text and WEB_COOKIE not in bad.headers.get("set-cookie", "")
    ok = await client.post("/web/login", data={"token": "tok-123"})
    assert ok.status_code == 303 and ok.headers["location"] == "/web/"
    set_cookie = ok.headers["set-cookie"]
    assert "HttpOnly" in set_cookie and "Path=/web" in set_cookie and "samesite=lax" in set_cookie.lower()
    assert "tok-123" not in set_cookie and web_session_value("tok-123") in set_cookie
    assert (await client.get("/web/")).json() == {"page": True}
    assert (await client.get("/web/config")).json() == {"config": True}


async def test_the_cookie_opens_only_web(client):
    cookie = {"cookie": f"{WEB_COOKIE}={web_session_value('tok-123')}"}
    assert (await client.get("/harnesses", headers=cookie)).status_code == 401
    assert (await client.get("/web/config", headers={"cookie": f"{WEB_COOKIE}={web_session_value('other')}"})).status_code == 401
    assert (await client.get("/web/config", headers={"Authorization": "Bearer tok-123"})).status_code == 200


async def test_without_a_token_web_is_open_and_login_redirects():
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app(None)), base_url="http://t") as c:
        assert (await c.get("/web/")).json() == {"page": True}
        r = await c.get("/web/login")
        assert r.status_code == 303 and r.headers["location"] == "/web/"


async def test_on_a_space_over_https_the_cookie_is_sent_inside_the_space_iframe(monkeypatch):
    """A Space shows /web in an iframe of another site: a Lax cookie would never come back there."""
    monkeypatch.setenv("SPACE_ID", "someone/harness-env")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app("tok-123")), base_url="https://t") as c:
        ok = await c.post("/web/login", data={"token": "tok-123"})
        attrs = [a.strip().lower() for a in ok.headers["set-cookie"].split(";")]
        assert {"samesite=none", "secure", "partitioned", "httponly"} <= set(attrs)
        gone = await c.get("/web/logout")
        attrs = [a.strip().lower() for a in gone.headers["set-cookie"].split(";")]
        assert "partitioned" in attrs and "max-age=0" in attrs
    # The same Space over plain HTTP (a local docker run): a SameSite=None cookie without Secure is refused by browsers.
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app("tok-123")), base_url="http://t") as c:
        set_cookie = (await c.post("/web/login", data={"token": "tok-123"})).headers["set-cookie"].lower()
        assert "samesite=lax" in set_cookie and "partitioned" not in set_cookie
