"""The Rollouts view of /web in real headless Chromium, against a server process: stored rollouts
listed newest first and filtered, one opened by a click and by its shareable URL, a running one
followed live, and result files opened from disk."""

from __future__ import annotations

import time

import httpx
import pytest

from harness_env.models import RolloutResult
from harness_env.storage import save
from tests.server.web.driver import LOAD_TIMEOUT_MS, WebDriver

pytestmark = pytest.mark.e2e
PASS = [{"bash": "echo hello > hello.txt"}, {"text": "done"}]
FAIL = [{"bash": "echo nope > hello.txt"}, {"text": "done"}]
SLOW = [{"hang": 25, "bash": "echo hello > hello.txt"}, {"text": "done"}]
HANG = [{"hang": 120}]


def submit(server, policy_server, model: str, script: list[dict], task_id: str) -> str:
    policy_server.policy.scripts[model] = script
    body = {"instruction": "Create hello.txt containing hello.", "base_url": policy_server.base_url, "model": model,
            "harness": "whitebox", "verify": ["grep -qx hello hello.txt"], "agent_timeout_s": 120, "task_id": task_id}
    r = httpx.post(server.url + "/rollouts", json=body)
    assert r.status_code == 202, r.text
    return r.json()["rollout_id"]


def wait_ended(server, rollout_id: str) -> dict:
    job = httpx.get(f"{server.url}/rollouts/{rollout_id}", params={"wait": 60}, timeout=90).json()
    assert job["status"] in ("finished", "failed", "cancelled"), job
    return job


def rows(web: WebDriver) -> list[list[str]]:
    """The Rollouts list as shown: one list of cell texts per row (Gradio's cells are
    data-testid="cell-ROW-COL")."""
    return web.page.evaluate("""() => {
        const out = [];
        for (const el of document.querySelectorAll('#ro-list [data-testid^="cell-"]')) {
            const m = el.dataset.testid.match(/^cell-(\\d+)-(\\d+)$/);
            if (!m) continue;
            (out[+m[1]] = out[+m[1]] || [])[+m[2]] = el.innerText.trim();
        }
        return out;
    }""")


def open_rollouts(web: WebDriver) -> None:
    web.page.get_by_role("tab", name="Rollouts").click()


def wait_rows(web: WebDriver, n: int) -> list[list[str]]:
    """Wait for the list to show n rows (the grid counts its header row too)."""
    web.page.wait_for_function("(n) => { const g = document.querySelector('#ro-list [role=grid]');"
                               " return g && g.getAttribute('aria-rowcount') === String(n + 1); }", arg=n, timeout=30_000)
    deadline = time.monotonic() + 30
    while len(shown := [r for r in rows(web) if r]) != n and time.monotonic() < deadline:
        time.sleep(0.2)
    return shown


def ro_reward(web: WebDriver, value: str, timeout_ms: int = 30_000) -> None:
    web.page.wait_for_selector(f"#ro-reward .he-reward[data-reward='{value}']", timeout=timeout_ms)


def test_list_filter_open_and_share(chromium, web_server, artifacts, tmp_path):
    server, policy_server = web_server
    passed = submit(server, policy_server, "ro-pass", PASS, "task-pass")
    assert wait_ended(server, passed)["reward"] == 1.0
    failed = submit(server, policy_server, "ro-fail", FAIL, "task-fail")
    assert wait_ended(server, failed)["reward"] == 0.0
    cancelled = submit(server, policy_server, "ro-hang", HANG, "task-hang")
    httpx.delete(f"{server.url}/rollouts/{cancelled}", timeout=60)
    assert wait_ended(server, cancelled)["status"] == "cancelled"

    web = WebDriver(chromium, server.url)
    try:
        web.open()
        open_rollouts(web)
        shown = wait_rows(web, 3)
        # Newest first, each with its status, harness, task and reward.
        assert [r[1] for r in shown] == [cancelled, failed, passed]
        assert [(r[2], r[3], r[4], r[5]) for r in shown] == [("cancelled", "whitebox", "task-hang", "-"),
                                                             ("finished", "whitebox", "task-fail", "0.0"),
                                                             ("finished", "whitebox", "task-pass", "1.0")]
        assert float(shown[2][6]) > 0  # the wall time

        web.choose("ro-filter-status", "cancelled")
        assert [r[1] for r in wait_rows(web, 1)] == [cancelled]
        web.page.locator("#ro-filter-status input").press("Escape")
        web.page.locator("#ro-filter-status .token-remove").first.click()  # the chip's remove button
        wait_rows(web, 3)
        web.page.locator("#ro-filter-task textarea, #ro-filter-task input").first.fill("task-fail")
        web.page.locator("#ro-filter-task textarea, #ro-filter-task input").first.press("Enter")
        assert [r[1] for r in wait_rows(web, 1)] == [failed]
        web.page.locator("#ro-filter-task textarea, #ro-filter-task input").first.fill("")
        web.page.locator("#ro-filter-task textarea, #ro-filter-task input").first.press("Enter")
        wait_rows(web, 3)

        # A click opens the failing one's page: its phases, reward and verify output.
        web.page.click("#ro-list [data-testid='cell-1-2']")
        ro_reward(web, "0.0")
        assert failed in web.page.inner_text("#ro-title")
        log = web.page.locator("#ro-log textarea").input_value()
        for phase in ("setup", "agent", "verify", "collect", "done"):
            assert phase in log, log
        assert "finished" in web.page.inner_text("#ro-status")
        assert "grep -qx hello hello.txt" in web.page.inner_text("#ro-verify-results")
        # Then the passing one: its files and its model calls, as a fresh run shows them.
        web.page.click("#ro-list [data-testid='cell-2-2']")
        ro_reward(web, "1.0")
        web.page.locator("#ro-share").wait_for()
        href = web.page.locator("#ro-share").get_attribute("href")
        assert href == f"?rollout={passed}"
        web.page.wait_for_function("(id) => location.search === '?rollout=' + id", arg=passed, timeout=10_000)  # the address bar too
        web.page.get_by_role("tab", name="files").click()
        assert "hello.txt" in web.page.inner_text("#ro-files-out")
        web.page.get_by_role("tab", name="logprobs").click()
        assert web.page.locator("#ro-logprob-plot svg circle.he-token").count() > 0
        web.page.screenshot(path=str(artifacts / "web-rollouts.png"), full_page=True)
    finally:
        web.close()

    # The shareable URL in a fresh browser context: the same rollout, opened on load.
    fresh = WebDriver(chromium, server.url)
    try:
        fresh.page.goto(f"{server.url}/web/{href}", timeout=LOAD_TIMEOUT_MS)
        fresh.page.wait_for_function("(id) => (document.querySelector('#ro-title') || {}).innerText?.includes(id)", arg=passed,
                                     timeout=60_000)
        ro_reward(fresh, "1.0")
        assert "grep -qx hello hello.txt" in fresh.page.inner_text("#ro-verify-results")
        assert "collect" in fresh.page.locator("#ro-log textarea").input_value()
        missing = WebDriver(chromium, server.url)
        try:
            missing.page.goto(f"{server.url}/web/?rollout=0123456789ab", timeout=LOAD_TIMEOUT_MS)
            missing.page.wait_for_function("(document.querySelector('#ro-title') || {}).innerText?.includes('no rollout')", timeout=60_000)
        finally:
            missing.close()
        assert fresh.foreign_requests == []
    finally:
        fresh.close()
    server.assert_no_rollout_left()


