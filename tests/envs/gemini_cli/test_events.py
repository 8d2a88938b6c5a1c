import json

from harness_env.envs.gemini_cli.events import GeminiEventParser


def _feed(*events):
    p = GeminiEventParser()
    p.feed_line("YOLO mode is enabled. All tool calls will be automatically approved.")  # a notice, not an event
    for e in events:
        p.feed_line(json.dumps(e))
    return p.outcome()


def _say(text, delta=True):
    return {"type": "message", "role": "assistant", "content": text, "delta": delta}


def _use(i):
    return {"type": "tool_use", "tool_name": "run_shell_command", "tool_id": i, "parameters": {"command": "ls"}}


def _result(i, status="success"):
    return {"type": "tool_result", "tool_id": i, "status": status, "output": ""}


SUCCESS = {"type": "result", "status": "success", "stats": {"tool_calls": 1}}


def test_a_run_with_a_command_and_an_answer():
    out = _feed(
        {"type": "init", "session_id": "s", "model": "m"},
        {"type": "message", "role": "user", "content": "do it"},
        _say("Let me "),
        _say("look."),
        _use("t1"),
        _result("t1"),
        _say("Crea"),
        _say("ted it."),
        SUCCESS,
    )
    assert out.final_text == "Created it." and out.tool_calls == 1 and out.error is None and out.events == 9


def test_a_tool_call_counts_once_when_it_got_a_result_errors_included():
    out = _feed(_use("t1"), _result("t1"), _use("t2"), _result("t2", "error"), _result("t2", "error"), _use("t3"), _result("t-unknown"))
    assert out.tool_calls == 2  # t3 never got a result (killed)


def test_a_failed_run_is_the_error_and_a_successful_result_clears_a_warning():
    failed = _feed(_say("x"), {"type": "result", "status": "error", "error": {"type": "FatalTurnLimitedError", "message": "Reached max session turns"}})
    assert failed.error == "Reached max session turns"
    assert _feed({"type": "error", "severity": "error", "message": "[API Error: 500]"}).error == "[API Error: 500]"
    assert _feed({"type": "error", "severity": "warning", "message": "retrying"}).error is None
    assert _feed({"type": "error", "severity": "error", "message": "x"}, SUCCESS).error is None
    assert _feed(_say("whole answer", delta=False)).final_text == "whole answer"


def test_garbage_lines_are_ignored():
    p = GeminiEventParser()
    for line in ("", "Warning: 256-color support not detected.", "{not json", "[1, 2]", '{"type": "tool_use"}'):
        p.feed_line(line)
    assert p.outcome().events == 1 and p.outcome().tool_calls == 0
