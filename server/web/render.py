"""Pure functions that turn a RolloutResult (and PhaseEvents) into what the page shows.

No Gradio here: every function takes plain data and returns HTML, Markdown, rows or chat messages,
so each can be unit-tested without a browser. Everything that came from the sandbox or the model
(commands, outputs, file contents, tokens) is HTML-escaped: an agent must not be able to inject
markup into the page of the person watching it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from html import escape
from typing import Any

from harness_env.models import CommandResult, HarborRunInfo, PhaseEvent, RolloutResult, Turn

MAX_SHOWN_CHARS = 20_000  # per output or file shown inline; the JSON download has everything
LOWEST_TOKENS = 10
MAX_STEP_MESSAGE_CHARS = 300  # per trajectory step in the Harbor tab
MAX_TRAJECTORY_STEPS = 200
PLOT_W, PLOT_H, PLOT_PAD = 760, 260, 40
TURN_COLOURS = ("#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2")


def _clip(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... ({len(text) - limit} more characters in the JSON download)"


# -- live log -------------------------------------------------------------------------------------
def log_line(ev: PhaseEvent) -> str:
    """One line of the live phase log: elapsed time, phase, status, detail."""
    if ev.status == "info":  # e.g. one model call the proxy saw
        return f"{ev.elapsed_s:7.2f}s  {ev.phase:<8} · {ev.detail}".rstrip()
    detail = f"  {ev.detail}" if ev.detail else ""
    return f"{ev.elapsed_s:7.2f}s  {ev.phase:<8} {ev.status}{detail}".rstrip()


def status_line(state: str, elapsed_s: float, phase: str = "") -> str:
    where = f" ({phase})" if phase else ""
    return f"**{state}**{where} · {elapsed_s:.1f} s"


# -- reward and summary ---------------------------------------------------------------------------
def format_reward(reward: float | None) -> str:
    return "-" if reward is None else str(round(reward, 4))


def _reward_class(result: RolloutResult) -> str:
    # A judge's score is a grade, not a verdict: between 0 and 1 it is partial credit.
    if result.reward_source == "judge" and 0 < (result.reward or 0) < 1:
        return "partial"
    return "pass" if (result.reward or 0) >= 1.0 else "fail"


def reward_html(result: RolloutResult | None, cancelled: bool = False) -> str:
    """The reward, big: green when it passed (reward >= 1), amber for a judge's partial score, red
    otherwise, grey when there is none."""
    if result is None:
        label, cls = ("cancelled", "none") if cancelled else ("-", "none")
        return f'<div class="he-reward he-{cls}" data-reward=""><span class="he-reward-value">{label}</span></div>'
    if result.reward is None:
        label, cls = "no reward", "none"
    else:
        label, cls = format_reward(result.reward), _reward_class(result)
    why = f'<div class="he-reward-error">{escape(result.error_kind or "")}: {escape(_clip(result.error or "", 500))}</div>' if result.error else ""
    value = "" if result.reward is None else format_reward(result.reward)
    return (f'<div class="he-reward he-{cls}" data-reward="{escape(value)}">'
            f'<span class="he-reward-label">reward</span><span class="he-reward-value">{escape(label)}</span>{why}</div>')


def summary_markdown(result: RolloutResult) -> str:
    policy = [t for t in result.proxy_turns if t.purpose == "policy"]
    rows = [
        ("harness", result.harness),
        ("mode", result.mode),
        ("capture level", f"{result.capture_level} (tokens > logprobs > text)"),
        ("rollout type", f"{result.rollout_type}: {result.rollout_type_reason}" if result.rollout_type_reason else result.rollout_type),
        ("turn graph", f"{result.graph.branches} branch(es), {result.graph.auxiliary_turns} auxiliary turn(s), "
                       f"{result.graph.trainable_tokens} trainable tokens"),
        ("wall time", f"{result.wall_s:.2f} s"),
        ("model calls", f"{len(result.proxy_turns)} ({len(policy)} policy)"),
        ("agent tool calls", "-" if result.agent_tool_calls is None else str(result.agent_tool_calls)),
        ("agent exit code", "-" if result.agent_exit_code is None else str(result.agent_exit_code)),
        ("reward source", result.reward_source or "-"),
        ("sandbox", f"{result.sandbox_backend or '-'} {result.sandbox_id}".strip()),
        ("turn limit hit", "yes" if result.turn_limit_hit else "no"),
    ]
    if result.error:
        rows.append(("error", f"{result.error_kind}: {result.error.splitlines()[0][:300]}"))
    for note in result.reward_notes + result.sandbox_notes:
        rows.append(("note", note))
    if result.dropped_fields:
        rows.append(("dropped fields", ", ".join(result.dropped_fields)))
    lines = ["| rollout | |", "| --- | --- |"]
    lines += [f"| {k} | {_md_cell(v)} |" for k, v in rows]
    return "\n".join(lines)


def _md_cell(text: str) -> str:
    return escape(text).replace("|", "&#124;").replace("\n", " ")


# -- verify table and files -----------------------------------------------------------------------
def _output_details(name: str, text: str) -> str:
    if not text:
        return f'<span class="he-empty">no {name}</span>'
    n = text.count("\n") + (0 if text.endswith("\n") else 1)
    return f"<details><summary>{name} ({n} lines)</summary><pre>{escape(_clip(text))}</pre></details>"


def commands_html(results: list[CommandResult], empty: str = "no verify commands ran") -> str:
    """Verify (or setup) results as a table: command, exit code, duration; stdout/stderr expandable."""
    if not results:
        return f'<p class="he-empty">{escape(empty)}</p>'
    rows = []
    for r in results:
        code = "timed out" if r.timed_out else ("-" if r.exit_code is None else str(r.exit_code))
        cls = "he-ok" if r.exit_code == 0 and not r.timed_out else "he-bad"
        rows.append(
            f'<tr class="{cls}"><td><code>{escape(r.cmd)}</code></td><td class="he-code">{escape(code)}</td>'
            f"<td>{r.duration_s:.2f} s</td><td>{_output_details('stdout', r.stdout)}{_output_details('stderr', r.stderr)}</td></tr>"
        )
    return ('<table class="he-table he-commands"><thead><tr><th>command</th><th>exit code</th><th>duration</th>'
            f"<th>output</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def files_html(files: dict[str, str]) -> str:
    """The workspace's files after the rollout, each expandable."""
    if not files:
        return '<p class="he-empty">no files collected</p>'
    items = [
        f'<details class="he-file"><summary><code>{escape(path)}</code> ({len(content)} chars)</summary>'
        f"<pre>{escape(_clip(content))}</pre></details>"
        for path, content in sorted(files.items())
    ]
    return "".join(items)


