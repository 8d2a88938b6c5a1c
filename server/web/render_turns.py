"""The model's side of a rollout, for the page: the conversation as chat messages (what is new in
each policy turn's request, and answers that were not replayed), and the per-token logprobs as an
inline SVG scatter plot and a summary. Pure functions of the captured turns; everything the model or
the sandbox wrote is escaped."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from html import escape
from typing import Any

from harness_env.models import RolloutResult, Turn
from harness_env.server.web.render_text import content_text, html_text, md_cell

LOWEST_TOKENS = 10
PLOT_W, PLOT_H, PLOT_PAD = 760, 260, 40
TURN_COLOURS = ("#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2")
LABEL_GAP = 48  # plot units between two turn labels ("turn 100" is about 40 wide at font size 10)
MAX_CHAT_MESSAGES = 5_000  # messages in the conversation pane (a Chatbot message costs the page far more than its text)
MAX_PLOT_POINTS = 10_000  # circles in the logprob plot (about 150 bytes of SVG each); more are thinned evenly


# -- conversation ---------------------------------------------------------------------------------
# The Chatbot shows what these give as HTML, without Markdown (result_area.py): everything the
# model, a tool or the task wrote is escaped here, so it shows as text (no image or video loads,
# no link or form renders), in a <pre> when its spacing matters.
def _text(text: str) -> str:
    return html_text(text, "div", "he-chat-text")


def _code(text: str) -> str:
    return html_text(text, "pre", "he-chat-code")


def _meta(title: str, **more: str) -> dict[str, str]:
    return {"title": escape(title), **more}


def _tool_call_messages(calls: Any) -> list[dict[str, Any]]:
    out = []
    for call in calls if isinstance(calls, list) else []:
        fn = call.get("function") if isinstance(call, dict) and isinstance(call.get("function"), dict) else {}
        args = fn.get("arguments", "")
        try:
            args = json.dumps(json.loads(args), indent=2)
        except (TypeError, ValueError, RecursionError):
            pass
        out.append({"role": "assistant", "content": _code(str(args)), "metadata": _meta(f"tool call: {fn.get('name', '?')}")})
    return out


def _message_to_chat(msg: dict[str, Any]) -> list[dict[str, Any]]:
    role = msg.get("role", "")
    text = content_text(msg.get("content"))
    if role == "user":
        return [{"role": "user", "content": _text(text)}]
    if role in ("system", "developer"):
        return [{"role": "assistant", "content": _code(text), "metadata": _meta(f"{role} prompt", status="done")}]
    if role == "tool":
        name = str(msg.get("name") or msg.get("tool_call_id") or "")
        return [{"role": "assistant", "content": _code(text), "metadata": _meta(f"tool result {name}".strip())}]
    out: list[dict[str, Any]] = []
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning:
        out.append({"role": "assistant", "content": _text(str(reasoning)), "metadata": _meta("reasoning", status="done")})
    if text:
        out.append({"role": "assistant", "content": _text(text)})
    out += _tool_call_messages(msg.get("tool_calls"))
    return out


def conversation(result: RolloutResult) -> list[dict[str, Any]]:
    """The agent's conversation as Chatbot messages (role, content, metadata for tool calls).

    Each policy turn's request holds the history the model saw; only what is new since the
    previous request is shown (earlier answers come back in it as the harness replays them). A
    turn whose answer is not replayed by the next request (the last turn, or one before a new
    branch, e.g. after compaction) gets its captured answer shown.
    """
    turns = [t for t in result.proxy_turns if t.purpose == "policy"] or list(result.proxy_turns)
    messages: list[dict[str, Any]] = []
    prev: list[dict[str, Any]] = []
    for i, turn in enumerate(turns):
        req = turn.request_messages
        if prev and req[: len(prev)] != prev:
            messages.append({"role": "assistant", "content": _text(f"model call {turn.index} starts a new branch"), "metadata": _meta("new branch")})
            prev = []
        for msg in req[len(prev) :]:
            messages += _message_to_chat(msg)
            if len(messages) > MAX_CHAT_MESSAGES:
                break
        nxt = turns[i + 1].request_messages if i + 1 < len(turns) else None
        if nxt is None or nxt[: len(req)] != req:
            messages += _message_to_chat(_answer_message(turn))
        if turn.upstream_error:
            messages.append(
                {"role": "assistant", "content": _code(turn.upstream_error), "metadata": _meta(f"model call {turn.index} failed ({turn.upstream_status})")}
            )
        prev = req
        if len(messages) > MAX_CHAT_MESSAGES:
            break
    if len(messages) > MAX_CHAT_MESSAGES:
        messages = messages[:MAX_CHAT_MESSAGES]
        messages.append(
            {
                "role": "assistant",
                "content": _text(f"the conversation goes on: the first {MAX_CHAT_MESSAGES} messages are shown here, the JSON download has every model call"),
                "metadata": _meta("cut here"),
            }
        )
    return messages


def _answer_message(turn: Turn) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": turn.completion_text or None}
    if turn.reasoning_text:
        msg["reasoning_content"] = turn.reasoning_text
    if turn.tool_calls:
        msg["tool_calls"] = turn.tool_calls
    return msg


# -- logprobs -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)  # slots: one per token of the rollout
class TokenPoint:
    turn: int  # the turn's index
    position: int  # position within the rollout's completion tokens (0-based)
    token: str
    logprob: float


def logprob_points(turns: list[Turn]) -> list[TokenPoint]:
    """One point per completion token that has a logprob, numbered across the rollout's policy
    turns. Auxiliary calls (titles, summaries) are left out: they are not the policy's samples,
    and a short one before the first policy turn took that turn's label in the plot."""
    points: list[TokenPoint] = []
    for turn in (t for t in turns if t.purpose == "policy"):
        for k, lp in enumerate(turn.per_token_logps):
            if k < len(turn.completion_tokens):
                token = turn.completion_tokens[k]
            elif k < len(turn.completion_token_ids):
                token = f"<id {turn.completion_token_ids[k]}>"
            else:
                token = "?"
            points.append(TokenPoint(turn.index, len(points), token, lp))
    return points


