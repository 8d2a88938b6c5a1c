"""The token view: a rollout's whole trajectory as a trainer sees it. Each model call in order, with
its place in the turn graph (branch, link kind, the call it continues); what is new in its prompt
(the messages and the count of prompt and tool tokens: loss mask 0) apart from what the engine
sampled (loss mask 1 when its branch is a trainable row), token by token, coloured by logprob.

Prompt tokens come as ids only (no text: nothing is re-tokenized), so the new prompt shows as the
messages that make it. Every call is collapsed but the first and the last, and a call shows at most
MAX_CALL_TOKENS tokens: a 40-call rollout's page stays light. Everything the model, a tool or the
task wrote is escaped."""

from __future__ import annotations

import math
from html import escape

from harness_env.models import RolloutResult, Turn
from harness_env.server.web.render_text import clip, content_text

MAX_CALL_TOKENS = 2_000  # completion tokens shown per model call; the JSON download has all
MAX_VIEW_TOKENS = 20_000  # in the whole view (about 200 bytes of HTML each)
MAX_PROMPT_CHARS = 2_000  # per message of a call's new prompt
LINK_WORDS = {
    "extends": "continues",
    "template_rerender": "re-renders (other tokens for the same messages) a branch of",
    "reasoning_dropped": "drops the reasoning of",
    "compaction": "compacts the history of",
    "subagent": "is a sub-agent started by",
    "retry": "retries",
}


def token_colour(logprob: float) -> str:
    """Red for an unlikely token, through yellow, to green for a sure one."""
    prob = math.exp(logprob) if math.isfinite(logprob) else 0.0
    return f"hsl({round(120 * prob)}, 85%, 82%)"


def token_title(turn: Turn, k: int) -> str:
    """A completion token's hover text: its id, logprob and the engine's top alternatives."""
    tid = turn.completion_token_ids[k] if k < len(turn.completion_token_ids) else None
    lp = turn.per_token_logps[k] if k < len(turn.per_token_logps) else None
    head = [f"id {tid}" if tid is not None else "id ?"]
    if lp is not None:
        head.append(f"logprob {lp:.4f} (p {math.exp(lp) if math.isfinite(lp) else 0.0:.3f})")
    alts = turn.top_logprobs[k] if k < len(turn.top_logprobs) else []
    lines = [" · ".join(head)]
    lines += [f"{a.token!r}{f' (id {a.token_id})' if a.token_id is not None else ''}: {a.logprob:.4f}" for a in alts]
    return "\n".join(lines) if not alts else lines[0] + "\nalternatives:\n" + "\n".join(lines[1:])


def _completion_size(turn: Turn) -> int:
    return max(len(turn.completion_token_ids), len(turn.completion_tokens), len(turn.per_token_logps))


def _new_prompt(turn: Turn, parent: Turn | None) -> tuple[list[dict], int]:
    """The messages of `turn`'s request that its parent's request and answer did not hold, and how
    many of its prompt tokens are new (all of them when it does not extend its parent's tokens)."""
    msgs = turn.request_messages
    if parent is not None and msgs[: len(parent.request_messages)] == parent.request_messages:
        msgs = msgs[len(parent.request_messages) + 1 :]  # + 1: the parent's answer, replayed
    tokens = len(turn.prompt_token_ids)
    if parent is not None and turn.continues(parent):
        tokens -= len(parent.prompt_token_ids) + len(parent.completion_token_ids)
    return msgs, tokens


def _message_html(msg: dict) -> str:
    role = str(msg.get("role") or "?")
    text = content_text(msg.get("content"))
    if not text and msg.get("tool_calls"):
        text = "(tool calls of the replayed answer)"
    name = f" {msg.get('name') or msg.get('tool_call_id') or ''}".rstrip() if role == "tool" else ""
    return (
        f'<div class="he-pmsg" data-role="{escape(role)}"><span class="he-role">{escape(role + name)}</span>'
        f"<pre>{escape(clip(text, MAX_PROMPT_CHARS))}</pre></div>"
    )


def _tokens_html(turn: Turn, n: int, limit: int) -> str:
    spans = []
    for k in range(min(n, limit)):
        text = (
            turn.completion_tokens[k]
            if k < len(turn.completion_tokens)
            else (f"<id {turn.completion_token_ids[k]}>" if k < len(turn.completion_token_ids) else "?")
        )
        lp = turn.per_token_logps[k] if k < len(turn.per_token_logps) else None
        style = f' style="background: {token_colour(lp)}"' if lp is not None else ""
        spans.append(f'<span class="he-tok"{style} title="{escape(token_title(turn, k))}">{escape(text)}</span>')
    more = f'<p class="he-empty">... {n - len(spans)} more tokens in the JSON download</p>' if len(spans) < n else ""
    return "".join(spans) + more


