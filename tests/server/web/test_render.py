"""The pure renderers: RolloutResult -> what the page shows."""

import html
import json
import math
import re

from harness_env.envs.harbor.harness import HarborHarness
from harness_env.envs.harbor.options import HarborRunInfo
from harness_env.models import CommandResult, PhaseEvent, RolloutResult, Turn
from harness_env.server.web import render


def _turn(index, prompt_msgs, text="", tool_calls=(), logps=(), tokens=(), ids=()):
    return Turn(
        index=index,
        request_messages=list(prompt_msgs),
        completion_text=text,
        tool_calls=list(tool_calls),
        per_token_logps=list(logps),
        completion_tokens=list(tokens),
        completion_token_ids=list(ids),
        upstream_status=200,
        capture_level="tokens",
        request_tools=[{"type": "function"}],
    )


CALL = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "echo hi > a.txt"}'}}
SYS = {"role": "system", "content": "You are an agent."}
USER = {"role": "user", "content": "Write a.txt"}
T0 = _turn(0, [SYS, USER], tool_calls=[CALL], logps=[-0.1, -2.5, -0.3], tokens=['{"c', "omm", "and"], ids=[1, 2, 3])
T1 = _turn(
    1,
    [SYS, USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "c1", "content": "<b>ok</b>"}],
    text="done",
    logps=[-0.05],
    tokens=["done"],
    ids=[4],
)


def _result(**kw) -> RolloutResult:
    base = dict(
        reward=1.0,
        harness="pi",
        proxy_turns=[T0, T1],
        capture_level="tokens",
        wall_s=1.5,
        verify_results=[CommandResult(cmd="grep -q x <a.txt", exit_code=0, stdout="line1\nline2\n", duration_s=0.01)],
        files={"a.txt": "<script>alert(1)</script>"},
    )
    return RolloutResult(**{**base, **kw})


def test_reward_colour_pass_fail_none():
    assert "he-pass" in render.reward_html(_result()) and 'data-reward="1.0"' in render.reward_html(_result())
    assert "he-fail" in render.reward_html(_result(reward=0.5))
    assert "he-partial" in render.reward_html(_result(reward=0.8, reward_source="judge"))
    assert "he-fail" in render.reward_html(_result(reward=0.0, reward_source="zero_check"))
    none = render.reward_html(_result(reward=None, error="boom <x>", error_kind="endpoint"))
    assert "he-none" in none and "no reward" in none and "boom &lt;x&gt;" in none
    assert "cancelled" in render.reward_html(None, cancelled=True)


def test_verify_table_and_files_escape_what_the_agent_wrote():
    table = render.commands_html(_result().verify_results)
    assert "<code>grep -q x &lt;a.txt</code>" in table and "stdout (2 lines)" in table and "no stderr" in table
    files = render.files_html(_result().files)
    assert "<script>" not in files and "&lt;script&gt;" in files
    assert "no verify commands" in render.commands_html([])


def test_verify_outputs_are_blocks_of_their_own():
    # Inline, the two notes read "no stdoutno stderr" in the page's text.
    table = render.commands_html([CommandResult(cmd="true", exit_code=0)])
    assert '<div class="he-output he-empty">no stdout</div><div class="he-output he-empty">no stderr</div>' in table
    assert '<details class="he-output"><summary>stdout (2 lines)' in render.commands_html(_result().verify_results)


def test_the_json_is_collapsed_escaped_and_clipped():
    html = render.json_html('{"a": "<b>"}', 100)
    assert html.startswith('<details class="he-json"><summary>') and " open" not in html.split(">")[0]
    assert "&lt;b&gt;" in html and "12 characters" in html
    assert "cut here; the download has everything" in render.json_html("x" * 50, 10)


def test_a_turn_limit_end_says_so_beside_the_reward():
    html = render.reward_html(_result(reward=0.0, turn_limit_hit=True))
    assert "the turn limit ended it after 2 model call(s)" in html and 'data-reward="0.0"' in html
    assert "turn limit" not in render.reward_html(_result(reward=0.0))