def logprob_svg(points: list[TokenPoint]) -> str:
    """A scatter plot (position vs logprob) as inline SVG: one circle per token, hover shows it.

    Inline SVG needs no plotting library, loads nothing from the network, and each circle's
    <title> is the browser's own tooltip.
    """
    if not points:
        return '<p class="he-empty">no per-token logprobs were captured (capture level text, or black_box mode)</p>'
    finite = [p.logprob for p in points if math.isfinite(p.logprob)]
    lo = min(min(finite, default=-1.0), -1e-3)
    n = len(points)
    w, h, pad = PLOT_W, PLOT_H, PLOT_PAD

    def x(pos: int) -> float:
        return pad + (w - 2 * pad) * (pos / max(n - 1, 1))

    def y(lp: float) -> float:
        lp = lp if math.isfinite(lp) else lo
        return pad / 2 + (h - 1.5 * pad) * (lp / lo)  # 0 at the top, the lowest at the bottom

    parts = [
        f'<svg class="he-logprob-plot" viewBox="0 0 {w} {h}" width="100%" role="img" aria-label="per-token logprobs">',
        f'<line x1="{pad}" y1="{y(0):.1f}" x2="{w - pad}" y2="{y(0):.1f}" stroke="#999" stroke-width="0.5"/>',
        f'<text x="{pad - 4}" y="{y(0) + 4:.1f}" font-size="10" text-anchor="end">0</text>',
        f'<text x="{pad - 4}" y="{y(lo) + 4:.1f}" font-size="10" text-anchor="end">{lo:.2f}</text>',
        f'<text x="{w / 2:.0f}" y="{h - 4}" font-size="10" text-anchor="middle">completion token position (all turns)</text>',
    ]
    turn_order = {t: i for i, t in enumerate(dict.fromkeys(p.turn for p in points))}
    prev_turn, label_x = None, -math.inf
    stride = math.ceil(n / MAX_PLOT_POINTS)  # a long rollout's plot stays a plot, not 100 MB of SVG
    if stride > 1:
        parts.append(f'<text class="he-thinned" x="{w - pad}" y="{h - 4}" font-size="10" text-anchor="end">every {stride}th of {n} tokens shown</text>')
    for p in points[::stride]:
        if p.turn != prev_turn:  # a dashed line where each turn starts; a label where it has room
            parts.append(f'<line x1="{x(p.position):.1f}" y1="{pad / 2}" x2="{x(p.position):.1f}" y2="{h - pad}" stroke="#ccc" stroke-dasharray="3,3"/>')
            if x(p.position) - label_x >= LABEL_GAP:
                label_x = x(p.position)
                parts.append(f'<text class="he-turn-label" x="{label_x + 2:.1f}" y="{pad / 2 - 4}" font-size="10">turn {p.turn}</text>')
            prev_turn = p.turn
        colour = TURN_COLOURS[turn_order[p.turn] % len(TURN_COLOURS)]
        parts.append(
            f'<circle class="he-token" cx="{x(p.position):.1f}" cy="{y(p.logprob):.1f}" r="3" fill="{colour}" data-turn="{p.turn}">'
            f"<title>turn {p.turn}, token {p.position}: {escape(repr(p.token))}  logprob {p.logprob:.4f}</title></circle>"
        )
    parts.append("</svg>")
    return "".join(parts)


def logprob_summary_markdown(points: list[TokenPoint], lowest: int = LOWEST_TOKENS) -> str:
    """Mean logprob (overall and per turn) and the lowest-probability tokens."""
    if not points:
        return ""
    finite = [p for p in points if math.isfinite(p.logprob)]
    mean = sum(p.logprob for p in finite) / len(finite) if finite else float("nan")
    per_turn: dict[int, list[float]] = {}
    for p in finite:
        per_turn.setdefault(p.turn, []).append(p.logprob)
    turn_means = ", ".join(f"turn {t}: {sum(v) / len(v):.3f}" for t, v in per_turn.items())
    lines = [
        f"**{len(points)} tokens**, mean logprob **{mean:.4f}** (perplexity {math.exp(-mean):.3f}); {turn_means}",
        "",
        "Lowest-probability tokens:",
        "",
        "| turn | position | token | logprob | probability |",
        "| --- | --- | --- | --- | --- |",
    ]
    for p in sorted(points, key=lambda p: p.logprob if math.isfinite(p.logprob) else -math.inf)[:lowest]:
        prob = math.exp(p.logprob) if math.isfinite(p.logprob) else 0.0
        lines.append(f"| {p.turn} | {p.position} | <code>{md_cell(repr(p.token))}</code> | {p.logprob:.4f} | {prob:.3f} |")
    return "\n".join(lines)
