"""Result files opened in the Rollouts view are hostile until read: whatever is wrong with one ends
in one line saying what, and nothing in one costs the server more than a whole file of the size
limit would (the compact form's expansion is bounded before anything is built)."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from harness_env.models import RolloutResult, Turn
from harness_env.server.web import result_file
from harness_env.server.web.result_file import MAX_DEPTH, expansion, parse_result_file
from harness_env.storage import FORMAT, pack, save

HEAD = {"rollout_id": "amp", "harness": "pi", "reward": 1.0, "format": FORMAT}


def amplifying(turns: int = 200, ids: int = 200_000) -> dict:
    """The red team's file: one turn of `ids` prompt ids, then turns that each extend their parent
    by nothing (1.3 MB on disk; 40 million ids expanded)."""
    first = {"index": 0, "prompt_token_ids": list(range(1000, 1000 + ids)), "request_messages": [{"role": "user", "content": "hi"}]}
    rest = [
        {"index": i, "parent": i - 1, "prompt_token_ids": [], "prompt_extends_parent": True, "request_messages": [], "request_messages_from_parent": 1}
        for i in range(1, turns)
    ]
    return {**HEAD, "proxy_turns": [first, *rest]}


def write(tmp_path, doc, name="f.json") -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc, separators=(",", ":")))
    return str(path)


def test_a_compact_file_that_expands_past_the_limit_is_refused_before_it_is_built(tmp_path, monkeypatch):
    path = write(tmp_path, amplifying())
    built = []
    monkeypatch.setattr(result_file, "unpack", lambda doc: built.append(doc))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"too big to show here: expanded from its compact form it would be over 67,108,864 bytes"):
            parse_result_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert built == []  # refused from the compact form alone
    assert peak < 64 * 1024 * 1024  # the file's own parse, not its 40 million expanded ids


def test_quadratic_messages_are_refused_too(tmp_path):
    """Each turn takes all of its parent's messages and adds one: messages, not ids, amplify."""
    turns = [
        {"index": i, "parent": i - 1 if i else None, "request_messages": [{"role": "tool", "content": "x" * 20}], "request_messages_from_parent": 10**9}
        for i in range(3_000)
    ]
    with pytest.raises(ValueError, match="too big to show here"):
        parse_result_file(write(tmp_path, {**HEAD, "proxy_turns": turns}))


def test_the_limit_is_the_files_across_its_jsonl_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(result_file, "MAX_EXPANDED_BYTES", 3_000_000)
    line = json.dumps(amplifying(turns=3, ids=100_000), separators=(",", ":"))  # about 2 MB expanded
    assert len(parse_result_file(write(tmp_path, line))) == 1
    with pytest.raises(ValueError, match="line 2 is too big to show here"):
        parse_result_file(write(tmp_path, line + "\n" + line, "two.jsonl"))


def _real_result() -> RolloutResult:
    """Three turns that extend each other, a fourth on a branch of its own, with tools."""
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "go"}]
    turns, prompt = [], []
    for i in range(3):
        prompt = prompt + list(range(500 * i, 500 * i + 400))
        turns.append(
            Turn(
                index=i, parent=i - 1 if i else None, prompt_token_ids=prompt, completion_token_ids=[7, 8, 9], request_messages=list(msgs), request_tools=tools
            )
        )
        prompt = prompt + [7, 8, 9]
        msgs = [*msgs, {"role": "assistant", "content": f"step {i}"}, {"role": "tool", "content": "ok " * 50}]
    turns.append(Turn(index=3, parent=0, prompt_token_ids=[1, 2], request_messages=msgs[:1], request_tools=tools))
    return RolloutResult(rollout_id="r", harness="pi", reward=1.0, proxy_turns=turns)


def test_the_expanded_size_is_computed_exactly_enough_to_be_the_bound(tmp_path):
    result = _real_result()
    compact = pack(result)
    added, messages = expansion(compact)
    whole = len(json.dumps(result.model_dump(mode="json")["proxy_turns"], separators=(",", ":")))
    packed = len(json.dumps(compact["proxy_turns"], separators=(",", ":")))
    assert abs(packed + added - whole) < 0.05 * whole  # what a whole file of this result would hold
    assert messages == sum(len(t.request_messages) for t in result.proxy_turns)
    path = tmp_path / "c.json"
    save(result, path)
    assert parse_result_file(str(path)) == [result]  # and the file opens, exactly


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, f"the file is nested more than {MAX_DEPTH} levels deep"),
        (json.dumps({**HEAD, "grading": json.loads("[" * 150 + "]" * 150)}), "nested more than"),
        ('{"rollout_id": "r", "harness": "pi", "reward": 1}\n' + "[" * 5_000 + "]" * 5_000, "line 2 is nested more than"),
        ({**HEAD, "proxy_turns": "x"}, "proxy_turns is not a list"),
        ({**HEAD, "proxy_turns": [{"parent": 0}]}, r"proxy_turns\[0\] is not a turn with an integer index"),
        ({**HEAD, "proxy_turns": [{"index": 0}, {"index": 1, "parent": [0]}]}, r"proxy_turns\[1\].parent is not an integer"),
        ({**HEAD, "proxy_turns": [{"index": 0}, {"index": 1, "parent": 0, "request_messages_from_parent": -1}]}, "request_messages_from_parent is not a count"),
        ({**HEAD, "proxy_turns": [{"index": 0, "request_messages": "x"}]}, "request_messages is not a list"),
        ({**HEAD, "proxy_turns": [{"index": 0, "prompt_token_ids": ["a"]}]}, "not a RolloutResult: prompt_token_ids.0: Input should be a valid integer"),
        ("\ufeff{}", "not JSON"),
    ],
)
def test_every_bad_file_is_one_line_that_says_what_is_wrong(tmp_path, doc, message):
    with pytest.raises(ValueError, match=message) as e:
        parse_result_file(write(tmp_path, doc))
    assert "\n" not in str(e.value) and "Traceback" not in str(e.value)


def test_a_file_over_the_size_limit_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(result_file, "MAX_RESULT_FILE_BYTES", 100)
    with pytest.raises(ValueError, match="at most 100 are opened here; open it in Python instead"):
        parse_result_file(write(tmp_path, {**HEAD, "task_id": "x" * 200}))


def test_a_file_of_tiny_objects_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    """ "{}" is 3 bytes of JSON and 64 of Python: 64 MB of them parsed to 1.4 GB."""
    monkeypatch.setattr(result_file, "MAX_CONTAINERS", 1_000)
    parsed = []
    monkeypatch.setattr(result_file.json, "loads", lambda text: parsed.append(text))
    doc = json.dumps({**HEAD, "grading": {"x": [{}] * 2_000}})
    with pytest.raises(ValueError, match="holds 2,003 JSON objects and lists; at most 1,000 are opened here"):
        parse_result_file(write(tmp_path, doc))
    assert parsed == []
