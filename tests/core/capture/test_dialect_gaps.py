"""docs/capture.md's "What the dialects do not translate yet" says, row by row, what a harness gets
for what the translation does not carry; each row of kind field, tool, block or event is checked
here against the dialect's code, so the page cannot drift from it."""

import copy
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from harness_env.core.capture.dialects.gemini import Gemini
from harness_env.core.capture.dialects.messages import Messages
from harness_env.core.capture.dialects.responses import Responses
from harness_env.core.errors import InvalidRequestError

DOC = Path(__file__).resolve().parents[3] / "docs" / "capture.md"
SECTION = "## What the dialects do not translate yet"
DIALECTS: dict[str, Any] = {"Responses": Responses(), "Messages": Messages(), "Gemini": Gemini()}
SCOPES = {"Responses": {}, "Messages": {"path": "/v1/messages"}, "Gemini": {"path": "/v1beta/models/m:streamGenerateContent", "query_string": b"alt=sse"}}
BASES: dict[str, dict[str, Any]] = {
    "Responses": {
        "model": "m",
        "stream": True,
        "input": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    },
    "Messages": {
        "model": "m",
        "max_tokens": 100,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    },
    "Gemini": {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": "OBJECT"}}]}],
    },
}


def _rows() -> list[tuple[str, str, str, str]]:
    """(dialect, kind, name, what the harness gets) for every name in the section's tables."""
    text = DOC.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    out, dialect = [], ""
    for line in section.splitlines():
        if m := re.match(r"\*\*(\w+) \(", line):
            dialect = m.group(1)
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in ("field", "tool", "block", "event"):
            out += [(dialect, cells[0], name, cells[2]) for name in re.findall(r"`([^`]+)`", cells[1])]
    return out


ROWS = _rows()


def test_the_section_lists_every_dialect_and_kind():
    assert {(d, k) for d, k, _, _ in ROWS} >= {(d, k) for d in DIALECTS for k in ("field", "tool", "block", "event")}


def _engine(dialect: str, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    d = DIALECTS[dialect]
    request = d.read_request(copy.deepcopy(body), SCOPES[dialect])
    return d.engine_body(request), request.messages


def _with_block(dialect: str, name: str, side: str) -> dict[str, Any]:
    """The base request with a block (item, part) of type `name` on the user's or the model's side."""
    body = copy.deepcopy(BASES[dialect])
    if dialect == "Responses":
        body["input"].append({"type": name} if side == "assistant" else {"role": "user", "content": [{"type": name}]})
    elif dialect == "Messages":
        body["messages"].append({"role": side, "content": [{"type": "text", "text": "a"}, {"type": name, "data": "x"}]})
    else:
        body["contents"].append({"role": "model" if side == "assistant" else "user", "parts": [{name: {}}]})
    return body


@pytest.mark.parametrize("dialect,kind,name,gets", ROWS, ids=[f"{d}-{k}-{n}" for d, k, n, _ in ROWS])
def test_each_row_says_what_the_code_does(dialect, kind, name, gets):
    base = BASES[dialect]
    if kind == "field":
        body = copy.deepcopy(base)
        *parents, leaf = name.split(".")
        target = body
        for p in parents:
            target = target.setdefault(p, {})
        target[leaf] = "x"
        if gets.startswith("refused"):
            with pytest.raises(InvalidRequestError, match=name):
                _engine(dialect, body)
        else:
            assert gets.startswith(("ignored", "accepted"))
            assert _engine(dialect, body) == _engine(dialect, base)  # neither the engine's request nor the record changes
    elif kind == "tool":
        assert gets.startswith("left out")
        body = copy.deepcopy(base)
        body["tools"].append({name: {}} if dialect == "Gemini" else {"type": name, "name": name.split("_")[0]})
        assert _engine(dialect, body)[0]["tools"] == _engine(dialect, base)[0]["tools"]
    elif kind == "block" and gets.startswith("refused"):
        errors = []
        for side in ("user", "assistant"):
            try:
                _engine(dialect, _with_block(dialect, name, side))
            except InvalidRequestError as e:
                errors.append(str(e))
        assert errors, f"{name} is accepted on both sides"
        if "naming the" in gets:
            assert all(name in e for e in errors), errors
    elif kind == "block":
        assert gets.startswith("dropped")
        with_block = _with_block(dialect, name, "assistant")
        without = copy.deepcopy(with_block)
        without["messages"][-1]["content"].pop()
        assert _engine(dialect, with_block) == _engine(dialect, without)
    else:
        assert gets.startswith("never sent")
        source = inspect.getsource(inspect.getmodule(type(DIALECTS[dialect])))
        assert f'"{name}"' not in source
