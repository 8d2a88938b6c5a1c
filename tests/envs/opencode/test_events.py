import json

from harness_env.envs.opencode.events import OpenCodeEventParser


def _tool(call_id, status):
    return {"type": "tool_use", "part": {"type": "tool", "tool": "bash", "callID": call_id, "state": {"status": status}}}


def _feed(events):
    p = OpenCodeEventParser()
    for e in events:
        p.feed_line(e if isinstance(e, str) else json.dumps(e))
    return p.outcome()


def test_verified_tool_calls_and_final_text():
    out = _feed(
        [
            {"type": "step_start", "part": {}},
            _tool("a", "running"),
            _tool("a", "completed"),
            _tool("b", "error"),
            _tool("c", "running"),  # never finished: not counted
            {"type": "text", "part": {"text": "thinking aloud"}},
            {"type": "step_start", "part": {}},
            {"type": "text", "part": {"text": "All "}},
            {"type": "text", "part": {"text": "done."}},
            "garbage line",
            "",
        ]
    )
    assert out.tool_calls == 2 and out.final_text == "All done." and out.error is None


def test_error_event():
    out = _feed([{"type": "error", "error": {"name": "APIError", "data": {"message": "Bad Request: context too long"}}}])
    assert out.error == "Bad Request: context too long"