# -- conversation ---------------------------------------------------------------------------------
def _content_text(content: Any) -> str:
    """OpenAI message content: a string, or a list of parts (text parts kept, others named)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                out.append(str(part.get("text", "")))
            elif isinstance(part, dict):
                out.append(f"[{part.get('type', 'part')}]")
            else:
                out.append(str(part))
        return "\n".join(out)
    return json.dumps(content)


def _code_block(text: str, lang: str = "") -> str:
    fence = "````" if "```" in text else "```"
    return f"{fence}{lang}\n{_clip(text)}\n{fence}"


def _tool_call_messages(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for call in calls:
        fn = call.get("function") or {}
        args = fn.get("arguments", "")
        try:
            args = json.dumps(json.loads(args), indent=2)
        except (TypeError, ValueError):
            pass
        out.append({"role": "assistant", "content": _code_block(str(args), "json"),
                    "metadata": {"title": f"tool call: {fn.get('name', '?')}"}})
    return out


def _message_to_chat(msg: dict[str, Any]) -> list[dict[str, Any]]:
    role = msg.get("role", "")
    text = _content_text(msg.get("content"))
    if role == "user":
        return [{"role": "user", "content": text}]
    if role in ("system", "developer"):
        return [{"role": "assistant", "content": _code_block(text), "metadata": {"title": f"{role} prompt", "status": "done"}}]
    if role == "tool":
        name = msg.get("name") or msg.get("tool_call_id") or ""
        return [{"role": "assistant", "content": _code_block(text), "metadata": {"title": f"tool result {name}".strip()}}]
    out: list[dict[str, Any]] = []
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning:
        out.append({"role": "assistant", "content": str(reasoning), "metadata": {"title": "reasoning", "status": "done"}})
    if text:
        out.append({"role": "assistant", "content": text})
    out += _tool_call_messages(msg.get("tool_calls") or [])
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
            messages.append({"role": "assistant", "content": f"model call {turn.index} starts a new branch", "metadata": {"title": "new branch"}})
            prev = []
        for msg in req[len(prev):]:
            messages += _message_to_chat(msg)
        nxt = turns[i + 1].request_messages if i + 1 < len(turns) else None
        if nxt is None or nxt[: len(req)] != req:
            messages += _message_to_chat(_answer_message(turn))
        if turn.upstream_error:
            messages.append({"role": "assistant", "content": _code_block(turn.upstream_error),
                             "metadata": {"title": f"model call {turn.index} failed ({turn.upstream_status})"}})
        prev = req
    return messages


def _answer_message(turn: Turn) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": turn.completion_text or None}
    if turn.reasoning_text:
        msg["reasoning_content"] = turn.reasoning_text
    if turn.tool_calls:
        msg["tool_calls"] = turn.tool_calls
    return msg


# -- logprobs -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenPoint:
    turn: int  # the turn's index
    position: int  # position within the rollout's completion tokens (0-based)
    token: str
    logprob: float


def logprob_points(turns: list[Turn]) -> list[TokenPoint]:
    """One point per completion token that has a logprob, numbered across the rollout's turns."""
    points: list[TokenPoint] = []
    for turn in turns:
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

    parts = [f'<svg class="he-logprob-plot" viewBox="0 0 {w} {h}" width="100%" role="img" aria-label="per-token logprobs">',
             f'<line x1="{pad}" y1="{y(0):.1f}" x2="{w - pad}" y2="{y(0):.1f}" stroke="#999" stroke-width="0.5"/>',
             f'<text x="{pad - 4}" y="{y(0) + 4:.1f}" font-size="10" text-anchor="end">0</text>',
             f'<text x="{pad - 4}" y="{y(lo) + 4:.1f}" font-size="10" text-anchor="end">{lo:.2f}</text>',
             f'<text x="{w / 2:.0f}" y="{h - 4}" font-size="10" text-anchor="middle">completion token position (all turns)</text>']
    turn_order = {t: i for i, t in enumerate(dict.fromkeys(p.turn for p in points))}
    prev_turn = None
    for p in points:
        if p.turn != prev_turn:  # a dashed line and a label where each turn starts
            parts.append(f'<line x1="{x(p.position):.1f}" y1="{pad / 2}" x2="{x(p.position):.1f}" y2="{h - pad}" stroke="#ccc" stroke-dasharray="3,3"/>'
                         f'<text x="{x(p.position) + 2:.1f}" y="{pad / 2 - 4}" font-size="10">turn {p.turn}</text>')
            prev_turn = p.turn
        colour = TURN_COLOURS[turn_order[p.turn] % len(TURN_COLOURS)]
        parts.append(f'<circle class="he-token" cx="{x(p.position):.1f}" cy="{y(p.logprob):.1f}" r="3" fill="{colour}" data-turn="{p.turn}">'
                     f"<title>turn {p.turn}, token {p.position}: {escape(repr(p.token))}  logprob {p.logprob:.4f}</title></circle>")
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
    lines = [f"**{len(points)} tokens**, mean logprob **{mean:.4f}** (perplexity {math.exp(-mean):.3f}); {turn_means}", "",
             f"Lowest-probability tokens:", "", "| turn | position | token | logprob | probability |", "| --- | --- | --- | --- | --- |"]
    for p in sorted(points, key=lambda p: p.logprob if math.isfinite(p.logprob) else -math.inf)[:lowest]:
        prob = math.exp(p.logprob) if math.isfinite(p.logprob) else 0.0
        lines.append(f"| {p.turn} | {p.position} | <code>{_md_cell(repr(p.token))}</code> | {p.logprob:.4f} | {prob:.3f} |")
    return "\n".join(lines)