def test_turn_labels_keep_their_distance_on_a_long_rollout():
    turns = [_turn(i, [USER], logps=[-0.1, -0.2], tokens=["a", "b"], ids=[1, 2]) for i in range(60)]
    svg = render.logprob_svg(render.logprob_points(turns))
    xs = [float(x) for x in re.findall(r'<text class="he-turn-label" x="([\d.]+)"', svg)]
    assert xs[0] < 50 and 5 < len(xs) < 60  # some turns labelled, not all 60
    assert all(b - a >= 48 for a, b in zip(xs, xs[1:]))
    assert svg.count('stroke-dasharray="3,3"') == 60  # every turn still has its line


def test_conversation_shows_each_message_once_with_tool_calls_and_results():
    msgs = render.conversation(_result())
    titles = [m.get("metadata", {}).get("title") for m in msgs]
    assert titles == ["system prompt", None, "tool call: bash", "tool result c1", None]
    assert msgs[1] == {"role": "user", "content": '<div class="he-chat-text">Write a.txt</div>'}
    assert '"command": "echo hi > a.txt"' in html.unescape(msgs[2]["content"])
    assert msgs[-1] == {"role": "assistant", "content": '<div class="he-chat-text">done</div>'}


def test_conversation_marks_a_new_branch():
    other = _turn(2, [SYS, {"role": "user", "content": "summary of the work"}], text="ok")
    msgs = render.conversation(_result(proxy_turns=[T0, T1, other]))
    assert any(m.get("metadata", {}).get("title") == "new branch" for m in msgs)
    assert msgs[-1]["content"] == '<div class="he-chat-text">ok</div>'


def test_logprob_points_one_per_token_and_plot():
    points = render.logprob_points([T0, T1])
    assert [(p.turn, p.position, p.token) for p in points] == [(0, 0, '{"c'), (0, 1, "omm"), (0, 2, "and"), (1, 3, "done")]
    svg = render.logprob_svg(points)
    assert svg.count('<circle class="he-token"') == 4
    assert "turn 0, token 1: &#x27;omm&#x27;  logprob -2.5000" in svg
    summary = render.logprob_summary_markdown(points)
    mean = (-0.1 - 2.5 - 0.3 - 0.05) / 4
    assert f"mean logprob **{mean:.4f}**" in summary
    lowest = summary.split("| --- | --- | --- | --- | --- |")[1].strip().splitlines()[0]
    assert "omm" in lowest and "-2.5000" in lowest
    assert "no per-token logprobs" in render.logprob_svg([])


def test_logprob_points_fall_back_to_ids_and_survive_infinities():
    t = _turn(0, [USER], logps=[-math.inf, -1.0], ids=[7, 8])
    points = render.logprob_points([t])
    assert [p.token for p in points] == ["<id 7>", "<id 8>"]
    assert render.logprob_svg(points).count("<circle") == 2
    assert "mean logprob **-1.0000**" in render.logprob_summary_markdown(points)


def test_auxiliary_calls_are_not_the_policys_in_the_plot_or_its_mean():
    """A title call (3 tokens) before the policy's first turn took that turn's label and its mean."""
    aux = _turn(0, [USER], logps=[-9.0, -9.0, -9.0], tokens=["T", "i", "t"], ids=[1, 2, 3]).model_copy(update={"purpose": "auxiliary"})
    policy = [_turn(i, [USER], logps=[-0.5] * 40, tokens=["a"] * 40, ids=[5] * 40) for i in (1, 2)]
    points = render.logprob_points([aux, *policy])
    assert {p.turn for p in points} == {1, 2} and len(points) == 80
    svg = render.logprob_svg(points)
    assert re.findall(r'<text class="he-turn-label"[^>]*>turn (\d+)</text>', svg) == ["1", "2"]
    assert "mean logprob **-0.5000**" in render.logprob_summary_markdown(points)


