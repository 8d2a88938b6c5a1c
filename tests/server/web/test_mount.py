"""/web is loaded on first use, and a UI that fails to load leaves the API up."""

import asyncio
import threading

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


async def test_the_page_says_it_is_loading_while_gradio_loads(monkeypatch):
    release, ended = threading.Event(), threading.Event()

    def slow() -> None:  # a load that lasts until the test lets it end, then fails (so no Gradio is really mounted here)
        release.wait(60)
        ended.set()
        raise ImportError("late failure")

    monkeypatch.setattr(web, "_import_gradio", slow)
    app = create_app(public_url="http://127.0.0.1:9")
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            r = await c.get("/web/")
            assert not ended.is_set()  # answered while the load still runs, not held until it ends
            assert r.status_code == 200 and 'id="web-loading"' in r.text and '<meta http-equiv="refresh"' in r.text
            assert r.headers["cache-control"] == "no-store"
            assert (await c.get("/health")).json()["status"] == "healthy"
            release.set()
            assert await asyncio.to_thread(ended.wait, 60), "the load never ended"
            for _ in range(100):  # the reload after the load failed (the loading page until it is seen): the failure, as before
                if (r := await c.get("/web/")).status_code != 200:
                    break
                await asyncio.sleep(0.1)
            assert r.status_code == 503 and "late failure" in r.text
    finally:
        release.set()


def test_a_server_stopped_while_gradio_loads_leaves_no_cache_directory(start_server):
    """The wheel test caught it: the first /web request answers with the loading page, the server
    stops before Gradio is imported, and Gradio's cache directory must still go."""
    server = start_server()
    r = httpx.get(server.url + "/web/", timeout=30)
    assert r.status_code == 200 and 'id="web-loading"' in r.text  # Gradio is loading right now
    server.stop()  # fails if the server's TMPDIR keeps anything
