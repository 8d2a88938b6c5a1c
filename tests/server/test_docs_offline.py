"""/docs works without internet: the page and every file it loads come from this server (Swagger
UI's dist files as the swagger-ui-bundle-v2 package installs them), nothing from a CDN."""

from __future__ import annotations

import re
import sys

import httpx
import pytest

from harness_env.server.app import create_app
from harness_env.server.docs_page import ASSETS, ASSETS_PATH
from tests.server_process import ServerProcess

# Every URL the page references: <link href>, <script src>, and Swagger UI's `url:` (the OpenAPI document).
REFERENCES = re.compile(r"""(?:href|src)="([^"]+)"|\burl:\s*'([^']+)'""")


@pytest.fixture(scope="module")
def server(module_server):
    return module_server


def _references(page: str) -> list[str]:
    return [a or b for a, b in REFERENCES.findall(page)]


def test_every_file_the_page_loads_comes_from_this_server(server: ServerProcess) -> None:
    page = httpx.get(server.url + "/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert not re.search(r"https?://|//cdn|jsdelivr|unpkg", page.text), "the page names another host"
    refs = _references(page.text)
    assert sorted(refs) == sorted([f"{ASSETS_PATH}/{name}" for name in ASSETS] + ["/openapi.json"])
    kinds = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css", "favicon.png": "image/png", "openapi.json": "application/json"}
    for ref in refs:
        assert ref.startswith("/") and not ref.startswith("//"), ref  # this server, whatever its address
        r = httpx.get(server.url + ref)
        assert r.status_code == 200, (ref, r.status_code)
        assert r.headers["content-type"].startswith(kinds[ref.rsplit("/", 1)[1]]), (ref, r.headers["content-type"])
        assert len(r.content) > 500, ref
    js = httpx.get(server.url + f"{ASSETS_PATH}/swagger-ui-bundle.js").text
    assert "SwaggerUIBundle" in js and len(js) > 500_000  # the whole bundle, not a stub
    assert ".swagger-ui" in httpx.get(server.url + f"{ASSETS_PATH}/swagger-ui.css").text
    # Swagger UI 5 (OpenAPI 3.1, as FastAPI writes it); the 4.x of swagger-ui-bundle 1.x renders nothing.
    assert httpx.get(server.url + "/openapi.json").json()["openapi"].startswith("3.1")


def test_the_online_validator_badge_is_off(server: ServerProcess) -> None:
    # Swagger UI would otherwise load a badge image from swagger.io for a public server's document.
    assert '"validatorUrl": null' in httpx.get(server.url + "/docs").text


def test_only_the_named_assets_are_served(server: ServerProcess) -> None:
    for path in (
        "/redoc",
        f"{ASSETS_PATH}/index.html",
        f"{ASSETS_PATH}/swagger-ui-bundle.js.map",
        f"{ASSETS_PATH}/..%2f..%2f__init__.py",
        f"{ASSETS_PATH}/",
        "/docs/oauth2-redirect",
    ):
        assert httpx.get(server.url + path).status_code == 404, path


async def test_behind_a_prefix_the_page_names_prefixed_urls() -> None:
    """A proxy that strips a path prefix (root_path): the browser must ask for the prefixed URLs."""
    app = create_app(public_url="http://127.0.0.1:9")
    transport = httpx.ASGITransport(app=app, root_path="/space")
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        refs = _references((await c.get("/docs")).text)
        assert refs and all(ref.startswith("/space/") for ref in refs), refs
        assert (await c.get(f"{ASSETS_PATH}/swagger-ui.css")).status_code == 200


async def test_without_swagger_ui_the_page_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "swagger_ui_bundle", None)  # the import fails as if not installed
    app = create_app(public_url="http://127.0.0.1:9")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.get("/docs")
        assert r.status_code == 501 and "harness-env[server]" in r.json()["detail"]
        assert (await c.get("/health")).json()["status"] == "healthy"  # the rest still serves