def test_log_line_and_history_row():
    ev = PhaseEvent(rollout_id="r", phase="agent", status="info", elapsed_s=1.234, detail="model call 0 (policy): 3 tokens")
    assert render.log_line(ev) == "   1.23s  agent    · model call 0 (policy): 3 tokens"
    assert render.log_line(PhaseEvent(rollout_id="r", phase="setup", status="started", elapsed_s=0)) == "   0.00s  setup    started"
    assert render.history_row(2, _result(), "pi", 1.5, "Write a.txt\nmore") == [2, "1.0", "pi", 1.5, "finished", "-", "Write a.txt"]
    assert render.history_row(3, None, "pi", 0.7, "x", cancelled=True)[4:6] == ["cancelled", "-"]
    # How the run ended (the status the store and the Rollouts tab show) and the error kind it
    # reported are separate columns.
    failed = render.history_row(4, _result(reward=None, error="x", error_kind="endpoint"), "pi", 1.0, "x")
    assert failed[4:6] == ["failed", "endpoint"] and len(render.HISTORY_HEADERS) == len(failed)
    graded = render.history_row(5, _result(reward=0.0, error="killed", error_kind="agent_timeout"), "pi", 1.0, "x")
    assert graded[4:6] == ["finished", "agent_timeout"]


def test_redact_and_json():
    data = {"error": "bad key sk-abcdef", "list": ["sk-abcdef!"], "n": 1}
    assert render.redact(data, ["sk-abcdef"]) == {"error": "bad key [redacted]", "list": ["[redacted]!"], "n": 1}
    assert render.redact(data, [""]) == data
    assert json.loads(render.result_json(_result()))["reward"] == 1.0
    summary = render.summary_markdown(_result(error="a | b", error_kind="agent_error"))
    assert "capture level | tokens" in summary and "a &#124; b" in summary
    labelled = html.unescape(render.summary_markdown(_result(rollout_type="eval", rollout_type_reason="its logprobs are raw")))
    # "eval" read as a mode: the summary says what it means for training, and why.
    assert "training | not certified for training: its logprobs are raw" in labelled and "turn graph | 0 branch(es)" in labelled
    assert "rollout type" not in labelled
    assert "training | certified for training" in html.unescape(render.summary_markdown(_result(rollout_type="train")))


PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
GRADING = {
    "renderer": "resvg",
    "zero_reasons": [],
    "page_valid": True,
    "rendered_png_b64": PNG_B64,
    "timings": {"checks_and_render_s": 0.05, "judge_s": 1.2},
    "judge": {
        "judge_model": "judge-vl",
        "reward": 0.75,
        "attempts": 2,
        "seconds": 1.234,
        "attempt_log": [],
        "error": None,
        "raw_answer": '{"shape": {"reason": "<b>square</b>", "score": 1}}',
        "scores": {"shape": {"score": 1.0, "reason": "a <b>square</b>", "weight": 3.0}, "colour": {"score": 0.0, "reason": "not red & blue", "weight": 1.0}},
    },
}


def test_grading_html_shows_both_images_scores_and_the_raw_answer_escaped():
    html = render.grading_html(GRADING, PNG_B64)
    assert html.count(f'src="data:image/png;base64,{PNG_B64}"') == 2
    assert 'class="he-rendered"' in html and 'class="he-reference"' in html
    assert '<tr data-dimension="shape"><td><code>shape</code></td><td>1.0</td><td>3.0</td><td>a &lt;b&gt;square&lt;/b&gt;</td></tr>' in html
    assert "not red &amp; blue" in html and "<b>" not in html
    assert '<th class="he-judge-reward" colspan="3">0.75</th>' in html
    assert "<details><summary>raw judge answer" in html and "&lt;b&gt;square" in html
    assert "judge-vl" in html and "resvg" in html and ">2<" in html and "1.234 s" in html


