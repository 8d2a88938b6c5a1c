"""The token view: a rollout's trajectory as a trainer sees it (what is trained, what is prompt and
tool output, the turn graph's branches and links), escaped, bounded on a long rollout."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from harness_env.core.capture.graph import link_turns, summarise_rows
from harness_env.models import RolloutResult, TopLogprob, Turn
from harness_env.server.web.render_tokens import token_title, trajectory_tokens_html
from tests.server.web.driver import LOAD_TIMEOUT_MS, WebDriver

REPO = Path(__file__).resolve().parents[3]

SYS = {"role": "system", "content": "You are an agent."}
USER = {"role": "user", "content": "Write a.txt"}
CALL = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "echo hi > a.txt"}'}}
ANSWER = {"role": "assistant", "content": None, "tool_calls": [CALL]}
TOOL = {"role": "tool", "tool_call_id": "c1", "content": "<b>wrote a.txt</b>"}


def _turn(index, msgs, prompt, ids, tokens, logps, purpose="policy", tool_calls=(), text=""):
    return Turn(
        index=index,
        purpose=purpose,
        request_messages=msgs,
        prompt_token_ids=prompt,
        completion_token_ids=ids,
        completion_tokens=tokens,
        per_token_logps=logps,
        tool_calls=list(tool_calls),
        completion_text=text,
        upstream_status=200,
        capture_level="tokens",
    )


def _result() -> RolloutResult:
    """Call 0 runs a tool; call 1 is auxiliary (a title); call 2 continues call 0 after the tool's
    output; call 3 compacts the history (same system prompt, a summary): a second branch."""
    turns = [
        _turn(0, [SYS, USER], [1, 2, 3], [4, 5], ['{"c', "md"], [-0.1, -2.5], tool_calls=[CALL]),
        _turn(1, [{"role": "user", "content": "title?"}], [9, 9], [7], ["Title"], [-0.2], purpose="auxiliary"),
        _turn(2, [SYS, USER, ANSWER, TOOL], [1, 2, 3, 4, 5, 10, 11, 12], [6], ["done"], [-0.05], text="done"),
        _turn(3, [SYS, {"role": "user", "content": "summary: a.txt written"}], [1, 20], [8], ["ok"], [-0.3], text="ok"),
    ]
    result = RolloutResult(reward=1.0, harness="pi", proxy_turns=turns, capture_level="tokens")
    result.graph = summarise_rows(link_turns(result.proxy_turns), result.training_rows())
    return result


def _calls(html: str) -> list[dict[str, str]]:
    return [dict(re.findall(r'data-(\w+)="([^"]*)"', m)) for m in re.findall(r'<details class="he-tcall"([^>]*)>', html)]


def test_every_call_in_order_with_its_branch_link_and_whether_it_is_trained():
    html = trajectory_tokens_html(_result())
    calls = _calls(html)
    assert [(c["turn"], c["branch"], c["link"], c["trained"]) for c in calls] == [
        ("0", "0", "new_thread", "1"),
        ("1", "", "auxiliary", "0"),
        ("2", "0", "extends", "1"),
        ("3", "1", "compaction", "1"),
    ]
    summaries = re.findall(r"<summary>(.*?)</summary>", html)
    assert "call 2 · policy · branch 0 · continues call 0 · +3 prompt and tool tokens · 1 sampled tokens, trained (loss mask 1)" in summaries[2]
    assert "compacts the history of call 2" in summaries[3] and "+2 prompt and tool tokens" in summaries[3]
    assert "not trained: an auxiliary call" in summaries[1]
    # The graph: two branches, each a trained row, and the links by kind.
    assert "4 model call(s) · 2 branch(es) · 1 auxiliary" in html
    assert '<li data-branch="0">branch 0: call(s) 0, 2 · trained: 3 sampled tokens (loss mask 1) of 9</li>' in html


def test_prompt_and_tool_tokens_apart_from_the_sampled_ones():
    html = trajectory_tokens_html(_result())
    third = html.split('<details class="he-tcall" data-turn="2"')[1].split("</details>")[0]
    prompt, sampled = third.split('<div class="he-tokens')
    # What is new in call 2's prompt is the tool's output (the replayed answer is call 0's), escaped.
    assert 'data-role="tool"' in prompt and "&lt;b&gt;wrote a.txt&lt;/b&gt;" in prompt and "You are an agent" not in prompt
    assert 'data-mask="0"' in prompt and "<b>" not in third
    assert sampled.startswith(' he-trained" data-mask="1"') and re.findall(r'<span class="he-tok"[^>]*>([^<]*)</span>', sampled) == ["done"]
    # The first call shows its whole prompt, and its tokens coloured by logprob: the unlikely one redder.
    first = html.split('<details class="he-tcall" data-turn="0"')[1].split("</details>")[0]
    assert "You are an agent" in first and "Write a.txt" in first
    hues = [int(h) for h in re.findall(r"background: hsl\((\d+),", first)]
    assert len(hues) == 2 and hues[1] < hues[0]


def test_an_untrainable_branch_says_why_and_its_tokens_are_not_marked_trained():
    result = _result()
    result.proxy_turns[2].per_token_logps = []  # a call without logprobs: its branch is no row to train on
    html = trajectory_tokens_html(result)
    assert [c["trained"] for c in _calls(html)] == ["0", "0", "0", "1"]
    assert "not trained: turn 2 has 0 logprobs for 1 tokens" in html


def test_hover_shows_id_logprob_and_alternatives():
    turn = _result().proxy_turns[0].model_copy(update={"top_logprobs": [[TopLogprob(token="<b>", logprob=-1.2, token_id=9)], []]})
    assert token_title(turn, 0) == "id 4 · logprob -0.1000 (p 0.905)\nalternatives:\n'<b>' (id 9): -1.2000"
    assert token_title(turn, 1) == "id 5 · logprob -2.5000 (p 0.082)"


def test_a_40_call_rollout_stays_light_collapsed_but_the_first_and_last_and_bounded():
    turns, prompt = [], [1]
    for i in range(40):
        ids = list(range(100 + i * 1000, 100 + i * 1000 + 600))
        turns.append(_turn(i, [USER] + [{"role": "tool", "content": f"out {k}"} for k in range(i)], list(prompt), ids, [f"t{k} " for k in ids], [-0.5] * 600))
        prompt = prompt + ids + [7]
    result = RolloutResult(reward=0.0, harness="pi", proxy_turns=turns, capture_level="tokens")
    result.graph = summarise_rows(link_turns(result.proxy_turns), result.training_rows())
    html = trajectory_tokens_html(result, call_limit=500, limit=8_000)
    assert len(_calls(html)) == 40 and all(c["trained"] == "1" for c in _calls(html))
    opened = re.findall(r'<details class="he-tcall" data-turn="(\d+)"[^>]* open>', html)
    assert opened == ["0", "39"]
    assert html.count('class="he-tok"') == 8_000  # 16 calls of 500, then the rest name what is left out
    assert "100 more tokens in the JSON download" in html and "600 more tokens in the JSON download" in html


def test_nothing_captured_says_so():
    assert "no tokens were captured" in trajectory_tokens_html(RolloutResult(harness="pi"))


LONG_WORD = "x" * 600  # one run of tokens with no space in it: nowhere to wrap but between tokens


@pytest.mark.e2e
def test_token_view_of_a_40_call_rollout_in_chromium(chromium, web_server, artifacts):
    """A stored 41-call rollout's token view: every call, collapsed but the first and last, each
    with its branch and link; what was trained apart from the prompt; nothing runs off the page."""
    from tests.server.web.test_rollouts_view import submit, wait_ended

    server, policy_server = web_server
    script = [{"bash": f"echo {LONG_WORD}"}] + [{"bash": f"echo step {i}"} for i in range(39)] + [{"text": "done"}]
    rollout = submit(server, policy_server, "tokens-40", script, "task-tokens")
    assert wait_ended(server, rollout)["status"] == "finished"
    web = WebDriver(chromium, server.url)
    web.page.set_viewport_size({"width": 1440, "height": 900})
    try:
        web.page.goto(f"{server.url}/web/?rollout={rollout}", timeout=LOAD_TIMEOUT_MS)
        web.page.wait_for_selector("#ro-reward .he-reward[data-reward='0.0'], #ro-reward .he-reward[data-reward='1.0']", timeout=60_000)
        web.page.locator("#rollouts-tab").get_by_role("tab", name="tokens").click()
        calls = web.page.locator("#ro-token-view details.he-tcall")
        calls.first.wait_for()
        assert calls.count() == 41
        assert [calls.nth(i).get_attribute("data-link") for i in (0, 1, 40)] == ["new_thread", "extends", "extends"]
        assert {calls.nth(i).get_attribute("data-branch") for i in range(41)} == {"0"}
        opened = web.page.evaluate("[...document.querySelectorAll('#ro-token-view details.he-tcall')].filter(d => d.open).length")
        assert opened == 2
        first = calls.first
        assert first.locator(".he-prompt").is_visible() and "Create hello.txt" in first.locator(".he-prompt").inner_text()
        assert first.locator(".he-tokens.he-trained span.he-tok").count() > 150
        assert re.match(r"id \d+ · logprob -?\d", first.locator("span.he-tok").first.get_attribute("title"))
        # The long word wraps: the page and the token strip are no wider than the window.
        strip = first.locator(".he-tokens")
        assert strip.evaluate("e => e.scrollWidth <= e.clientWidth + 1"), strip.evaluate("e => [e.scrollWidth, e.clientWidth]")
        assert web.page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        assert "41 model call(s) · 1 branch(es)" in web.page.inner_text("#ro-token-view .he-graph")
        web.page.locator("#ro-token-view .he-token-key").evaluate("e => e.scrollIntoView()")
        web.page.screenshot(path=str(artifacts / "web-tokens.png"))
        calls.nth(5).locator("summary").click()  # a collapsed call opens on a click
        assert calls.nth(5).locator(".he-tokens").is_visible()
        assert web.foreign_requests == []
    finally:
        web.close()
    if os.environ.get("HARNESS_ENV_UPDATE_SCREENSHOT"):  # refresh the docs' picture
        shutil.copy(artifacts / "web-tokens.png", REPO / "docs" / "web-tokens.png")
