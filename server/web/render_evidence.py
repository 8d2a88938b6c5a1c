"""Evidence of how a rollout was graded or run, for the page: a task family's grading (the rendered
icon beside the reference, zero reasons, the judge's scores and raw answer) and a harness's own
account of what it ran (its result_facts, e.g. a Harbor trial's, and the agent's ATIF trajectory). Pure functions of plain
data; everything that came from the sandbox, the agent or the judge is escaped."""

from __future__ import annotations

import re
from html import escape
from typing import Any

from harness_env.core.harness import RunFact
from harness_env.server.web.render_text import clip, content_text, format_reward, num

MAX_STEP_MESSAGE_CHARS = 300  # per trajectory step in a harness's own tab
MAX_TRAJECTORY_STEPS = 200


# -- a task family's grading evidence -----------------------------------------------------------
_B64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")


def png_img(b64: Any, alt: str, css_class: str) -> str:
    """An <img> of an inline base64 PNG, or a note when the data is missing or not plain base64
    (nothing but base64 characters ever reaches the src attribute)."""
    if not isinstance(b64, str) or not b64 or not _B64.fullmatch(b64):
        return f'<p class="he-empty">no {escape(alt)}</p>'
    return f'<img class="{escape(css_class)}" alt="{escape(alt)}" src="data:image/png;base64,{b64}"/>'


def grading_html(grading: dict[str, Any] | None, reference_png_b64: str | None = None) -> str:
    """A task family's grading evidence: the rendered icon next to the reference, why it scored 0
    (if it did), and the judge's per-dimension scores, weighted reward, attempts, time and raw answer."""
    if not grading:
        return '<p class="he-empty">no task-family grading (a shell task is graded by its verify commands)</p>'
    g = grading
    images = (
        f'<div class="he-images"><figure>{png_img(g.get("rendered_png_b64"), "rendered icon", "he-rendered")}<figcaption>rendered icon</figcaption></figure>'
    )
    if reference_png_b64 is not None:
        images += f"<figure>{png_img(reference_png_b64, 'reference image', 'he-reference')}<figcaption>reference</figcaption></figure>"
    images += "</div>"
    reasons = g.get("zero_reasons") or []
    timings = g.get("timings") or {}
    facts = [
        ("renderer", escape(str(g.get("renderer", "-")))),
        ("page valid", "yes" if g.get("page_valid") else "no"),
        ("zero reasons", "<ul>" + "".join(f"<li><code>{escape(str(r))}</code></li>" for r in reasons) + "</ul>" if reasons else "none"),
        ("timings", escape(", ".join(f"{k}: {num(v)} s" for k, v in timings.items())) or "-"),
    ]
    judge = g.get("judge")
    if isinstance(judge, dict):
        facts += [
            ("judge model", escape(str(judge.get("judge_model") or "-"))),
            ("judge attempts", num(judge.get("attempts"))),
            ("judge time", f"{num(judge.get('seconds'))} s"),
        ]
        if judge.get("error"):
            facts.append(("judge error", f"<code>{escape(clip(str(judge['error']), 2000))}</code>"))
    facts_html = '<table class="he-table he-grading-facts"><tbody>' + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts) + "</tbody></table>"
    return f'<div class="he-grading">{images}{facts_html}{_judge_scores_html(judge)}</div>'


def _judge_scores_html(judge: Any) -> str:
    if not isinstance(judge, dict):
        return '<p class="he-empty">the judge was not asked</p>'
    scores = judge.get("scores") or {}
    rows = []
    for name, s in scores.items():
        s = s if isinstance(s, dict) else {}
        rows.append(
            f'<tr data-dimension="{escape(str(name))}"><td><code>{escape(str(name))}</code></td>'
            f"<td>{num(s.get('score'))}</td><td>{num(s.get('weight'))}</td><td>{escape(clip(str(s.get('reason') or ''), 2000))}</td></tr>"
        )
    reward = judge.get("reward")
    table = (
        '<table class="he-table he-scores"><thead><tr><th>dimension</th><th>score</th><th>weight</th><th>reason</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody><tfoot><tr><th>weighted reward</th>"
        f'<th class="he-judge-reward" colspan="3">{escape(format_reward(reward) if isinstance(reward, (int, float)) else "-")}</th></tr></tfoot></table>'
    )
    if not rows:
        table = '<p class="he-empty">no per-dimension scores</p>' + table
    raw = judge.get("raw_answer")
    raw_html = (
        f"<details><summary>raw judge answer ({len(str(raw))} chars)</summary><pre>{escape(clip(str(raw)))}</pre></details>"
        if raw
        else '<p class="he-empty">no raw judge answer</p>'
    )
    return table + raw_html


# -- a harness's own account (its result_facts) --------------------------------------------------
def run_facts_html(facts: list[RunFact] | None, trajectory: dict[str, Any] | None = None) -> str:
    """What a harness says it ran (its result_facts: label, then a text, a map or None), then the
    agent's ATIF trajectory, compactly: one row per step."""
    if facts is None:
        return '<p class="he-empty">nothing of this harness\'s own in this result</p>'
    rows = "".join(f'<tr data-fact="{escape(label)}"><th>{escape(label)}</th><td>{_fact_html(value)}</td></tr>' for label, value in facts)
    return f'<div class="he-run"><table class="he-table he-run-facts"><tbody>{rows}</tbody></table>{trajectory_html(trajectory)}</div>'


def _fact_html(value: str | dict[str, float] | None) -> str:
    if value is None:
        return "none"
    if isinstance(value, dict):
        if not value:
            return '<span class="he-empty">none</span>'
        rows = "".join(f'<tr data-key="{escape(str(k))}"><td><code>{escape(str(k))}</code></td><td>{num(v, 4)}</td></tr>' for k, v in value.items())
        return f'<table class="he-table he-run-map"><tbody>{rows}</tbody></table>'
    return f"<code>{escape(clip(str(value), 2000))}</code>"


def _step_message(message: Any) -> str:
    """An ATIF step's message (a string, or content parts: text kept, others named), shortened."""
    text = content_text(message) if isinstance(message, list) else ("" if message is None else str(message))
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
    head = (
        f'<p class="he-trajectory-head">trajectory {escape(str(trajectory.get("schema_version") or "-"))}'
        f" · {escape(who or 'agent -')}{escape(model)} · {len(steps)} step(s)</p>"
    )
    rows = []
    for step in steps[:MAX_TRAJECTORY_STEPS]:
        step = step if isinstance(step, dict) else {}
        source = str(step.get("source") or "?")
        names = _tool_call_names(step.get("tool_calls"))
        obs = step.get("observation")
        results = obs.get("results") if isinstance(obs, dict) and isinstance(obs.get("results"), list) else []
        rows.append(
            f'<tr class="he-step" data-source="{escape(source)}"><td>{escape(str(step.get("step_id", "")))}</td>'
            f"<td>{escape(source)}</td><td><pre>{escape(_step_message(step.get('message')))}</pre></td>"
            f"<td>{', '.join(f'<code>{escape(n)}</code>' for n in names) or '-'}</td>"
            f"<td>{len(results) or '-'}</td></tr>"
        )
    more = f'<p class="he-empty">... {len(steps) - MAX_TRAJECTORY_STEPS} more steps in the JSON download</p>' if len(steps) > MAX_TRAJECTORY_STEPS else ""
    table = (
        '<table class="he-table he-trajectory"><thead><tr><th>step</th><th>source</th><th>message</th>'
        f"<th>tool calls</th><th>observations</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
    return head + (table if rows else '<p class="he-empty">no steps</p>') + more