def test_grading_html_zero_without_a_judge_and_no_grading():
    zero = render.grading_html({"renderer": "chromium", "zero_reasons": ["blank: <all white>"], "page_valid": False, "timings": {}})
    assert "&lt;all white&gt;" in zero and "the judge was not asked" in zero and "he-reference" not in zero
    assert "no rendered icon" in zero  # no PNG in the evidence
    assert "verify commands" in render.grading_html(None)
    failed = render.grading_html({**GRADING, "judge": {**GRADING["judge"], "reward": None, "scores": {}, "error": "503 <x>"}})
    assert "503 &lt;x&gt;" in failed and "no per-dimension scores" in failed


def test_only_plain_base64_reaches_an_img_src():
    for bad in ['x" onerror="alert(1)', "javascript:alert(1)", "", None, 5]:
        html = render.grading_html({**GRADING, "rendered_png_b64": bad}, bad if isinstance(bad, str) else None)
        assert "onerror" not in html and "javascript" not in html and "<img" not in html
    assert "no reference image" in render.grading_html(GRADING, "")  # the reference could not be read


HARBOR_INFO = HarborRunInfo(
    task_name="hello-world",
    task_path="tasks/hello-world",
    agent="pi",
    agent_version="1.6.0",
    sandbox="local",
    exception="RuntimeError: <agent> crashed",
    verifier_rewards={"reward": 0.5, "<style>": 1.0},
)
TRAJECTORY = {
    "schema_version": "ATIF-v1.6",
    "agent": {"name": "pi", "version": "1.6.0", "model_name": "harness-env/m"},
    "steps": [
        {"step_id": 1, "source": "user", "message": "Write <b>hello</b> into /app/hello.txt"},
        {
            "step_id": 2,
            "source": "agent",
            "message": "x" * 1000,
            "tool_calls": [
                {"tool_call_id": "c1", "function_name": "bash", "arguments": {"command": "echo hello"}},
                {"tool_call_id": "c2", "function_name": "<img src=x onerror=alert(1)>", "arguments": {}},
            ],
            "observation": {"results": [{"source_call_id": "c1", "content": "ok"}, {"source_call_id": "c2", "content": "?"}]},
        },
        {"step_id": 3, "source": "agent", "message": [{"type": "text", "text": "done"}, {"type": "image", "source": {"path": "a.png"}}]},
    ],
}


def test_a_harness_s_facts_show_escaped_with_its_maps_as_tables():
    facts = HarborHarness().result_facts(RolloutResult(run_info=HARBOR_INFO))
    html = render.run_facts_html(facts, None)
    assert '<tr data-fact="task"><th>task</th><td><code>hello-world (tasks/hello-world)</code></td></tr>' in html
    assert '<tr data-fact="agent"><th>agent</th><td><code>pi 1.6.0</code></td></tr>' in html and "<code>local</code>" in html
    assert "RuntimeError: &lt;agent&gt; crashed" in html and "<agent>" not in html
    assert '<tr data-key="reward"><td><code>reward</code></td><td>0.5</td></tr>' in html
    assert "&lt;style&gt;" in html and "<style>" not in html
    assert "no agent trajectory" in html
    bare = render.run_facts_html(HarborHarness().result_facts(RolloutResult(run_info=HarborRunInfo(agent="nop", sandbox="local"))))
    assert "<td><code>nop</code></td>" in bare and '<tr data-fact="exception"><th>exception</th><td>none</td></tr>' in bare
    assert "nothing of this harness's own" in render.run_facts_html(None)


def test_harbor_facts_come_back_from_a_stored_result():
    stored = RolloutResult.model_validate_json(RolloutResult(run_info=HARBOR_INFO).model_dump_json())  # a plain HarnessRunInfo now
    assert HarborHarness().result_facts(stored) == HARBOR_INFO.facts()
    # stored before the field was run_info: under the harness's key, read all the same (and by that name)
    before = RolloutResult.model_validate_json(stored.model_dump_json().replace('"run_info":', '"harbor":'))
    assert HarborHarness().result_facts(before) == HARBOR_INFO.facts() and before.harbor is before.run_info
    assert HarborHarness().result_facts(RolloutResult()) is None