def test_a_running_rollout_is_followed_live(chromium, web_server):
    server, policy_server = web_server
    rid = submit(server, policy_server, "ro-slow", SLOW, "task-slow")
    web = WebDriver(chromium, server.url)
    try:
        web.page.goto(f"{server.url}/web/?rollout={rid}", timeout=LOAD_TIMEOUT_MS)
        web.page.wait_for_function("(id) => (document.querySelector('#ro-title') || {}).innerText?.includes(id)", arg=rid, timeout=60_000)
        assert httpx.get(f"{server.url}/rollouts/{rid}").json()["status"] in ("queued", "running")
        web.page.wait_for_function("document.querySelector('#ro-status').innerText.includes('running')", timeout=30_000)
        assert web.page.locator("#ro-reward .he-reward").get_attribute("data-reward") == ""
        web.page.wait_for_function("document.querySelector('#ro-log textarea').value.includes('agent    started')", timeout=30_000)
        # No reload: the page follows it to its end.
        ro_reward(web, "1.0", timeout_ms=90_000)
        web.page.wait_for_function("document.querySelector('#ro-status').innerText.includes('finished')", timeout=10_000)
        assert "collect" in web.page.locator("#ro-log textarea").input_value()
        assert "grep -qx hello hello.txt" in web.page.inner_text("#ro-verify-results")
    finally:
        web.close()
    server.assert_no_rollout_left()


def test_open_result_files_from_disk(chromium, web_server, tmp_path):
    server, policy_server = web_server
    rid = submit(server, policy_server, "ro-file", PASS, "task-file")
    wait_ended(server, rid)
    result = RolloutResult.model_validate(httpx.get(f"{server.url}/rollouts/{rid}", params={"detail": "full"}).json()["result"])
    compact = tmp_path / "one.json"
    save(result, compact)
    failing = result.model_copy(update={"reward": 0.0, "task_id": "second"})
    jsonl = tmp_path / "two.jsonl"
    jsonl.write_text(result.model_dump_json() + "\n" + failing.model_dump_json() + "\n")
    bad = tmp_path / "bad.json"
    bad.write_text('{"reward": "lots"')

    web = WebDriver(chromium, server.url)
    try:
        web.open()
        web.page.get_by_role("tab", name="Rollouts").click()
        upload = web.page.locator("#ro-file input[type=file]")
        upload.set_input_files(str(compact))
        ro_reward(web, "1.0")
        assert "one.json" in web.page.inner_text("#ro-title")
        assert "grep -qx hello hello.txt" in web.page.inner_text("#ro-verify-results")
        assert "agent" in web.page.locator("#ro-log textarea").input_value()  # its phases

        web.page.locator("#ro-file button[aria-label*='lear']").first.click()  # Gradio's clear button
        web.page.locator("#ro-file input[type=file]").set_input_files(str(jsonl))
        web.page.wait_for_function("document.querySelector('#ro-title').innerText.includes('result 1 of 2')", timeout=30_000)
        web.choose("ro-file-pick", "2: second · whitebox · reward 0.0")
        ro_reward(web, "0.0")

        web.page.locator("#ro-file button[aria-label*='lear']").first.click()
        web.page.locator("#ro-file input[type=file]").set_input_files(str(bad))
        web.page.wait_for_function("document.querySelector('#ro-title').innerText.includes('could not open bad.json')", timeout=30_000)
        assert web.page.locator("#ro-reward .he-reward").get_attribute("data-reward") == ""
    finally:
        web.close()
