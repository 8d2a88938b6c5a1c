import json

from harness_env.envs.claude_code.events import ClaudeCodeEventParser


def _feed(*events):
    p = ClaudeCodeEventParser()
    p.feed_line("[claude-code:unrecognized_model] {}")  # a notice, not an event
    for e in events:
        p.feed_line(json.dumps(e))
    return p.outcome()


def _assistant(*blocks, parent=None, model="m"):
    return {"type": "assistant", "message": {"model": model, "role": "assistant", "content": list(blocks)}, "parent_tool_use_id": parent}


def _results(*ids, is_error=False):
    return {
        "type": "user",
        "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": i, "content": "x", "is_error": is_error} for i in ids]},
    }


def _use(i, name="Bash"):
    return {"type": "tool_use", "id": i, "name": name, "input": {"command": "ls"}}


SUCCESS = {"type": "result", "subtype": "success", "is_error": False, "result": "Created it.", "num_turns": 2}


def test_a_run_with_a_command_and_an_answer():
    out = _feed(
        {"type": "system", "subtype": "init", "tools": ["Bash"]},
        _assistant(_use("t1")),
        _results("t1"),
        _assistant({"type": "text", "text": "Created it."}),
        SUCCESS,
    )
    assert out.final_text == "Created it." and out.tool_calls == 1 and out.error is None and out.events == 5


def test_a_tool_call_counts_once_when_it_got_a_result_refused_or_failed_included():
    out = _feed(
        _assistant(_use("t1"), _use("t2"), _use("t3")),
        _results("t1"),
        _results("t2", is_error=True),
        _results("t2"),
        _assistant(_use("t4"), parent="t9"),
        _results("t4"),  # a sub-agent's call
        _results("t-unknown"),
    )  # a result without its call counts nothing
    assert out.tool_calls == 3  # t3 never got a result (killed)


def test_an_api_error_is_the_error_and_not_the_final_text():
    synthetic = _assistant({"type": "text", "text": "API Error: 400 scripted failure 400"}, model="<synthetic>")
    out = _feed(
        _assistant({"type": "text", "text": "Thinking aloud."}),
        synthetic,
        {"type": "result", "subtype": "success", "is_error": True, "result": "API Error: 400 scripted failure 400"},
    )
    assert out.error == "API Error: 400 scripted failure 400" and out.final_text == "Thinking aloud."
    assert _feed({"type": "result", "subtype": "error_max_turns", "is_error": True}).error == "error_max_turns"
    assert _feed({"type": "result", "subtype": "error_during_execution", "is_error": True}, SUCCESS).error is None


def test_a_sub_agents_text_is_not_the_final_text():
    out = _feed(_assistant({"type": "text", "text": "main"}), _assistant({"type": "text", "text": "sub"}, parent="t1"))
    assert out.final_text == "main"


def test_garbage_lines_are_ignored():
    p = ClaudeCodeEventParser()
    for line in ("", "WARNING: x", "{not json", "[1, 2]", '{"type": "assistant", "message": "x"}', '{"type": "user", "message": {"content": "text"}}'):
        p.feed_line(line)
    assert p.outcome().events == 2 and p.outcome().tool_calls == 0 and p.outcome().final_text == ""
