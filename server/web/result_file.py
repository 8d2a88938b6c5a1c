"""Reading a result file a person opens in the Rollouts view: one RolloutResult JSON (whole, or the
compact form of harness_env.storage) or JSONL of them.

The file is hostile until read (anyone can hand a person a file): every way it can be wrong ends in
one ValueError line that says what was wrong and what to do, and nothing it holds may cost the
server more than a file of the size limit would. The compact form is the one that can: a turn
stores only what extends its parent, so a small file can describe an enormous result (one turn of
200,000 prompt ids and 200 turns that extend it: 1.9 MB on disk, 40 million ids expanded). Its
expanded size is therefore computed from the compact form first, without building anything, and a
file whose results would be bigger than MAX_EXPANDED_BYTES is refused before storage.unpack runs.
"""

from __future__ import annotations

import json
import os
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness_env.models import RolloutResult
from harness_env.storage import FORMAT, unpack

MAX_RESULT_FILE_BYTES = 64 * 1024 * 1024  # a result file opened from disk (Gradio's upload limit too)
# The results of one file, expanded, as JSON: no more than a whole (not compact) file of the
# size limit holds, so a compact file never costs more than the largest whole one.
MAX_EXPANDED_BYTES = MAX_RESULT_FILE_BYTES
MAX_EXPANDED_MESSAGES = 1_000_000  # request messages of all turns, expanded (bounds the walk's own memory)
MAX_DEPTH = 100  # nesting of a document (real results nest about 10 deep; the renderers recurse)
# Objects and lists in a file: parsed, "{}" is 64 bytes of Python for 3 of JSON. A dense real result
# (a top-logprobs entry per alternative) has one per 30-odd bytes.
MAX_CONTAINERS = MAX_RESULT_FILE_BYTES // 32
MAX_FILE_RESULTS = 1_000  # results read from one JSONL file
REQUIRED_KEYS = frozenset({"rollout_id", "harness", "reward"})  # what every stored result has
TOO_BIG_HINT = "open it in Python instead (harness_env.storage.load reads a compact file)"


class Budget:
    """What the file's results may still take, expanded, across all its documents."""

    def __init__(self) -> None:
        self.bytes = MAX_EXPANDED_BYTES
        self.messages = MAX_EXPANDED_MESSAGES

    def spend(self, nbytes: int, messages: int, where: str) -> None:
        self.bytes -= nbytes
        self.messages -= messages
        if self.bytes < 0:
            raise ValueError(
                f"{where}is too big to show here: expanded from its compact form it would be over "
                f"{MAX_EXPANDED_BYTES:,} bytes of JSON (the limit of a whole file); {TOO_BIG_HINT}"
            )
        if self.messages < 0:
            raise ValueError(
                f"{where}is too big to show here: expanded from its compact form its model calls would hold "
                f"over {MAX_EXPANDED_MESSAGES:,} request messages; {TOO_BIG_HINT}"
            )


def parse_result_file(path: str) -> list[RolloutResult]:
    """The results in a file. Raises ValueError with one line that says what is wrong."""
    size = os.path.getsize(path)
    if size > MAX_RESULT_FILE_BYTES:
        raise ValueError(f"the file has {size:,} bytes; at most {MAX_RESULT_FILE_BYTES:,} are opened here; {TOO_BIG_HINT}")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError("the file is not UTF-8 text (a RolloutResult JSON or JSONL file is)") from None
    if not text.strip():
        raise ValueError("the file is empty")
    # Counted before parsing (brackets inside strings count too: an upper bound, at C speed).
    containers = text.count("{") + text.count("[")
    if containers > MAX_CONTAINERS:
        raise ValueError(f"the file holds {containers:,} JSON objects and lists; at most {MAX_CONTAINERS:,} are opened here; {TOO_BIG_HINT}")
    budget = Budget()
    try:
        doc = _json(text, "the file ")
    except json.JSONDecodeError:
        pass  # JSONL, perhaps
    else:
        return [_result(doc, size, "the file ", budget)]
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if len(lines) > MAX_FILE_RESULTS:
        raise ValueError(f"the file has {len(lines):,} lines; at most {MAX_FILE_RESULTS:,} results are opened here")
    docs = []
    for n, line in lines:
        try:
            docs.append((n, _json(line, f"line {n} "), len(line.encode())))
        except json.JSONDecodeError as e:
            raise ValueError(f"line {n} is not JSON ({e.msg} at column {e.colno}): neither a JSON nor a JSONL file") from None
    # Every line's size is checked before any is built: the budget is the file's, not a line's.
    for n, doc, nbytes in docs:
        _check(doc, nbytes, f"line {n} ", budget)
    return [_build(doc, f"line {n} ") for n, doc, _ in docs]


