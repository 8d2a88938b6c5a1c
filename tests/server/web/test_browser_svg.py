"""/web with the svg_icon family in real headless Chromium: a server process whose judge is the
scripted fake judge and whose reference directory holds a reference PNG; the scripted policy
writes icon.svg through Pi's shell tool."""

from __future__ import annotations

import base64
import re

import pytest
import resvg_py

from tests.fakes.judge import FakeJudge, FakeJudgeServer
from tests.server.web.driver import WebDriver

pytestmark = pytest.mark.e2e
RED_SQUARE = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 100 100"><rect x="20" y="20" width="60" height="60" fill="#e00"/></svg>'
DIMENSIONS = ["semantic_match", "composition", "geometry", "style", "aesthetics"]


def test_draw_an_icon_shows_the_rendered_icon_reference_and_judge_scores(chromium, start_server, policy_server, tmp_path, artifacts):
    refs = tmp_path / "refs"
    refs.mkdir()
    reference = resvg_py.svg_to_bytes(svg_string=RED_SQUARE, width=256, height=256, background="#ffffff")
    (refs / "red-square.png").write_bytes(bytes(reference))
    policy_server.policy.scripts["m"] = [{"bash": f"cat > icon.svg <<'EOF'\n{RED_SQUARE}\nEOF"}, {"text": "done"}]
    judge = FakeJudge(expect_images=2)  # the candidate and the reference; default score 0.8 on every dimension
    with FakeJudgeServer(judge) as judge_server:
        server = start_server(
            env={"HARNESS_ENV_JUDGE_BASE_URL": judge_server.base_url, "HARNESS_ENV_JUDGE_MODEL": "judge-vl", "HARNESS_ENV_REFERENCE_DIR": str(refs)}
        )
        web = WebDriver(chromium, server.url)
        try:
            web.open()
            web.explicit_endpoint(policy_server.base_url, "m")
            web.choose("harness", re.compile(r"^pi\b"))
            assert not web.page.locator("#svg_icon-fields").is_visible() and web.page.locator("#verify").is_visible()
            web.load_example("draw an icon (svg_icon)")
            web.page.wait_for_selector("#svg_icon-fields", state="visible")
            assert web.page.locator("#verify").is_hidden()
            assert web.page.locator("#instruction textarea").input_value() == "a red square on white"
            assert '"semantic_match"' in web.page.locator("#svg_icon-rubric textarea").get_attribute("placeholder")  # blank: the default
            web.page.locator("#svg_icon-renderer").get_by_label("resvg").check()
            web.page.locator("#svg_icon-reference-png textarea").fill("red-square.png")
            web.run()
            web.wait_reward("0.8")
            web.wait_idle()

            web.tab("grading")
            grading = web.page.locator("#grading")
            rendered = grading.locator("img.he-rendered")
            rendered.wait_for()
            src = rendered.get_attribute("src")
            assert src.startswith("data:image/png;base64,") and base64.b64decode(src.split(",", 1)[1]) in judge.images[0]
            assert grading.locator("img.he-reference").get_attribute("src") == "data:image/png;base64," + base64.b64encode(reference).decode()
            assert web.page.evaluate("[...document.querySelectorAll('#grading img')].every(i => i.complete && i.naturalWidth > 0)")
            rows = grading.locator("table.he-scores tbody tr")
            assert [rows.nth(i).get_attribute("data-dimension") for i in range(rows.count())] == DIMENSIONS
            assert all(rows.nth(i).locator("td").nth(1).inner_text() == "0.8" for i in range(rows.count()))
            assert grading.locator(".he-judge-reward").inner_text() == "0.8"
            text = grading.inner_text()
            assert "resvg" in text and "judge-vl" in text and "raw judge answer" in text
            assert str(refs) not in web.page.content()  # the server-side path never reaches the page
            web.page.screenshot(path=str(artifacts / "web-svg-icon.png"), full_page=True)
            # The stored rollout's page shows the same evidence, the reference image with it.
            web.page.get_by_role("tab", name="Rollouts").click()
            web.page.click("#ro-list [data-testid='cell-0-1']", timeout=30_000)
            stored = web.page.locator("#ro-grading")
            stored.locator("img.he-reference").wait_for(timeout=30_000)
            assert stored.locator("img.he-reference").get_attribute("src") == grading.locator("img.he-reference").get_attribute("src")
            assert stored.locator(".he-judge-reward").inner_text() == "0.8"
            assert judge.calls == 1 and judge.problems == []
            assert web.foreign_requests == []
        finally:
            web.close()
        server.assert_no_rollout_left()