def test_trajectory_steps_compact_and_escaped():
    html = render.trajectory_html(TRAJECTORY)
    assert "trajectory ATIF-v1.6 · pi 1.6.0 · model harness-env/m · 3 step(s)" in html
    assert html.count('<tr class="he-step"') == 3
    assert '<tr class="he-step" data-source="user"><td>1</td><td>user</td><td><pre>Write &lt;b&gt;hello&lt;/b&gt; into /app/hello.txt</pre>' in html
    assert "x" * render.MAX_STEP_MESSAGE_CHARS + " ..." in html and "x" * (render.MAX_STEP_MESSAGE_CHARS + 1) not in html
    assert "<code>bash</code>, <code>&lt;img src=x onerror=alert(1)&gt;</code></td><td>2</td>" in html
    assert "<pre>done\n[image]</pre>" in html
    assert "<b>" not in html and "<img" not in html


def test_trajectory_survives_odd_shapes_and_is_bounded():
    assert "no agent trajectory" in render.trajectory_html(None)
    assert "no steps" in render.trajectory_html({"schema_version": "ATIF-v1.6", "steps": "nope", "agent": 3})
    odd = render.trajectory_html({"steps": [None, {"step_id": 1, "tool_calls": [5], "observation": {"results": None}, "message": None}]})
    assert odd.count('<tr class="he-step"') == 2 and "<code>?</code>" in odd
    many = render.trajectory_html({"steps": [{"step_id": i, "source": "agent", "message": "m"} for i in range(render.MAX_TRAJECTORY_STEPS + 5)]})
    assert many.count('<tr class="he-step"') == render.MAX_TRAJECTORY_STEPS and "5 more steps in the JSON download" in many


def test_message_content_is_flattened_one_way_for_chat_and_trajectory():
    from harness_env.server.web.render_text import content_text

    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": None}, {"type": "image_url"}, "raw"]
    assert content_text(parts) == "a\n\n[image_url]\nraw"
    assert content_text(None) == "" and content_text("s") == "s" and content_text({"k": 1}) == '{"k": 1}'
    msgs = render.conversation(_result(proxy_turns=[_turn(0, [{"role": "user", "content": parts}], text="ok")]))
    assert msgs[0] == {"role": "user", "content": '<div class="he-chat-text">a\n\n[image_url]\nraw</div>'}
    html = render.trajectory_html({"steps": [{"step_id": 1, "source": "user", "message": parts}]})
    assert "<pre>a\n\n[image_url]\nraw</pre>" in html


# -- what the agent wrote shows as text, never as markup ------------------------------------------
EVIL = "203.0.113.9"  # TEST-NET-3: a page that asked for it would be caught, and nothing answers
HOSTILE = (
    f'<img src="http://{EVIL}/i.png"><video src="http://{EVIL}/v.mp4" autoplay></video>'
    f'<form action="http://{EVIL}/t"><p>Re-enter your token</p><input name="token"></form><a href="http://{EVIL}/">sign in</a> '
    f"![x](http://{EVIL}/m.png) [Re-enter your token](http://{EVIL}/l) <http://{EVIL}/auto> www.{EVIL}.example "
    f"http://{EVIL}/bare a@{EVIL}.example $$\\href{{http://{EVIL}}}{{x}}$$ **bold** `code` | cell |\n---\n# heading"
)


