"""The Rollouts view of /web in real headless Chromium, against a server process: stored rollouts
listed newest first and filtered, one opened by a click and by its shareable URL, a running one
followed live, and result files opened from disk."""

from __future__ import annotations

import json
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
    body = {
        "instruction": "Create hello.txt containing hello.",
        "base_url": policy_server.base_url,
        "model": model,
        "harness": "whitebox",
        "verify": ["grep -qx hello hello.txt"],
        "agent_timeout_s": 120,
        "task_id": task_id,
    }
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
    web.page.wait_for_function(
        "(n) => { const g = document.querySelector('#ro-list [role=grid]'); return g && g.getAttribute('aria-rowcount') === String(n + 1); }",
        arg=n,
        timeout=30_000,
    )
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
        assert [(r[2], r[3], r[4], r[5]) for r in shown] == [
            ("cancelled", "whitebox", "task-hang", "-"),
            ("finished", "whitebox", "task-fail", "0.0"),
            ("finished", "whitebox", "task-pass", "1.0"),
        ]
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
        fresh.page.wait_for_function("(id) => (document.querySelector('#ro-title') || {}).innerText?.includes(id)", arg=passed, timeout=60_000)
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
        web.page.wait_for_function("document.querySelector('#ro-status')?.innerText.includes('running')", timeout=30_000)
        assert web.page.locator("#ro-reward .he-reward").get_attribute("data-reward") == ""
        web.page.wait_for_function("document.querySelector('#ro-log textarea')?.value.includes('agent    started')", timeout=30_000)
        # No reload: the page follows it to its end.
        ro_reward(web, "1.0", timeout_ms=90_000)
        web.page.wait_for_function("document.querySelector('#ro-status')?.innerText.includes('finished')", timeout=10_000)
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
        web.page.wait_for_function("document.querySelector('#ro-title')?.innerText.includes('result 1 of 2')", timeout=30_000)
        web.choose("ro-file-pick", "2: second · whitebox · reward 0.0")
        ro_reward(web, "0.0")

        web.page.locator("#ro-file button[aria-label*='lear']").first.click()
        web.page.locator("#ro-file input[type=file]").set_input_files(str(bad))
        web.page.wait_for_function("document.querySelector('#ro-title')?.innerText.includes('could not open bad.json')", timeout=30_000)
        assert web.page.locator("#ro-reward .he-reward").get_attribute("data-reward") == ""
    finally:
        web.close()


MB = 1024 * 1024


def test_the_upload_route_takes_a_result_file_up_to_the_documented_limit_and_no_more(web_server):
    """The server's 32 MB body limit refused a 40 MB result file before Gradio's 64 MB one applied;
    the upload route has the web UI's limit, every other route keeps the server's."""
    server, _ = web_server
    body = b"x" * (40 * MB)
    r = httpx.post(server.url + "/web/gradio_api/upload", files={"files": ("big.json", body, "application/json")}, timeout=120)
    assert r.status_code == 200, r.text[:300]
    assert httpx.post(server.url + "/rollout", content=body, headers={"content-type": "application/json"}, timeout=60).status_code == 413
    over = httpx.post(server.url + "/web/gradio_api/upload", files={"files": ("big.json", b"x" * (65 * MB), "application/json")}, timeout=120)
    assert over.status_code == 413


def _open_file(web: WebDriver, path) -> None:
    clear = web.page.locator("#ro-file button[aria-label*='lear']")
    if clear.count():
        clear.first.click()
    web.page.locator("#ro-file input[type=file]").set_input_files(str(path))


def _title_says(web: WebDriver, text: str, timeout_ms: int = 60_000) -> None:
    web.page.wait_for_function("(t) => document.querySelector('#ro-title')?.innerText.includes(t)", arg=text, timeout=timeout_ms)


def test_result_files_up_to_the_limit_open_and_every_bad_one_says_why(chromium, web_server, tmp_path):
    from tests.server.web.test_result_file import amplifying

    big = tmp_path / "big.json"
    big.write_text(RolloutResult(rollout_id="big", harness="pi", reward=1.0, files={"big.txt": "x" * (40 * MB)}).model_dump_json())
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    compact = tmp_path / "amp.json"
    compact.write_text(json.dumps(amplifying(), separators=(",", ":")))
    shape = tmp_path / "shape.json"
    shape.write_text('{"rollout_id": "r", "harness": "pi", "reward": "lots"}')
    over = tmp_path / "over.json"
    over.write_bytes(b" " * (64 * MB + 1))
    web = WebDriver(chromium, server_url := web_server[0].url)
    try:
        web.open()
        open_rollouts(web)
        _open_file(web, big)
        _title_says(web, "big.json, result 1 of 1", 120_000)
        ro_reward(web, "1.0")
        for path, said in [
            (deep, "could not open deep.json: the file is nested more than 100 levels deep"),
            (compact, "could not open amp.json: the file is too big to show here: expanded from its compact form"),
            (shape, "could not open shape.json: the file is not a RolloutResult: reward"),
            (over, "could not open over.json: the file has 67,108,865 bytes; at most 67,108,864 are opened here; open it in Python instead"),
        ]:
            _open_file(web, path)
            _title_says(web, said)
            assert web.page.locator("#ro-reward .he-reward").get_attribute("data-reward") == ""
        assert httpx.get(server_url + "/health").json()["status"] == "healthy"
    finally:
        web.close()