# -- history and the raw JSON ---------------------------------------------------------------------
HISTORY_HEADERS = ["#", "reward", "harness", "duration (s)", "status", "task"]


def history_row(n: int, result: RolloutResult | None, harness: str, wall_s: float, instruction: str, cancelled: bool = False) -> list[Any]:
    if result is None:
        reward, status = "-", "cancelled" if cancelled else "no result"
    else:
        reward = format_reward(result.reward)
        status = result.error_kind or "ok"
    task = instruction.strip().splitlines()[0][:60] if instruction.strip() else ""
    return [n, reward, harness, round(wall_s, 2), status, task]


def redact(value: Any, secrets: list[str]) -> Any:
    """Replace every occurrence of a secret (the upstream key) in strings, recursively.

    The result never carries the key by construction; this guards against an upstream that
    echoes it back in an error message.
    """
    secrets = [s for s in secrets if s and len(s) >= 4]
    if not secrets:
        return value
    if isinstance(value, str):
        for s in secrets:
            value = value.replace(s, "[redacted]")
        return value
    if isinstance(value, list):
        return [redact(v, secrets) for v in value]
    if isinstance(value, dict):
        return {redact(k, secrets): redact(v, secrets) for k, v in value.items()}
    return value


def result_json(result: RolloutResult) -> str:
    return json.dumps(result.model_dump(mode="json"), indent=2)