def _hostile_result() -> RolloutResult:
    call = {"id": HOSTILE, "type": "function", "function": {"name": HOSTILE, "arguments": HOSTILE}}
    msgs = [
        {"role": "system", "content": HOSTILE},
        {"role": "user", "content": [{"type": "text", "text": HOSTILE}]},
        {"role": "assistant", "content": HOSTILE, "reasoning_content": HOSTILE, "tool_calls": [call]},
        {"role": "tool", "name": HOSTILE, "content": HOSTILE},
    ]
    turn = Turn(
        index=0,
        request_messages=msgs,
        completion_text=HOSTILE,
        reasoning_text=HOSTILE,
        tool_calls=[call],
        upstream_error=HOSTILE,
        upstream_status=500,
        per_token_logps=[-1.0],
        completion_tokens=[HOSTILE],
        completion_token_ids=[1],
    )
    return _result(
        proxy_turns=[turn],
        error=HOSTILE,
        error_kind="agent_error",
        reward_notes=[HOSTILE],
        sandbox_notes=[HOSTILE],
        rollout_type_reason=HOSTILE,
        task_id=HOSTILE,
        files={HOSTILE: HOSTILE},
        verify_results=[CommandResult(cmd=HOSTILE, exit_code=1, stdout=HOSTILE, stderr=HOSTILE)],
    )


def _tags(markup: str) -> set[str]:
    return {t.lower() for t in re.findall(r"<([a-zA-Z][\w-]*)", markup)}


def test_the_conversation_shows_every_message_and_title_as_escaped_text():
    msgs = render.conversation(_hostile_result())
    assert len(msgs) >= 8
    for m in msgs:
        assert _tags(m["content"]) <= {"div", "pre"}, m["content"]  # the wrapper only
        assert _tags(m.get("metadata", {}).get("title", "")) == set()
        assert HOSTILE.replace("\n", "") in html.unescape(m["content"]).replace("\n", "") or "branch" in m["content"] or "http" not in m["content"]


def _markdown_html(md: str) -> str:
    """What a Markdown renderer (CommonMark with raw HTML, and tables) makes of it; GFM autolinks are
    tried in the browser test."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table").render(md)  # raw HTML on, as in Gradio


def test_data_in_markdown_components_is_inert():
    from harness_env.server.web.render_text import md_cell, md_text

    result = _hostile_result()
    points = render.logprob_points(result.proxy_turns)
    for md in (
        render.summary_markdown(result),
        render.logprob_summary_markdown(points),
        md_text(HOSTILE),
        f"**{md_cell(HOSTILE)}**",
        render.status_line(HOSTILE, 1.0, HOSTILE),
    ):
        shown = _markdown_html(md)
        assert _tags(shown) <= {"p", "strong", "table", "thead", "tbody", "tr", "th", "td", "code"}, shown
        assert not re.search(r"<[^>]*\s(href|src|action)=", shown), shown
    assert html.unescape(_markdown_html(md_text("a <b> & ![x](y)"))).strip() == "<p>a <b> & ![x](y)</p>"


def test_every_html_renderer_escapes_the_agents_text():
    result = _hostile_result()
    shown = [
        render.reward_html(result),
        render.commands_html(result.verify_results),
        render.files_html(result.files),
        render.trajectory_tokens_html(result),
        render.logprob_svg(render.logprob_points(result.proxy_turns)),
        render.json_html(render.result_json(result), 10_000),
    ]
    for markup in shown:
        assert not _tags(markup) & {"img", "video", "form", "a", "input", "audio", "iframe", "source"}, markup


def test_a_long_rollouts_plot_is_thinned_not_unbounded():
    points = [render.TokenPoint(k // 1000, k, "t", -0.5) for k in range(100_000)]
    svg = render.logprob_svg(points)
    assert 9_000 <= svg.count('class="he-token"') <= 10_000 and "every 10th of 100000 tokens shown" in svg


def test_a_conversation_of_millions_of_tiny_messages_is_cut_with_a_note():
    """A file of 4 million {"role": "user"} (64 MB) made 4 million Chatbot messages."""
    from harness_env.server.web.render_turns import MAX_CHAT_MESSAGES

    turn = _turn(0, [{"role": "user", "content": "m"}] * 50_000, text="ok")
    msgs = render.conversation(_result(proxy_turns=[turn]))
    assert len(msgs) == MAX_CHAT_MESSAGES + 1 and "the first 5000 messages are shown" in msgs[-1]["content"]
