"""The Compare tab in real headless Chromium: a pass and a fail of one task side by side, opened
from their ids and from a shared /web/?compare=A,B link."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.server.web.driver import LOAD_TIMEOUT_MS, WebDriver
from tests.server.web.test_rollouts_view import FAIL, PASS, submit, wait_ended

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[3]


def test_a_pass_and_a_fail_side_by_side(chromium, web_server, artifacts):
    server, policy_server = web_server
    passed = submit(server, policy_server, "cmp-pass", PASS, "hello")
    failed = submit(server, policy_server, "cmp-fail", FAIL, "hello")
    assert wait_ended(server, passed)["reward"] == 1.0 and wait_ended(server, failed)["reward"] == 0.0
    web = WebDriver(chromium, server.url)
    web.page.set_viewport_size({"width": 1440, "height": 900})
    try:
        web.open()
        web.page.get_by_role("tab", name="Compare").click()
        web.page.locator("#cmp-a textarea").fill(passed)
        web.page.locator("#cmp-b textarea").fill("no-such-rollout")
        web.page.click("#cmp-go")
        web.page.wait_for_function("document.querySelector('#cmp-note')?.innerText.includes('cannot compare')", timeout=30_000)
        assert "no rollout no-such-rollout here" in web.page.inner_text("#cmp-note").replace("\u2011", "-")
        web.page.locator("#cmp-b textarea").fill(failed)
        web.page.click("#cmp-go")
        view = web.page.locator("#cmp-view")
        view.locator("table.he-compare-steps").wait_for(timeout=30_000)

        def fact(name: str) -> list[str]:
            return view.locator(f"tr[data-fact='{name}'] > td").all_inner_texts()

        assert fact("reward") == ["1.0", "0.0"] and fact("task") == ["hello", "hello"]
        assert fact("instruction") == ["Create hello.txt containing hello."] * 2
        assert view.locator("tr[data-fact='reward'] td.he-differs").count() == 2
        assert view.locator("tr[data-fact='task'] td.he-differs").count() == 0
        step1 = view.locator("tr[data-step='1'] td").all_inner_texts()
        assert "echo hello > hello.txt" in step1[0] and "echo nope > hello.txt" in step1[1]
        assert view.locator("tr[data-step='1'] td.he-differs").count() == 2
        assert all(int(n) > 0 for n in fact("sampled tokens"))
        verify = view.locator("tr[data-fact='verify output'] > td").all_inner_texts()
        assert all("grep -qx hello hello.txt" in v for v in verify)
        assert fact("verify") == ["1 of 1 passed", "0 of 1 passed"]
        # The address bar holds the comparison: opened from it, the same two show.
        web.page.wait_for_function("(q) => location.search === q", arg=f"?compare={passed},{failed}", timeout=10_000)
        web.page.screenshot(path=str(artifacts / "web-compare.png"))
        web.page.goto(f"{server.url}/web/?compare={failed},{passed}", timeout=LOAD_TIMEOUT_MS)
        web.page.locator("#cmp-view table.he-compare-facts").wait_for(timeout=60_000)
        assert web.page.locator("#cmp-view tr[data-fact='reward'] > td").all_inner_texts() == ["0.0", "1.0"]
        # From a stored rollout's page: "compare with another" opens the Compare tab with it as A.
        web.page.goto(f"{server.url}/web/?rollout={failed}", timeout=LOAD_TIMEOUT_MS)
        web.page.click("#ro-compare", timeout=60_000)
        web.page.wait_for_function("(id) => document.querySelector('#cmp-a textarea')?.value === id", arg=failed, timeout=30_000)
        assert web.page.locator("#cmp-b").is_visible()
        assert web.foreign_requests == []
    finally:
        web.close()
    if os.environ.get("HARNESS_ENV_UPDATE_SCREENSHOT"):  # refresh the docs' picture
        shutil.copy(artifacts / "web-compare.png", REPO / "docs" / "web-compare.png")