# -- task-family grading (svg_icon) ---------------------------------------------------------------
_B64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")


def png_img(b64: Any, alt: str, css_class: str) -> str:
    """An <img> of an inline base64 PNG, or a note when the data is missing or not plain base64
    (nothing but base64 characters ever reaches the src attribute)."""
    if not isinstance(b64, str) or not b64 or not _B64.fullmatch(b64):
        return f'<p class="he-empty">no {escape(alt)}</p>'
    return f'<img class="{escape(css_class)}" alt="{escape(alt)}" src="data:image/png;base64,{b64}"/>'


def _num(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else escape(str(value))
    return str(round(value, digits))


def grading_html(grading: dict[str, Any] | None, reference_png_b64: str | None = None) -> str:
    """A task family's grading evidence: the rendered icon next to the reference, why it scored 0
    (if it did), and the judge's per-dimension scores, weighted reward, attempts, time and raw answer."""
    if not grading:
        return '<p class="he-empty">no task-family grading (a shell task is graded by its verify commands)</p>'
    g = grading
    images = (f'<div class="he-images"><figure>{png_img(g.get("rendered_png_b64"), "rendered icon", "he-rendered")}'
              f"<figcaption>rendered icon</figcaption></figure>")
    if reference_png_b64 is not None:
        images += f'<figure>{png_img(reference_png_b64, "reference image", "he-reference")}<figcaption>reference</figcaption></figure>'
    images += "</div>"
    reasons = g.get("zero_reasons") or []
    timings = g.get("timings") or {}
    facts = [("renderer", escape(str(g.get("renderer", "-")))),
             ("page valid", "yes" if g.get("page_valid") else "no"),
             ("zero reasons", "<ul>" + "".join(f"<li><code>{escape(str(r))}</code></li>" for r in reasons) + "</ul>" if reasons else "none"),
             ("timings", escape(", ".join(f"{k}: {_num(v)} s" for k, v in timings.items())) or "-")]
    judge = g.get("judge")
    if isinstance(judge, dict):
        facts += [("judge model", escape(str(judge.get("judge_model") or "-"))),
                  ("judge attempts", _num(judge.get("attempts"))),
                  ("judge time", f"{_num(judge.get('seconds'))} s")]
        if judge.get("error"):
            facts.append(("judge error", f"<code>{escape(_clip(str(judge['error']), 2000))}</code>"))
    facts_html = ('<table class="he-table he-grading-facts"><tbody>'
                  + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts) + "</tbody></table>")
    return f'<div class="he-grading">{images}{facts_html}{_judge_scores_html(judge)}</div>'


def _judge_scores_html(judge: Any) -> str:
    if not isinstance(judge, dict):
        return '<p class="he-empty">the judge was not asked</p>'
    scores = judge.get("scores") or {}
    rows = []
    for name, s in scores.items():
        s = s if isinstance(s, dict) else {}
        rows.append(f'<tr data-dimension="{escape(str(name))}"><td><code>{escape(str(name))}</code></td>'
                    f"<td>{_num(s.get('score'))}</td><td>{_num(s.get('weight'))}</td><td>{escape(_clip(str(s.get('reason') or ''), 2000))}</td></tr>")
    reward = judge.get("reward")
    table = ('<table class="he-table he-scores"><thead><tr><th>dimension</th><th>score</th><th>weight</th><th>reason</th></tr></thead>'
             f"<tbody>{''.join(rows)}</tbody><tfoot><tr><th>weighted reward</th>"
             f'<th class="he-judge-reward" colspan="3">{escape(format_reward(reward) if isinstance(reward, (int, float)) else "-")}</th></tr></tfoot></table>')
    if not rows:
        table = '<p class="he-empty">no per-dimension scores</p>' + table
    raw = judge.get("raw_answer")
    raw_html = (f"<details><summary>raw judge answer ({len(str(raw))} chars)</summary><pre>{escape(_clip(str(raw)))}</pre></details>"
                if raw else '<p class="he-empty">no raw judge answer</p>')
    return table + raw_html


