"""The engine's exact tool-call arguments, kept per session for dialects that hand them over as
objects: given back byte for byte when the harness sends the same object, written fresh when it
changed it, and bounded however many calls a policy makes."""

import json

import pytest

from harness_env.core.capture.dialects.sampled import SampledArguments, handed_object, same_json
from tests.core.capture.dialect_streams import as_javascript_sends

# What models write that json.dumps would write otherwise: compact, raw UTF-8, keys unsorted,
# numbers as the model spelled them.
SAMPLED = ['{"command":"ls"}', '{"path":"é.txt"}', '{"path": "\\u00e9.txt"}', '{"z":1,"a":{"y":[1.0,1e5],"b":true}}', '{\n  "command": "ls"\n}']


@pytest.mark.parametrize("text", SAMPLED)
def test_the_object_handed_over_comes_back_as_the_engines_text(text):
    sampled = SampledArguments()
    value = sampled.handed("call_1", text)
    assert value == json.loads(text)
    assert sampled.text("call_1", as_javascript_sends(json.loads(text))) == text
    assert sampled.text("call_1", json.loads(text)) == text


def test_a_changed_object_or_an_unknown_id_is_written_fresh():
    sampled = SampledArguments()
    sampled.handed("call_1", '{"command":"ls"}')
    assert sampled.text("call_1", {"command": "ls -la"}) == '{"command": "ls -la"}'
    assert sampled.text("call_1", {"command": "ls", "timeout": 5}) == '{"command": "ls", "timeout": 5}'
    assert sampled.text("call_2", {"command": "ls"}) == '{"command": "ls"}'
    assert sampled.text("call_1", {"command": "ls"}) == '{"command":"ls"}'  # still there for the unchanged replay


def test_json_dumps_layout_and_arguments_that_are_no_object():
    sampled = SampledArguments()
    assert sampled.handed("call_1", '{"command": "ls"}') == {"command": "ls"} and len(sampled) == 0  # nothing to keep
    assert sampled.handed("call_2", '{"command": "l') == {}  # cut off by the token limit: the harness gets {}
    assert sampled.text("call_2", {}) == '{"command": "l'  # and its {} back is what the engine wrote
    assert sampled.handed("call_3", "[1,2]") == {} and sampled.text("call_3", {"x": 1}) == '{"x": 1}'
    assert sampled.text("", None) == "{}" and sampled.handed("", '{"a":1}') == {"a": 1} and len(sampled) == 2  # no id: not kept


def test_same_json_is_the_same_value_not_pythons_equality():
    assert same_json({"a": 1, "b": [1.0, 1e5]}, {"b": [1, 100000], "a": 1.0})
    assert not same_json({"a": True}, {"a": 1}) and not same_json([0], [False]) and not same_json({"a": None}, {"a": 0})
    assert not same_json({"a": "1"}, {"a": 1}) and not same_json([1, 2], [1, 2, 3]) and not same_json({"a": 1}, {"a": 1, "b": 2})
    assert not same_json({"a": [1]}, {"a": {"0": 1}})


def test_the_cap_holds_the_least_recently_replayed_dropped_first():
    sampled = SampledArguments(max_calls=3, max_chars=1000)
    for i in range(5):
        sampled.handed(f"call_{i}", f'{{"i":{i}}}')
    assert len(sampled) == 3
    assert sampled.text("call_0", {"i": 0}) == '{"i": 0}'  # dropped: written fresh
    assert sampled.text("call_2", {"i": 2}) == '{"i":2}'  # replayed: now the most recent
    sampled.handed("call_5", '{"i":5}')
    assert sampled.text("call_3", {"i": 3}) == '{"i": 3}' and sampled.text("call_2", {"i": 2}) == '{"i":2}'


def test_the_characters_kept_are_bounded_too():
    sampled = SampledArguments(max_calls=100, max_chars=50)
    big = '{"content":"' + "x" * 60 + '"}'
    sampled.handed("big", big)
    assert len(sampled) == 0 and sampled.chars == 0  # longer than the whole budget: never kept
    for i in range(10):
        sampled.handed(f"call_{i}", '{"n":"' + str(i) * 8 + '"}')  # 16 characters each
    assert sampled.chars <= 50 and len(sampled) == 3
    sampled.handed("call_9", '{"n":"9"}')  # the same id again replaces its text
    assert sampled.chars == 16 + 16 + 9 and len(sampled) == 3


def test_handed_object_is_what_both_dialects_hand_over():
    assert handed_object('{"a":1}') == {"a": 1} and handed_object("") == {} and handed_object("null") == {}


def test_arguments_handed_over_as_text_and_written_again_get_the_engines_text_back():
    """Chat Completions and Responses hand the harness the engine's string; Pi parses it and
    writes it compact. The history the engine gets has its own text wherever the value is the same,
    and the harness's text, untouched, where it changed it or the id is unknown."""
    sampled = SampledArguments()
    engine = '{"command": "ls", "n": 1.0}'
    sampled.wrote("call_1", engine)
    history = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls","n":1}'}},
                {"id": "call_2", "type": "function", "function": {"name": "bash", "arguments": '{"command":"pwd"}'}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls -la"}'}}],
        },
    ]
    before = json.dumps(history)
    out = sampled.restore_history(history)
    assert out[1]["tool_calls"][0]["function"]["arguments"] == engine
    assert out[1]["tool_calls"][1]["function"]["arguments"] == '{"command":"pwd"}'  # never handed: the harness's own
    assert out[2]["tool_calls"][0]["function"]["arguments"] == '{"command":"ls -la"}'  # changed: the harness's own
    assert json.dumps(history) == before and out[0] is history[0]  # the harness's request is not modified
