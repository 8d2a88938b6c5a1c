"""The turn graph: which turns continue which, and what kind of link each is.

A turn whose prompt starts with an earlier turn's prompt + completion (Turn.continues, the one
prefix relation) continues that turn's branch: `extends`. Otherwise it starts a new branch, and its
messages say why (docs/training.md shows each kind):
- `template_rerender`: its messages are an earlier call's messages + that call's answer + new
  ones, but the chat template rendered them to other tokens (re-serialised tool arguments, ...);
- `reasoning_dropped`: the same, except that reasoning the earlier call sampled is gone;
- `subagent`: its first user message is text a tool call of another turn handed over (a Task tool);
- `compaction`: the same system prompt as an earlier call, a shorter history (a summary replaced it);
- `new_thread`: none of these (and the first call).
A turn without token ids is linked by its messages alone (`extends` when they continue). Retries
keep the link the proxy gave them (core/capture/retries.py); auxiliary turns (titles, summaries)
and failed calls belong to no branch. Nothing is re-tokenized: only the engine's ids are compared.
"""

from __future__ import annotations

import json
from typing import Any

from harness_env.models import GraphSummary, Turn

MIN_HANDED_TEXT = 16  # characters a tool call's argument needs to name a sub-agent's task


def link_turns(turns: list[Turn]) -> GraphSummary:
    """Set `parent`, `branch` and `link` on each turn (in place) and summarise the graph."""
    summary = GraphSummary(turns=len(turns))
    heads: list[Turn] = []  # per branch: its last turn
    answered: list[Turn] = []  # policy turns with an answer, in order
    for t in sorted(turns, key=lambda t: t.index):
        if t.link != "retry":  # a retry keeps the turn whose answer it was given as its parent
            t.parent = t.branch = t.link = None
            _link(t, heads, answered, summary)
        if t.link is not None:
            summary.links[t.link] = summary.links.get(t.link, 0) + 1
    summary.branches = len(heads)
    summary.weight_versions = sorted({t.weight_version for t in turns if t.purpose == "policy" and t.weight_version is not None})
    summary.spans_weight_versions = len(summary.weight_versions) > 1
    summary.stale_branches = sorted({t.branch for t in turns if t.stale and t.branch is not None})
    summary.sampled_tokens = sum(len(t.completion_token_ids) for t in turns if t.purpose == "policy" and t.answered)
    summary.auxiliary_tokens = sum(len(t.completion_token_ids) for t in turns if t.purpose == "auxiliary")
    return summary


def _link(t: Turn, heads: list[Turn], answered: list[Turn], summary: GraphSummary) -> None:
    if t.purpose == "auxiliary":
        summary.auxiliary_turns += 1
        t.link = "auxiliary"
        return
    if not t.answered:
        summary.failed_turns += 1
        return
    found = None
    if t.prompt_token_ids and t.completion_token_ids:
        # The latest branch first: a harness continues what it did last.
        found = next((b for b in range(len(heads) - 1, -1, -1) if t.continues(heads[b])), None)
    if found is None:
        t.parent, t.link = _why_new(t, answered)
        untokened = not (t.prompt_token_ids and t.completion_token_ids)
        if t.link == "template_rerender" and untokened:  # nothing to compare tokens with: the messages continue
            t.link = "extends"
            found = next((b for b, h in enumerate(heads) if h.index == t.parent), None)
    else:
        t.parent, t.link = heads[found].index, "extends"
    if found is None:
        heads.append(t)
        found = len(heads) - 1
    t.branch = found
    heads[found] = t
    answered.append(t)


def _why_new(t: Turn, earlier: list[Turn]) -> tuple[int | None, str]:
    """(parent, kind) of a turn whose tokens continue no branch."""
    for e in reversed(earlier):
        kind = _continues_messages(t.request_messages, e)
        if kind is not None:
            return e.index, kind
    task = _first_user_text(t.request_messages)
    for e in reversed(earlier):
        if any(_hands_over(call, task) for call in e.tool_calls):
            return e.index, "subagent"
    system = _system(t.request_messages)
    for e in reversed(earlier):
        # Shorter than e's thread had grown to when t was sent: e's history, its answer and a result
        # per tool call (Codex compacts right after the first call: its summary replaces those two).
        if system is not None and _system(e.request_messages) == system and _history(t) < _history(e) + 1 + len(e.tool_calls):
            return e.index, "compaction"
    return None, "new_thread"


def _continues_messages(messages: list[dict[str, Any]], e: Turn) -> str | None:
    """`template_rerender` when `messages` are `e`'s messages + `e`'s answer (+ more),
    `reasoning_dropped` when only after the reasoning is left out, else None."""
    n = len(e.request_messages)
    if len(messages) <= n or messages[n].get("role") != "assistant" or not is_answer(messages[n], e):
        return None
    if messages[:n] == e.request_messages and (not e.reasoning_text or _reasoning(messages[n]) == e.reasoning_text):
        return "template_rerender"
    if [_unreasoned(m) for m in messages[:n]] == [_unreasoned(m) for m in e.request_messages]:
        return "reasoning_dropped"
    return None


def is_answer(message: dict[str, Any], e: Turn) -> bool:
    """Whether `message` is the assistant message `e` answered: its tool calls (names and parsed
    arguments), else its text."""
    if e.tool_calls or message.get("tool_calls"):
        return [_call_key(c) for c in message.get("tool_calls") or []] == [_call_key(c) for c in e.tool_calls]
    return _text(message.get("content")).strip() == e.completion_text.strip()


def _call_key(call: dict[str, Any]) -> tuple[Any, Any]:
    fn = call.get("function") or {}
    return fn.get("name"), _parsed(fn.get("arguments"))


def _parsed(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _hands_over(call: dict[str, Any], task: str) -> bool:
    """Whether a tool call handed `task` (a first user message) to a thread of its own: one of
    its string arguments is in it."""
    if len(task) < MIN_HANDED_TEXT:
        return False
    args = _parsed((call.get("function") or {}).get("arguments"))
    values = args.values() if isinstance(args, dict) else [args]
    return any(isinstance(v, str) and len(v.strip()) >= MIN_HANDED_TEXT and v.strip() in task for v in values)


def _reasoning(message: dict[str, Any]) -> str:
    return str(message.get("reasoning_content") or message.get("reasoning") or "")


def _unreasoned(message: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k not in ("reasoning_content", "reasoning")}


def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def _system(messages: list[dict[str, Any]]) -> str | None:
    return next((_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer")), None)


def _first_user_text(messages: list[dict[str, Any]]) -> str:
    return next((_text(m.get("content")) for m in messages if m.get("role") == "user"), "")


def _history(t: Turn) -> int:
    return sum(1 for m in t.request_messages if m.get("role") not in ("system", "developer"))


def summarise_rows(summary: GraphSummary, rows) -> GraphSummary:
    """Fill the row-derived counts (trainable tokens, untrainable branches) into `summary`."""
    summary.trainable_tokens = sum(sum(r.loss_mask) for r in rows if r.trainable)
    summary.untrainable_branches = sum(1 for r in rows if not r.trainable)
    return summary
