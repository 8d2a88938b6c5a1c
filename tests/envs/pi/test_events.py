import json

from harness_env.envs.pi.events import PiEventParser


def _feed(events):
    p = PiEventParser()
    for e in events:
        p.feed_line(json.dumps(e) if not isinstance(e, str) else e)
    return p.outcome()


def test_final_text_and_verified_tool_calls():
    out = _feed(
        [
            {"type": "session"},
            {"type": "tool_execution_start", "toolCallId": "a"},
            {"type": "tool_execution_end", "toolCallId": "a", "isError": False},
            {"type": "tool_execution_start", "toolCallId": "b"},
            {"type": "tool_execution_end", "toolCallId": "b", "isError": True},
            {"type": "tool_execution_start", "toolCallId": "b"},  # duplicate id counts once
            {"type": "tool_execution_start", "toolCallId": "c"},  # never finished: not counted
            "not json at all",
            {
                "type": "message_end",
                "message": {"role": "assistant", "stopReason": "stop", "content": [{"type": "text", "text": "all "}, {"type": "text", "text": "done"}]},
            },
        ]
    )
    assert out.tool_calls == 2 and out.final_text == "all done" and out.error is None


def test_failed_model_call_is_an_error():
    out = _feed([{"type": "message_end", "message": {"role": "assistant", "stopReason": "error", "errorMessage": "500: boom", "content": []}}])
    assert out.error == "500: boom"


def test_retry_success_clears_the_error():
    out = _feed(
        [
            {"type": "message_end", "message": {"role": "assistant", "stopReason": "error", "errorMessage": "503"}},
            {"type": "message_end", "message": {"role": "assistant", "stopReason": "stop", "content": [{"type": "text", "text": "ok"}]}},
        ]
    )
    assert out.error is None and out.final_text == "ok"
