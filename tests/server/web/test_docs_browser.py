"""/docs in real headless Chromium with every request to another host refused (as on a machine
without internet): Swagger UI still renders the API's operations."""

from __future__ import annotations

import pytest

from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(module_server):
    return module_server


def test_docs_render_offline(chromium, server: ServerProcess) -> None:
    page = chromium.new_page()
    refused: list[str] = []
    failed: list[str] = []

    def offline(route) -> None:
        if route.request.url.startswith(server.url + "/"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort("internetdisconnected")

    try:
        page.route("**/*", offline)
        page.on("requestfailed", lambda r: failed.append(r.url))
        page.goto(server.url + "/docs")
        page.wait_for_selector(".opblock-summary-path", timeout=30_000)
        paths = page.locator(".opblock-summary-path").all_inner_texts()
        assert {"/rollout", "/health", "/metadata", "/schema"} <= {p.strip() for p in paths}, paths
        assert page.locator(".info .title").inner_text().startswith("harness-env")
        # The description names every harness the server has and the surfaces beside the API.
        about = page.locator(".info .description").inner_text()
        assert all(name in about for name in ("pi", "opencode", "codex", "claude-code", "gemini-cli", "harbor", "whitebox")), about
        assert all(surface in about for surface in ("POST /rollouts", "/web", "/mcp", "PUT /policy/weights")), about
        assert refused == [] and failed == [], (refused, failed)  # it never asked another host for anything
    finally:
        page.close()
