import json

from harness_env.envs.codex.events import CodexEventParser


def _feed(*events):
    p = CodexEventParser()
    p.feed_line("Reading additional input from stdin...")  # not an event
    for e in events:
        p.feed_line(json.dumps(e))
    return p.outcome()


def _cmd(i, status):
    return {"id": f"item_{i}", "type": "command_execution", "command": "bash -lc ls", "aggregated_output": "", "exit_code": 0, "status": status}


def test_a_run_with_a_command_and_an_answer():
    out = _feed(
        {"type": "thread.started", "thread_id": "t"},
        {"type": "item.completed", "item": {"id": "item_0", "type": "error", "message": "Model metadata for `m` not found."}},
        {"type": "turn.started"},
        {"type": "item.started", "item": _cmd(1, "in_progress")},
        {"type": "item.completed", "item": _cmd(1, "completed")},
        {"type": "item.completed", "item": {"id": "item_2", "type": "agent_message", "text": "Created it."}},
        {"type": "turn.completed", "usage": {"input_tokens": 20, "output_tokens": 10}},
    )
    assert out.final_text == "Created it." and out.tool_calls == 1 and out.error is None and out.events == 7


def test_tool_calls_count_once_each_when_they_ended():
    out = _feed(
        {"type": "item.started", "item": _cmd(1, "in_progress")},
        {"type": "item.completed", "item": _cmd(1, "failed")},
        {"type": "item.completed", "item": _cmd(1, "failed")},
        {"type": "item.started", "item": _cmd(2, "in_progress")},  # never ended (killed)
        {"type": "item.completed", "item": {"id": "item_3", "type": "file_change", "changes": [{"path": "a", "kind": "add"}], "status": "completed"}},
        {"type": "item.completed", "item": {"id": "item_4", "type": "mcp_tool_call", "server": "s", "tool": "t", "status": "completed"}},
        {"type": "item.completed", "item": {"id": "item_5", "type": "reasoning", "text": "hmm"}},
        {"type": "item.completed", "item": {"id": "item_6", "type": "agent_message", "text": "first"}},
        {"type": "item.completed", "item": {"id": "item_7", "type": "agent_message", "text": "last"}},
    )
    assert out.tool_calls == 3 and out.final_text == "last"


def test_a_failed_turn_is_the_error_and_a_later_completed_turn_clears_it():
    failed = _feed(
        {"type": "turn.started"},
        {"type": "error", "message": "exceeded retry limit, last status: 429"},
        {"type": "turn.failed", "error": {"message": "scripted failure 400"}},
    )
    assert failed.error == "scripted failure 400"
    assert _feed({"type": "error", "message": "stream broke"}).error == "stream broke"
    assert _feed({"type": "turn.failed", "error": {"message": "x"}}, {"type": "turn.completed", "usage": {}}).error is None


def test_garbage_lines_are_ignored():
    p = CodexEventParser()
    for line in ("", "WARNING: proceeding", "{not json", "[1, 2]", '{"type": "item.completed", "item": "x"}'):
        p.feed_line(line)
    assert p.outcome().events == 1 and p.outcome().tool_calls == 0
