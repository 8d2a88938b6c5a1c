"""Two rollouts side by side (a pass and a fail of one task, two harnesses, two models): their facts
(task, reward, tokens, ...), their steps aligned by number (what the agent said, the tool calls it
made and what came back) and their verify outputs. Cells that differ are marked. Pure functions of
two RolloutResults; everything the agent, a tool or the task wrote is escaped."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from html import escape

from harness_env.models import RolloutResult, Turn
from harness_env.server.web.render import commands_html
from harness_env.server.web.render_text import clip, content_text, format_reward

MAX_COMPARE_STEPS = 200  # steps shown; the JSON download has every model call
MAX_CELL_CHARS = 3_000  # per text, call or output in a cell
EMPTY = '<span class="he-empty">-</span>'


@dataclass
class Step:
    """One policy model call: what the model said, the tool calls it made, what they gave back."""

    text: str = ""
    calls: list[str] = field(default_factory=list)  # "name(arguments)"
    outputs: list[str] = field(default_factory=list)


def _call_text(call: dict) -> str:
    fn = call.get("function") if isinstance(call.get("function"), dict) else {}
    args = fn.get("arguments", "")
    try:
        args = json.dumps(json.loads(args), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        args = str(args)
    return f"{fn.get('name', '?')}({args})"


def _outputs(turn: Turn, following: list[dict]) -> list[str]:
    """The tool results for `turn`'s calls in the next request (by tool_call_id; without ids, the
    tool messages after its last assistant message)."""
    ids = {c.get("id") for c in turn.tool_calls if isinstance(c, dict) and c.get("id")}
    if ids:
        return [content_text(m.get("content")) for m in following if m.get("role") == "tool" and m.get("tool_call_id") in ids]
    last = max((k for k, m in enumerate(following) if m.get("role") == "assistant"), default=-1)
    return [content_text(m.get("content")) for m in following[last + 1 :] if m.get("role") == "tool"]


def steps(result: RolloutResult) -> list[Step]:
    """The rollout's policy model calls in order, as Steps."""
    turns = sorted((t for t in result.proxy_turns if t.purpose == "policy"), key=lambda t: t.index)
    out = []
    for i, t in enumerate(turns):
        following = turns[i + 1].request_messages if i + 1 < len(turns) else []
        calls = [_call_text(c) for c in t.tool_calls if isinstance(c, dict)]
        text = t.completion_text if not t.upstream_error else f"(the call failed: {t.upstream_error})"
        out.append(Step(text=text, calls=calls, outputs=_outputs(t, following) if calls else []))
    return out


def instruction(result: RolloutResult) -> str:
    """The task as the agent got it: the first user message of its first policy call."""
    for t in sorted(result.proxy_turns, key=lambda t: t.index):
        if t.purpose == "policy":
            return next((content_text(m.get("content")) for m in t.request_messages if m.get("role") == "user"), "")
    return ""


def _facts(r: RolloutResult) -> list[tuple[str, str]]:
    policy = [t for t in r.proxy_turns if t.purpose == "policy"]
    return [
        ("task", r.task_id or "-"),
        ("harness", r.harness or "-"),
        ("reward", format_reward(r.reward)),
        ("error", f"{r.error_kind}: {(r.error or '').splitlines()[0][:300] if r.error else ''}" if r.error_kind else "-"),
        ("wall time", f"{r.wall_s:.2f} s"),
        ("model calls", f"{len(r.proxy_turns)} ({len(policy)} policy)"),
        ("tool calls", str(sum(len(t.tool_calls) for t in policy))),
        ("sampled tokens", str(sum(len(t.completion_token_ids) or len(t.completion_tokens) for t in policy))),
        ("last prompt tokens", str(len(policy[-1].prompt_token_ids)) if policy else "-"),
        ("trained tokens", str(r.graph.trainable_tokens)),
        ("verify", f"{sum(1 for v in r.verify_results if v.exit_code == 0 and not v.timed_out)} of {len(r.verify_results)} passed"),
    ]


def _cell(parts: list[str], differs: bool) -> str:
    cls = ' class="he-differs"' if differs else ""
    return f"<td{cls}>{''.join(parts) or EMPTY}</td>"


def _step_parts(s: Step | None) -> list[str]:
    if s is None:
        return ['<span class="he-empty">no such step</span>']
    parts = [f'<pre class="he-said">{escape(clip(s.text, MAX_CELL_CHARS))}</pre>'] if s.text.strip() else []
    parts += [f'<pre class="he-call"><b>call</b> {escape(clip(c, MAX_CELL_CHARS))}</pre>' for c in s.calls]
    parts += [f'<details class="he-out"><summary>output ({len(o)} chars)</summary><pre>{escape(clip(o, MAX_CELL_CHARS))}</pre></details>' for o in s.outputs]
    return parts


def compare_html(a: RolloutResult, b: RolloutResult, label_a: str = "A", label_b: str = "B") -> str:
    """The two rollouts side by side: facts, instruction, steps aligned by number, verify outputs."""
    head = f"<thead><tr><th></th><th>{escape(label_a)}</th><th>{escape(label_b)}</th></tr></thead>"
    facts = "".join(
        f'<tr data-fact="{escape(k)}"><th>{escape(k)}</th>{_cell([escape(x)], x != y)}{_cell([escape(y)], x != y)}</tr>'
        for (k, x), (_, y) in zip(_facts(a), _facts(b))
    )
    ia, ib = instruction(a), instruction(b)
    facts += (
        f'<tr data-fact="instruction"><th>instruction</th>{_cell([f"<pre>{escape(clip(ia, MAX_CELL_CHARS))}</pre>"], ia != ib)}'
        f"{_cell([f'<pre>{escape(clip(ib, MAX_CELL_CHARS))}</pre>'], ia != ib)}</tr>"
    )
    sa, sb = steps(a), steps(b)
    n = max(len(sa), len(sb))
    rows = []
    for k in range(min(n, MAX_COMPARE_STEPS)):
        x, y = (sa[k] if k < len(sa) else None), (sb[k] if k < len(sb) else None)
        differs = x is None or y is None or x.calls != y.calls or x.outputs != y.outputs
        rows.append(f'<tr class="he-step" data-step="{k + 1}"><th>step {k + 1}</th>{_cell(_step_parts(x), differs)}{_cell(_step_parts(y), differs)}</tr>')
    more = f'<p class="he-empty">... {n - MAX_COMPARE_STEPS} more steps in the JSON downloads</p>' if n > MAX_COMPARE_STEPS else ""
    verify = f'<tr data-fact="verify output"><th>verify output</th><td>{commands_html(a.verify_results)}</td><td>{commands_html(b.verify_results)}</td></tr>'
    return (
        f'<table class="he-compare he-compare-facts">{head}<tbody>{facts}</tbody></table>'
        f"<h4>steps (policy model calls, aligned by number; a marked row differs)</h4>"
        f'<table class="he-compare he-compare-steps">{head}<tbody>{"".join(rows)}</tbody></table>{more}'
        f'<h4>verify</h4><table class="he-compare he-compare-verify">{head}<tbody>{verify}</tbody></table>'
    )