def _json(text: str, where: str) -> Any:
    """The JSON document `text` holds (json.JSONDecodeError when it is not JSON); too deep a one
    is refused."""
    try:
        doc = json.loads(text)
    except RecursionError:  # the parser's own limit, far deeper than MAX_DEPTH
        raise ValueError(f"{where}is nested more than {MAX_DEPTH} levels deep: not a RolloutResult") from None
    if _depth_over(doc, MAX_DEPTH):
        raise ValueError(f"{where}is nested more than {MAX_DEPTH} levels deep: not a RolloutResult")
    return doc


def _depth_over(doc: Any, limit: int) -> bool:
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value) if isinstance(v, (dict, list)))
    return False


def _result(doc: Any, nbytes: int, where: str, budget: Budget) -> RolloutResult:
    _check(doc, nbytes, where, budget)
    return _build(doc, where)


def _check(doc: Any, nbytes: int, where: str, budget: Budget) -> None:
    """Refuse a document that is not a result's shape, or whose expanded form is over the budget."""
    if not isinstance(doc, dict) or not REQUIRED_KEYS <= doc.keys():
        raise ValueError(f"{where}is not a RolloutResult (a JSON object with {', '.join(sorted(REQUIRED_KEYS))}, ...)")
    added, messages = expansion(doc, where) if doc.get("format") == FORMAT else (0, 0)
    budget.spend(nbytes + added, messages, where)


def _build(doc: dict[str, Any], where: str) -> RolloutResult:
    try:
        return unpack(doc)
    except (ValidationError, AttributeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}is not a RolloutResult: {_first_error(e)}") from None


def _first_error(e: Exception) -> str:
    if isinstance(e, ValidationError):
        err = e.errors()[0]
        return f"{'.'.join(map(str, err['loc'])) or 'the document'}: {err['msg']} ({e.error_count()} problem(s))"
    return f"{type(e).__name__}: {e}"


# -- the compact form's expanded size, computed without expanding it ------------------------------
@dataclass
class _Sizes:
    """One turn as storage.unpack would rebuild it, in JSON bytes: its prompt and completion ids,
    its tools, and the running total of its request messages (message k's end at cum[k])."""

    prompt: int
    completion: int
    tools: int
    cum: array


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def expansion(doc: dict[str, Any], where: str = "") -> tuple[int, int]:
    """(JSON bytes, request messages) that storage.unpack would add to the compact document `doc`
    (what its turns take from their parents). Walks the turns as unpack does, keeping only sizes;
    a turn in a shape unpack would not read is refused here, with what is wrong."""
    turns = doc.get("proxy_turns", [])
    if not isinstance(turns, list):
        raise ValueError(f"{where}is not a RolloutResult: proxy_turns is not a list")
    for k, raw in enumerate(turns):
        if not isinstance(raw, dict) or type(raw.get("index")) is not int:
            raise ValueError(f"{where}is not a RolloutResult: proxy_turns[{k}] is not a turn with an integer index")
        if raw.get("parent") is not None and type(raw["parent"]) is not int:
            raise ValueError(f"{where}is not a RolloutResult: proxy_turns[{k}].parent is not an integer")
    rebuilt: dict[int, _Sizes] = {}
    added = messages = 0
    for raw in sorted(turns, key=lambda r: r["index"]):
        parent = rebuilt.get(raw["parent"]) if raw.get("parent") is not None else None
        own = _own_messages(raw, where)
        inherited = array("q")
        if parent is not None:
            keep = raw.get("request_messages_from_parent", 0)
            if type(keep) is not int or keep < 0:
                raise ValueError(f"{where}is not a RolloutResult: turn {raw['index']}'s request_messages_from_parent is not a count")
            inherited = parent.cum[:keep]
        prompt = _size(raw.get("prompt_token_ids", []))
        if parent is not None and raw.get("prompt_extends_parent"):
            added += parent.prompt + parent.completion
            prompt += parent.prompt + parent.completion
        tools = _size(raw.get("request_tools", []))
        if parent is not None and raw.get("request_tools_from_parent"):
            added += parent.tools
            tools = parent.tools
        base = inherited[-1] if inherited else 0
        added += base
        messages += len(inherited) + len(own)
        if messages > MAX_EXPANDED_MESSAGES or added > MAX_EXPANDED_BYTES:
            return added, messages  # over already: the budget says so; no need to walk on
        cum = inherited
        for n in own:
            base += n
            cum.append(base)
        rebuilt[raw["index"]] = _Sizes(prompt, _size(raw.get("completion_token_ids", [])), tools, cum)
    return added, messages


def _own_messages(raw: dict[str, Any], where: str) -> list[int]:
    msgs = raw.get("request_messages", [])
    if not isinstance(msgs, list):
        raise ValueError(f"{where}is not a RolloutResult: turn {raw['index']}'s request_messages is not a list")
    return [_size(m) + 1 for m in msgs]  # +1: the comma between messages
