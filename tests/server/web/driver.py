"""Drives the /web page as a person would: fills the form, runs, reads the results."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from playwright.sync_api import Browser, Page

# Records every distinct state of the live log and the reward, as the page shows them, so a test
# can tell what was on screen before the result arrived.
RECORDER = """() => {
  window.__snaps = [];
  let last = null;
  const tick = () => {
    const log = document.querySelector('#phase-log textarea');
    const reward = document.querySelector('#reward .he-reward');
    const snap = {log: log ? log.value : '', reward: reward ? reward.dataset.reward : ''};
    const key = snap.log + '|' + snap.reward;
    if (key !== last) { last = key; window.__snaps.push(snap); }
    requestAnimationFrame(tick);
  };
  tick();
}"""
LOAD_TIMEOUT_MS = 90_000  # the first request to /web loads Gradio (about 10 s of CPU)


class WebDriver:
    def __init__(self, browser: Browser, base_url: str) -> None:
        self.base_url = base_url
        self.context = browser.new_context(viewport={"width": 1400, "height": 1800}, accept_downloads=True)
        self.page: Page = self.context.new_page()
        self.foreign_requests: list[str] = []
        host = urlsplit(base_url).hostname
        self.page.on(
            "request",
            lambda r: (
                self.foreign_requests.append(r.url) if urlsplit(r.url).hostname not in (host, None) and not r.url.startswith(("data:", "blob:")) else None
            ),
        )

    def close(self) -> None:
        self.context.close()

    def open(self) -> None:
        self.page.goto(self.base_url + "/web/", timeout=LOAD_TIMEOUT_MS)
        self.page.wait_for_selector("#run", timeout=LOAD_TIMEOUT_MS)
        # The harness list arrives with the page's load event.
        self.page.wait_for_function("document.querySelector('#harness input')?.value !== ''")

    def login(self, token: str) -> None:
        self.page.goto(self.base_url + "/web/", timeout=LOAD_TIMEOUT_MS)
        self.page.wait_for_selector("#token")
        self.page.fill("#token", token)
        self.page.click("#sign-in")
        self.page.wait_for_selector("#run", timeout=LOAD_TIMEOUT_MS)
        self.page.wait_for_function("document.querySelector('#harness input')?.value !== ''")

    def choose(self, elem_id: str, option: str | re.Pattern) -> None:
        self.page.locator(f"#{elem_id} input").click()
        self.page.get_by_role("option", name=option).click()

    def explicit_endpoint(self, base_url: str, model: str, key: str = "") -> None:
        self.page.locator("#base-url textarea").fill(base_url)
        self.page.locator("#model textarea").fill(model)
        if key:
            self.page.locator("#api-key input").fill(key)

    def load_example(self, name: str) -> None:
        if self.page.locator("#example input").input_value() == name:  # loaded already (the page opens with the first)
            return
        before = self.page.locator("#instruction textarea").input_value()
        self.choose("example", name)
        self.page.wait_for_function("(b) => { const v = document.querySelector('#instruction textarea')?.value; return v && v !== b; }", arg=before)

    def run(self) -> None:
        self.page.evaluate(RECORDER)
        self.page.click("#run")

    def wait_reward(self, value: str, timeout_ms: int = 90_000) -> None:
        self.page.wait_for_selector(f"#reward .he-reward[data-reward='{value}']", timeout=timeout_ms)

    def wait_idle(self) -> None:
        """The run is over: Run can be pressed again."""
        self.page.wait_for_function("document.querySelector('#run')?.disabled === false")

    def snapshots(self) -> list[dict]:
        return self.page.evaluate("window.__snaps")

    def log(self) -> str:
        return self.page.locator("#phase-log textarea").input_value()

    def tab(self, name: str) -> None:
        self.page.get_by_role("tab", name=name).click()
