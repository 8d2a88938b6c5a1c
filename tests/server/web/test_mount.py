"""/web is loaded on first use, and a UI that fails to load leaves the API up."""

import httpx

from harness_env.server import web
from harness_env.server.app import create_app


async def test_a_ui_that_fails_to_load_answers_503_and_the_api_stays_up(monkeypatch):
    def broken() -> None:
        raise ImportError("no gradio here")

    monkeypatch.setattr(web, "_import_gradio", broken)
    app = create_app(public_url="http://127.0.0.1:9")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.get("/web/")
        assert r.status_code == 503 and "no gradio here" in r.text
        assert (await c.get("/health")).json()["status"] == "healthy"
        assert (await c.get("/web/login", follow_redirects=False)).status_code == 303  # no token: straight to /web/
