"""Browser fixtures for the /web tests: the system Chromium (Debian's `chromium`) driven by
Playwright. Playwright's own browser downloads are never used (this machine, like CI, reaches no
download host); a missing Chromium fails the test with the command that installs it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("HARNESS_ENV_CHROMIUM", "/usr/bin/chromium")
# Without the background-networking flags Chromium keeps calling Google services on a machine
# that has no route to them.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


# Module scope, not session: while Playwright's sync API is open, its event loop counts as running
# in this thread, and a later test's asyncio.run() would refuse to start.
@pytest.fixture(scope="module")
def chromium():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"Chromium not found at {CHROMIUM}: install it with `apt-get install -y chromium chromium-driver` "
            "(./dev test does this when run as root), or point HARNESS_ENV_CHROMIUM at a Chromium binary"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="module")
def web_server(tmp_path_factory):
    """One server (and scripted policy) shared by a module's browser tests: the first page load
    of a server imports Gradio, which costs about ten seconds of CPU."""
    from tests.fakes.policy import FakePolicy, FakePolicyServer
    from tests.server_process import ServerProcess

    with FakePolicyServer(FakePolicy()) as policy:
        server = ServerProcess(tmp_path_factory.mktemp("web-server-sandboxes"))
        try:
            yield server, policy
        finally:
            server.stop()  # also fails on anything left in the server's TMPDIR
        assert os.listdir(server.sandbox_dir) == [], "the server left rollout directories behind"