# Elements the agent's text must never become, in any pane (the grading tab's own data: PNGs aside).
MARKUP_FROM_TEXT = """() => {
  const found = [];
  for (const el of document.querySelectorAll('img, video, audio, iframe, form, input[name=token], a[href], source, object, embed')) {
    const src = el.getAttribute('src') || el.getAttribute('href') || el.getAttribute('action') || el.getAttribute('data') || '';
    if (src.includes('203.0.113.9') || el.matches('form, input[name=token]') || el.closest('#ro-conversation, #ro-summary, #ro-title, #ro-list'))
      found.push(el.outerHTML.slice(0, 120));
  }
  return found;
}"""


def test_the_agents_text_shows_as_text_in_every_pane(chromium, web_server, tmp_path):
    """A rollout whose model, tools, files, verify output and task id are all markup (images, video,
    a fake token form, links, Markdown images, autolinks, LaTeX): a person viewing it sees the
    text, and the page asks nothing of the outside."""
    from tests.server.web.test_render import EVIL, HOSTILE, _hostile_result

    server, policy_server = web_server
    rid = submit(server, policy_server, "ro-hostile", PASS, f"<img src=http://{EVIL}/t.png>![t](http://{EVIL}/t2.png)")
    wait_ended(server, rid)
    hostile = tmp_path / "hostile.json"
    hostile.write_text(_hostile_result().model_dump_json())
    web = WebDriver(chromium, server.url)
    try:
        web.open()
        open_rollouts(web)
        web.page.wait_for_function("(id) => document.querySelector('#ro-list')?.innerText.includes(id)", arg=rid, timeout=30_000)
        assert f"<img src=http://{EVIL}/t.png>" in web.page.inner_text("#ro-list")  # the task id, as text
        _open_file(web, hostile)
        _title_says(web, "hostile.json, result 1 of 1")
        for tab in ("conversation", "verify", "files", "logprobs", "JSON"):
            web.page.get_by_role("tab", name=tab).click()
            web.page.wait_for_timeout(300)
        web.page.get_by_role("tab", name="conversation").click()
        shown = web.page.inner_text("#ro-conversation")
        assert "Re-enter your token" in shown and f"![x](http://{EVIL}/m.png)" in shown and f'<img src="http://{EVIL}/i.png">' in shown
        assert f"$$\\href{{http://{EVIL}}}{{x}}$$" in shown  # not typeset
        assert HOSTILE.splitlines()[0][:200] in web.page.inner_text("#ro-summary")
        assert web.page.evaluate(MARKUP_FROM_TEXT) == []
        assert web.foreign_requests == [], "the page asked an outside host for something the agent wrote"
    finally:
        web.close()
    server.assert_no_rollout_left()


def test_cancel_a_running_rollout_then_load_it_into_the_form_and_run_it_again(chromium, web_server):
    server, policy_server = web_server
    running = submit(server, policy_server, "ro-again", HANG, "task-again")
    web = WebDriver(chromium, server.url)
    try:
        web.page.goto(f"{server.url}/web/?rollout={running}", timeout=LOAD_TIMEOUT_MS)
        web.page.wait_for_selector("#ro-cancel", state="visible", timeout=60_000)
        # The request it was sent with: task, harness, endpoint (never its key), the options set.
        web.page.locator("#ro-request summary").click()
        request = web.page.inner_text("#ro-request")
        assert "task-again" in request and "whitebox" in request and policy_server.base_url in request
        assert "agent_timeout_s" in request and "its key is never stored" in request
        web.page.click("#ro-cancel")
        web.page.wait_for_function("document.querySelector('#ro-status')?.innerText.includes('cancelled')", timeout=60_000)
        web.page.wait_for_selector("#ro-cancel", state="hidden", timeout=10_000)
        assert httpx.get(f"{server.url}/rollouts/{running}").json()["status"] == "cancelled"

        web.page.click("#ro-rerun")
        web.page.wait_for_function("document.querySelector('#task-id textarea, #task-id input')?.value === 'task-again'", timeout=30_000)
        assert web.page.locator("#instruction textarea").input_value() == "Create hello.txt containing hello."
        assert web.page.locator("#verify textarea").input_value() == "grep -qx hello hello.txt"
        assert web.page.locator("#base-url textarea").input_value() == policy_server.base_url
        assert web.page.locator("#model textarea").input_value() == "ro-again"
        assert web.page.locator("#harness input").input_value().startswith("whitebox")
        assert "loaded from rollout" in web.page.inner_text("#status")
        policy_server.policy.scripts["ro-again"] = PASS  # this time the agent finishes
        web.run()
        web.wait_reward("1.0")
        web.wait_idle()
        again = httpx.get(f"{server.url}/rollouts", params={"task_id": "task-again"}).json()["items"]
        assert [i["status"] for i in again] == ["finished", "cancelled"]
    finally:
        web.close()
