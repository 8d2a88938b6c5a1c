"""/web in real headless Chromium, against a server process running rollouts on the scripted policy."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest

from tests import needs
from tests.server.web.driver import WebDriver

pytestmark = pytest.mark.e2e
WRITE = [{"bash": "echo hello > hello.txt"}, {"text": "done"}]
KEY = "sk-web-test-upstream-key-8c1f"
PHASES = ("setup", "agent", "verify", "collect")
REPO = Path(__file__).resolve().parents[3]


def _phases_in(log: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^\s*[\d.]+s\s+(\w+)", log, re.M)}


def test_write_a_file_with_pi_live_log_logprob_plot_and_download(chromium, web_server, artifacts):
    server, policy_server = web_server
    policy_server.policy.scripts["m"] = WRITE
    sent_before = len(policy_server.policy.sent)
    web = WebDriver(chromium, server.url)
    try:
        web.open()
        web.explicit_endpoint(policy_server.base_url, "m", KEY)
        web.choose("harness", re.compile(r"^pi\b"))
        web.load_example("write a file")
        web.run()
        web.wait_reward("1.0")
        web.wait_idle()

        # The live log showed each phase before the result arrived, and elapsed time with it.
        before_end = [s["log"] for s in web.snapshots() if s["reward"] == ""]
        seen_live = set().union(*(_phases_in(log) for log in before_end))
        assert set(PHASES) <= seen_live, before_end
        assert any("model call 0" in log and "verify" not in _phases_in(log) for log in before_end), "no model call shown while the agent ran"
        final_log = web.log()
        assert _phases_in(final_log) >= {"endpoint", "sandbox", *PHASES, "done"}
        assert re.search(r"finished · \d+\.\d s", web.page.inner_text("#status"))

        verify_table = web.page.inner_text("#verify-results")
        assert "grep -qx hello hello.txt" in verify_table and "0" in verify_table
        web.tab("files")
        assert "hello.txt" in web.page.inner_text("#files-out")
        web.tab("conversation")
        assert "tool call: bash" in web.page.inner_text("#conversation")

        # One point per completion token the proxy captured, each with the token in its tooltip.
        result = json.loads(_download(web))
        tokens = sum(len(t["completion_token_ids"]) for t in result["proxy_turns"])
        sent = [s.completion_token_ids for s in policy_server.policy.sent[sent_before:]]
        assert tokens > 0 and all(t["completion_token_ids"] in sent for t in result["proxy_turns"])
        web.tab("logprobs")
        assert web.page.locator("#logprob-plot svg circle.he-token").count() == tokens
        assert "logprob" in web.page.locator("#logprob-plot circle.he-token title").first.text_content()
        assert "mean logprob" in web.page.inner_text("#logprob-summary")
        web.page.screenshot(path=str(artifacts / "web-logprobs.png"), full_page=True)
        web.tab("verify")
        web.page.screenshot(path=str(artifacts / "web-finished.png"), full_page=True)

        assert result["reward"] == 1.0 and result["harness"] == "pi" and result["capture_level"] == "tokens"
        assert KEY not in json.dumps(result)
        assert KEY not in web.page.content()
        assert web.page.locator("#history [role=grid]").get_attribute("aria-rowcount") == "2"
        assert web.foreign_requests == [], "the page loaded something from outside the server"
    finally:
        web.close()
    server.assert_no_rollout_left()
    assert KEY not in server.log_path.read_text()
    if os.environ.get("HARNESS_ENV_UPDATE_SCREENSHOT"):  # refresh the README's picture
        shutil.copy(artifacts / "web-logprobs.png", REPO / "docs" / "web.png")


IN_VIEW = "(sel) => { const r = document.querySelector(sel).getBoundingClientRect(); return r.height > 0 && r.top >= 0 && r.bottom <= innerHeight; }"


def test_run_is_above_the_fold_and_its_live_log_beside_it(chromium, web_server):
    """At 1440 x 857 the Run button shows without scrolling, and a click changes what is beside it:
    the status and the live log, where the person who clicked is looking."""
    server, policy_server = web_server
    policy_server.policy.scripts["fold"] = [{"hang": 3, "bash": "echo hello > hello.txt"}, {"text": "done"}]
    web = WebDriver(chromium, server.url)
    web.page.set_viewport_size({"width": 1440, "height": 857})
    try:
        web.open()
        assert web.page.evaluate("scrollY") == 0 and web.page.evaluate(IN_VIEW, "#run")
        web.explicit_endpoint(policy_server.base_url, "fold")
        web.choose("harness", re.compile(r"^whitebox\b"))
        web.page.evaluate("scrollTo(0, 0)")
        web.run()
        web.page.wait_for_function("document.querySelector('#phase-log textarea')?.value.includes('setup')", timeout=60_000)
        assert "running" in web.page.inner_text("#status")
        assert web.page.evaluate("scrollY") == 0
        assert web.page.evaluate(IN_VIEW, "#status") and web.page.evaluate(IN_VIEW, "#phase-log")
        web.wait_reward("1.0")
        web.wait_idle()
    finally:
        web.close()


def _download(web: WebDriver) -> str:
    web.tab("JSON")
    with web.page.expect_download() as info:
        web.page.click("#download")
    return Path(info.value.path()).read_text()


def test_cancel_stops_a_long_rollout_and_leaves_nothing_behind(chromium, web_server, artifacts):
    server, policy_server = web_server
    policy_server.policy.scripts["slow"] = [{"hang": 120}]
    web = WebDriver(chromium, server.url)
    try:
        web.open()
        web.explicit_endpoint(policy_server.base_url, "slow")
        web.choose("harness", re.compile(r"^pi\b"))
        web.load_example("write a file")
        web.run()
        web.page.wait_for_function("document.querySelector('#phase-log textarea')?.value.includes('agent    started')", timeout=60_000)
        assert httpx.get(server.url + "/health").json()["rollouts_running"] == 1
        time.sleep(0.5)  # the harness is up and waiting on the model
        web.page.click("#cancel")
        web.page.wait_for_function("document.querySelector('#status')?.innerText.includes('cancelled')", timeout=30_000)
        assert web.page.inner_text("#reward").strip().endswith("cancelled")
        assert "cancelled" in web.log()
        web.page.wait_for_function("document.querySelector('#history')?.innerText.includes('cancelled')", timeout=10_000)
        web.page.screenshot(path=str(artifacts / "web-cancelled.png"), full_page=True)
    finally:
        web.close()
    server.assert_no_rollout_left()


def test_the_first_visit_shows_a_loading_page_then_the_form(chromium, start_server):
    server = start_server()  # a fresh server: Gradio is not loaded yet
    web = WebDriver(chromium, server.url)
    try:
        web.page.goto(server.url + "/web/")
        assert "first visit" in web.page.inner_text("#web-loading")  # the loading page, not a blank tab until Gradio is up
        web.page.wait_for_selector("#run", timeout=90_000)  # it reloads itself into the page
        web.page.wait_for_function("document.querySelector('#harness input')?.value !== ''")
        assert web.foreign_requests == []
    finally:
        web.close()


def test_auth_on_asks_for_the_token_once(chromium, start_server, policy_server, artifacts):
    policy_server.policy.scripts["m"] = WRITE
    server = start_server(env={"HARNESS_ENV_TOKEN": "web-s3cret"})
    assert httpx.get(server.url + "/web/", follow_redirects=False).status_code == 303
    assert httpx.get(server.url + "/web/config").status_code == 401
    web = WebDriver(chromium, server.url)
    try:
        web.page.goto(server.url + "/web/")
        web.page.fill("#token", "wrong")
        web.page.click("#sign-in")
        assert "wrong token" in web.page.inner_text("body")
        web.login("web-s3cret")
        cookies = web.context.cookies()
        assert [c["name"] for c in cookies] == ["harness_env_web"] and "web-s3cret" not in cookies[0]["value"]
        assert cookies[0]["httpOnly"] and cookies[0]["path"] == "/web"
        web.explicit_endpoint(policy_server.base_url, "m")
        web.choose("harness", re.compile(r"^pi\b"))
        web.load_example("write a file")
        web.run()
        web.wait_reward("1.0")
        web.page.reload()  # the cookie holds: no second prompt (the history is per page session)
        web.page.wait_for_selector("#run", timeout=60_000)
        assert web.page.locator("#token").count() == 0
    finally:
        web.close()
    server.assert_no_rollout_left()


def test_history_click_reopens_an_earlier_rollout(chromium, web_server):
    server, policy_server = web_server
    policy_server.policy.scripts["m"] = WRITE
    web = WebDriver(chromium, server.url)
    try:
        web.open()
        # The page opens with the first example loaded: Run works at once.
        assert web.page.locator("#example input").input_value() == "write a file"
        assert "hello.txt" in web.page.locator("#instruction textarea").input_value()
        assert web.page.locator("#file-path-0 textarea").input_value() == "README.md"
        web.explicit_endpoint(policy_server.base_url, "m")
        web.choose("harness", re.compile(r"^pi\b"))
        web.run()
        web.wait_reward("1.0")
        web.wait_idle()
        first_log, first_status = web.log(), web.page.inner_text("#status")
        web.load_example("a task that fails on purpose")
        web.run()
        web.wait_reward("0.0")
        assert "he-fail" in web.page.locator("#reward .he-reward").get_attribute("class")
        web.wait_idle()
        assert web.page.locator("#history [role=grid]").get_attribute("aria-rowcount") == "3"  # the header and 2 rollouts
        second_log = web.log()
        assert second_log != first_log
        web.page.click("#history [data-testid='cell-1-1']")  # newest first: the first rollout
        web.wait_reward("1.0", timeout_ms=15_000)
        # Its own log, status and form come back with its result.
        web.page.wait_for_function("(l) => document.querySelector('#phase-log textarea')?.value === l", arg=first_log, timeout=15_000)
        assert web.page.inner_text("#status").startswith(first_status.strip())
        assert "hello.txt" in web.page.locator("#instruction textarea").input_value()
        assert web.page.locator("#verify textarea").input_value() == "test -f hello.txt\ngrep -qx hello hello.txt"
        assert web.page.locator("#file-path-0 textarea").input_value() == "README.md"
        web.page.click("#history [data-testid='cell-0-1']")  # and back to the second
        web.wait_reward("0.0", timeout_ms=15_000)
        web.page.wait_for_function("(l) => document.querySelector('#phase-log textarea')?.value === l", arg=second_log, timeout=15_000)
        assert "secret number" in web.page.locator("#instruction textarea").input_value()
        assert web.page.locator("#file-path-0 textarea").input_value() == ""

        # A run refused before it starts leaves no earlier result or log on screen, and says what
        # is missing in the words of the harness chosen.
        web.page.locator("#instruction textarea").fill("")
        web.run()
        web.page.wait_for_function("document.querySelector('#status')?.innerText.includes('not started')", timeout=30_000)
        status = web.page.inner_text("#status")
        assert "pi" in status and "harbor" not in status.lower(), status
        assert web.page.locator("#reward .he-reward").get_attribute("data-reward") == ""
        assert web.log() == "" and web.page.inner_text("#verify-results").strip() == ""
    finally:
        web.close()
    server.assert_no_rollout_left()


def test_a_long_rollout_ended_by_the_turn_limit(chromium, web_server, artifacts):
    """Many model calls: the log follows its newest line, the end names the turn limit, the token
    view shows every token, the JSON stays collapsed, and tabs with nothing to show stay hidden."""
    server, policy_server = web_server
    policy_server.policy.scripts["long"] = [{"bash": f"echo step {i}"} for i in range(40)] + [{"text": "done"}]
    web = WebDriver(chromium, server.url)
    try:
        web.open()
        web.explicit_endpoint(policy_server.base_url, "long")
        web.choose("harness", re.compile(r"^pi\b"))
        web.page.locator("#max-turns input").fill("24")
        web.run()
        web.wait_reward("0.0", timeout_ms=240_000)
        web.wait_idle()
        assert "the turn limit ended it after 24 model call(s)" in web.page.inner_text("#reward")

        log = web.page.locator("#phase-log textarea")
        assert log.input_value().count("\n") > 30
        web.page.wait_for_function(
            "(() => { const t = document.querySelector('#phase-log textarea');"
            " return t.scrollHeight > t.clientHeight + 20 && t.scrollTop + t.clientHeight >= t.scrollHeight - 4; })()",
            timeout=10_000,
        )

        verify = web.page.inner_text("#verify-results")
        assert "no stdout" in verify and "no stdoutno stderr" not in verify
        assert web.page.inner_text("#history").count("finished") == 1
        headers = web.page.inner_text("#history [role=grid] thead") if web.page.locator("#history thead").count() else web.page.inner_text("#history")
        assert "error kind" in headers
        for name in ("grading", "harbor"):  # a Pi shell task has no grading and no Harbor trial
            assert not web.page.get_by_role("tab", name=name, exact=True).is_visible()

        web.tab("logprobs")
        points = web.page.locator("#logprob-plot circle.he-token").count()
        labels = web.page.locator("#logprob-plot text.he-turn-label")
        assert 0 < labels.count() < 24
        web.page.screenshot(path=str(artifacts / "web-long-logprobs.png"), full_page=True)
        web.tab("tokens")
        tokens = web.page.locator("#token-view span.he-tok")
        assert tokens.count() == points > 0
        assert re.match(r"id \d+ · logprob -?\d", tokens.first.get_attribute("title"))
        assert web.page.locator("#token-view details.he-tcall").count() == 24

        web.tab("JSON")
        assert web.page.locator("#download").is_visible()
        assert not web.page.locator("#result-json pre").is_visible()  # collapsed until asked for
        assert web.page.evaluate("document.documentElement.scrollHeight") < 6000
        web.page.locator("#result-json summary").click()
        assert '"reward": 0.0' in web.page.locator("#result-json pre").inner_text()
    finally:
        web.close()
    server.assert_no_rollout_left()


def test_harbor_nop_runs_the_form_task_as_a_harbor_trial(chromium, web_server, artifacts):
    """harness=harbor, agent nop, the uniform task of the form: a real Harbor trial in the local
    (bubblewrap) sandbox of the server; the Harbor inputs show only for harness harbor."""
    needs.module("harbor.trial.trial", "uv sync --extra harbor")
    needs.bwrap()
    server, policy_server = web_server
    web = WebDriver(chromium, server.url)
    try:
        web.open()
        web.explicit_endpoint(policy_server.base_url, "m")  # nop calls no model; the endpoint is still checked
        web.choose("harness", re.compile(r"^pi\b"))
        assert web.page.locator("#harbor-fields").is_hidden()
        web.choose("harness", re.compile(r"^harbor\b"))
        web.page.wait_for_selector("#harbor-fields", state="visible")
        assert web.page.locator("#harbor-agent input").input_value() == "pi"
        assert web.page.locator("#harbor-sandbox input").input_value() == "local"
        assert "HARNESS_ENV_HARBOR_TASKS_DIR" in web.page.inner_text("#harbor-fields")
        web.choose("harbor-agent", re.compile(r"^nop$"))
        web.page.locator("#instruction textarea").fill("do nothing")
        web.page.locator("#verify textarea").fill("true")
        # An agent option that could name a server file is refused before anything starts.
        web.page.locator("#harbor-agent-kwargs textarea").fill('{"prompt_template_path": "/etc/passwd"}')
        web.run()
        web.page.wait_for_function("document.querySelector('#status')?.innerText.includes('not started')", timeout=30_000)
        assert "not accepted from remote callers" in web.page.inner_text("#status")
        web.page.locator("#harbor-agent-kwargs textarea").fill("")
        web.run()
        # The first Harbor trial of a server process imports Harbor and LiteLLM (about 10 s).
        web.wait_reward("1.0", timeout_ms=150_000)
        web.wait_idle()
        harbor = web.page.locator("#harbor-info")  # the harbor tab opens with the result
        agent = harbor.locator('[data-fact="agent"] td')  # Harbor's result_facts, as the page shows a harness's facts
        agent.wait_for()
        assert re.fullmatch(r"nop( \S+)?", agent.inner_text())
        facts = harbor.inner_text()
        assert re.search(r"sandbox\s+local", facts) and re.search(r"exception\s+none", facts), facts
        assert "no agent trajectory" in facts  # nop writes none
        assert "harbor" in web.page.inner_text("#summary")
        web.page.screenshot(path=str(artifacts / "web-harbor.png"), full_page=True)
        web.choose("harness", re.compile(r"^pi\b"))
        web.page.wait_for_selector("#harbor-fields", state="hidden")
        assert web.foreign_requests == []
    finally:
        web.close()
    server.assert_no_rollout_left()