def _graph_html(result: RolloutResult, rows: list) -> str:
    links = ", ".join(f"{n} {escape(kind)}" for kind, n in result.graph.links.items()) or "none"
    items = []
    for r in rows:
        state = (
            f"trained: {sum(r.loss_mask)} sampled tokens (loss mask 1) of {len(r.token_ids)}"
            if r.trainable
            else f"not trained: {escape(r.untrainable_reason or '')}"
        )
        items.append(f'<li data-branch="{r.branch}">branch {r.branch}: call(s) {", ".join(map(str, r.turn_indices))} · {state}</li>')
    return (
        f'<div class="he-graph"><p>{len(result.proxy_turns)} model call(s) · {result.graph.branches} branch(es) · '
        f"{result.graph.auxiliary_turns} auxiliary · links: {links}</p><ul>{''.join(items)}</ul></div>"
    )


def trajectory_tokens_html(result: RolloutResult, call_limit: int = MAX_CALL_TOKENS, limit: int = MAX_VIEW_TOKENS) -> str:
    """The token view of `result` (module doc)."""
    turns = sorted(result.proxy_turns, key=lambda t: t.index)
    if not any(_completion_size(t) or t.prompt_token_ids for t in turns):
        return '<p class="he-empty">no tokens were captured (capture level text, or black_box mode)</p>'
    rows = result.training_rows()
    trained = {i for r in rows if r.trainable for i in r.turn_indices}
    why_not = {i: r.untrainable_reason for r in rows if not r.trainable for i in r.turn_indices}
    by_index = {t.index: t for t in turns}
    calls, shown = [], 0
    for pos, turn in enumerate(turns):
        parent = by_index.get(turn.parent) if turn.parent is not None else None
        msgs, new_tokens = _new_prompt(turn, parent)
        n = _completion_size(turn)
        is_trained = turn.index in trained
        if is_trained:
            state = "trained (loss mask 1)"
        elif turn.purpose == "auxiliary":
            state = "not trained: an auxiliary call"
        else:
            state = f"not trained: {why_not.get(turn.index) or 'in no branch (a failed or retried call)'}"
        link = turn.link or "-"
        where = f"branch {turn.branch}" if turn.branch is not None else "no branch"
        follows = f" · {LINK_WORDS[link]} call {turn.parent}" if link in LINK_WORDS and turn.parent is not None else f" · {escape(link)}"
        mean = [lp for lp in turn.per_token_logps if math.isfinite(lp)]
        mean_text = f" · mean logprob {sum(mean) / len(mean):.3f}" if mean else ""
        prompt = "".join(_message_html(m) for m in msgs) or '<p class="he-empty">no new messages</p>'
        body = _tokens_html(turn, n, max(0, min(call_limit, limit - shown)))
        shown += min(n, call_limit)
        is_open = " open" if pos in (0, len(turns) - 1) else ""
        calls.append(
            f'<details class="he-tcall" data-turn="{turn.index}" data-branch="{"" if turn.branch is None else turn.branch}" '
            f'data-link="{escape(link)}" data-trained="{int(is_trained)}"{is_open}>'
            f"<summary>call {turn.index} · {turn.purpose} · {where}{follows} · +{new_tokens} prompt and tool tokens · "
            f"{n} sampled tokens, {state}{mean_text}</summary>"
            f'<div class="he-prompt" data-mask="0"><span class="he-part">prompt and tool tokens (loss mask 0): {new_tokens} new'
            f"</span>{prompt}</div>"
            f'<div class="he-tokens {"he-trained" if is_trained else "he-untrained"}" data-mask="{int(is_trained)}">'
            f'<span class="he-part">sampled ({state})</span>{body}</div></details>'
        )
    key = (
        '<p class="he-token-key">grey: prompt and tool tokens (loss mask 0); coloured: what the engine sampled, by logprob '
        "(red: unlikely, green: sure), outlined when it is not trained; hover a token for its id, logprob and the alternatives</p>"
    )
    return key + _graph_html(result, rows) + "".join(calls)