# -- Harbor (harness="harbor") --------------------------------------------------------------------
def harbor_html(info: HarborRunInfo | None, trajectory: dict[str, Any] | None = None) -> str:
    """What Harbor ran (task, agent and version, sandbox, Harbor's exception, the verifier's reward
    map), then the agent's ATIF trajectory, compactly: one row per step."""
    if info is None:
        return '<p class="he-empty">not a Harbor rollout (harness=harbor shows its task, agent and trajectory here)</p>'
    task = info.task_name or "-"
    if info.task_path:
        task += f" ({info.task_path})"
    agent = f"{info.agent or '-'} {info.agent_version}" if info.agent_version else (info.agent or "-")
    facts = [("task", f"<code>{escape(task)}</code>"),
             ("agent", f'<span class="he-harbor-agent">{escape(agent)}</span>'),
             ("sandbox", escape(info.sandbox or "-")),
             ("exception", f'<code class="he-harbor-exception">{escape(_clip(info.exception, 2000))}</code>' if info.exception else "none"),
             ("verifier rewards", _rewards_table(info.verifier_rewards))]
    table = ('<table class="he-table he-harbor-facts"><tbody>'
             + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts) + "</tbody></table>")
    return f'<div class="he-harbor">{table}{trajectory_html(trajectory)}</div>'


def _rewards_table(rewards: dict[str, float] | None) -> str:
    if not rewards:
        return '<span class="he-empty">no reward map (a single reward, or none)</span>'
    rows = "".join(f'<tr data-key="{escape(str(k))}"><td><code>{escape(str(k))}</code></td><td>{_num(v, 4)}</td></tr>'
                   for k, v in rewards.items())
    return f'<table class="he-table he-harbor-rewards"><tbody>{rows}</tbody></table>'


def _step_message(message: Any) -> str:
    """An ATIF step's message (a string, or content parts: text kept, others named), shortened."""
    if isinstance(message, list):
        parts = [str(p.get("text") or "") if isinstance(p, dict) and p.get("type") == "text"
                 else f"[{p.get('type', 'part')}]" if isinstance(p, dict) else str(p) for p in message]
        message = "\n".join(parts)
    text = "" if message is None else str(message)
    return text if len(text) <= MAX_STEP_MESSAGE_CHARS else text[:MAX_STEP_MESSAGE_CHARS] + " ..."


def _tool_call_names(calls: Any) -> list[str]:
    if not isinstance(calls, list):
        return []
    return [str(c.get("function_name") or "?") if isinstance(c, dict) else "?" for c in calls]


def trajectory_html(trajectory: dict[str, Any] | None) -> str:
    """The agent's ATIF trajectory (Harbor's trajectory.json) as a table: step, source, message
    (shortened), tool call names, and how many observation results came back. Everything is
    escaped: it is what the agent and its tools wrote."""
    if not isinstance(trajectory, dict):
        return '<p class="he-empty">no agent trajectory (this agent writes none)</p>'
    steps = trajectory.get("steps") if isinstance(trajectory.get("steps"), list) else []
    agent = trajectory.get("agent") if isinstance(trajectory.get("agent"), dict) else {}
    who = " ".join(str(agent[k]) for k in ("name", "version") if agent.get(k))
    model = f" · model {agent['model_name']}" if agent.get("model_name") else ""
    head = (f'<p class="he-trajectory-head">trajectory {escape(str(trajectory.get("schema_version") or "-"))}'
            f" · {escape(who or 'agent -')}{escape(model)} · {len(steps)} step(s)</p>")
    rows = []
    for step in steps[:MAX_TRAJECTORY_STEPS]:
        step = step if isinstance(step, dict) else {}
        source = str(step.get("source") or "?")
        names = _tool_call_names(step.get("tool_calls"))
        obs = step.get("observation")
        results = obs.get("results") if isinstance(obs, dict) and isinstance(obs.get("results"), list) else []
        rows.append(f'<tr class="he-step" data-source="{escape(source)}"><td>{escape(str(step.get("step_id", "")))}</td>'
                    f"<td>{escape(source)}</td><td><pre>{escape(_step_message(step.get('message')))}</pre></td>"
                    f"<td>{', '.join(f'<code>{escape(n)}</code>' for n in names) or '-'}</td>"
                    f"<td>{len(results) or '-'}</td></tr>")
    more = (f'<p class="he-empty">... {len(steps) - MAX_TRAJECTORY_STEPS} more steps in the JSON download</p>'
            if len(steps) > MAX_TRAJECTORY_STEPS else "")
    table = ('<table class="he-table he-trajectory"><thead><tr><th>step</th><th>source</th><th>message</th>'
             f"<th>tool calls</th><th>observations</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")
    return head + (table if rows else '<p class="he-empty">no steps</p>') + more
