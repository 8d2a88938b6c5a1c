"""The Evals view's HTML: pure functions of an eval run (server/store/eval_runs.py) and its numbers.

The numbers are evals/report.py's (`summarize` over the attempts stored for the run), so the page
shows what summary.json holds. Every text from a task, a model or an error is escaped.
"""

from __future__ import annotations

import json
import math
import time
from html import escape
from typing import Any

from harness_env.evals.report import Outcome, error_groups, headline, pass1_stderr, summarize

OUTCOMES = ["all", "passed", "not passed", "infrastructure failure"]
CHART_W, CHART_H, PAD = 520, 220, 36


def run_summary(run: dict[str, Any], attempts: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json's numbers for `run`, from its stored attempts (report.summarize)."""
    found: dict[str, list[Outcome]] = {tid: [] for tid in run["tasks"]}
    for a in attempts:
        if a["task_id"] in found:
            found[a["task_id"]].append(Outcome(a["reward"], a["error_kind"]))
    return summarize(found, run["attempts"], run["threshold"])


def _pm(mean: float | None, se: float | None) -> str:
    if mean is None:
        return "-"
    return f"{mean:.3f} ± {'-' if se is None else f'{se:.3f}'}"


def _n(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def run_rows(runs: list[dict[str, Any]], summaries: dict[str, dict[str, Any]]) -> list[list[Any]]:
    """The runs list's rows, newest first as given."""
    rows = []
    for r in runs:
        s = summaries[r["id"]]
        o, total = s["overall"], len(r["tasks"]) * r["attempts"]
        rows.append(
            [
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created_at"])),
                r["id"][:12],
                r["harness"],
                r["model"],
                len(r["tasks"]),
                r["attempts"],
                f"{o['attempts']}/{total}",
                _pm(o["mean_reward"], o["stderr"]),
                _n(pass1_stderr(s)[0]),
                o["infra_failures"],
                r["status"],
            ]
        )
    return rows


RUN_HEADERS = ["created", "run", "harness", "model", "tasks", "attempts/task", "done", "mean reward ± se", "pass@1", "infra failures", "status"]


def _table(head: list[str], rows: list[list[str]], css: str) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{css}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def run_page(run: dict[str, Any], summary: dict[str, Any], attempts: list[dict[str, Any]]) -> str:
    """A run's page: what it evaluated, its headline, per task mean ± se and pass@k for every k, the
    pass@k chart, error kinds with their messages, infrastructure failures apart."""
    o, ks = summary["overall"], list(range(1, run["attempts"] + 1))
    endpoint = escape(run["base_url"] or "-")
    servers = ("on " + ", ".join(run["servers"])) if run["servers"] else "in the eval process"
    parts = [
        f'<div class="he-eval-run" data-run="{escape(run["id"])}">',
        f"<h3>eval run <code>{escape(run['id'])}</code> · {escape(run['status'])}</h3>",
        f"<p>harness <b>{escape(run['harness'])}</b> · model <code>{escape(run['model'])}</code> · endpoint <code>{endpoint}</code> · "
        f"ran {escape(servers)} · {len(run['tasks'])} tasks × {run['attempts']} attempts · threshold {run['threshold']} · "
        f"results in <code>{escape(run['out_dir'])}</code></p>",
        f'<p class="he-eval-headline" id="ev-headline"><b>{escape(headline(summary))}</b></p>',
        "<details><summary>options</summary><pre>" + escape(json.dumps(run["options"], indent=1)) + "</pre></details>",
    ]
    head = ["task", "scored", "infra failures", "mean ± se", *(f"pass@{k}" for k in ks), "errors"]
    rows = [_task_row(escape(tid), s, ks) for tid, s in summary["tasks"].items()]
    rows.append(_task_row("<b>overall</b>", o, ks))
    parts += ["<h4>per task</h4>", _table(head, rows, "he-eval-tasks"), "<h4>pass@k</h4>", passk_table(summary, ks), passk_svg(summary, ks)]
    parts.append(errors_html(o, attempts))
    parts.append("</div>")
    return "".join(parts)


def _task_row(name: str, s: dict[str, Any], ks: list[int]) -> list[str]:
    errors = ", ".join(f"{escape(k)}: {v}" for k, v in s["errors"].items()) or "-"
    cells = [name, str(s["scored"]), str(s["infra_failures"]), _pm(s["mean_reward"], s["stderr"])]
    return cells + [f'<span data-k="{k}">{_n(s["pass_at_k"][str(k)])}</span>' for k in ks] + [errors]


def passk_table(summary: dict[str, Any], ks: list[int]) -> str:
    values = summary["overall"]["pass_at_k"]
    return _table(["k", *map(str, ks)], [["pass@k", *(_n(values[str(k)]) for k in ks)]], "he-eval-passk")


def passk_svg(summary: dict[str, Any], ks: list[int]) -> str:
    """pass@k against k: the overall curve (thick) over each task's (thin), y from 0 to 1."""

    def xy(k: int, v: float) -> tuple[float, float]:
        x = PAD + (CHART_W - 2 * PAD) * ((k - 1) / max(1, len(ks) - 1) if len(ks) > 1 else 0.5)
        return round(x, 1), round(CHART_H - PAD - (CHART_H - 2 * PAD) * v, 1)

    def line(values: dict[str, float | None], css: str, label: str) -> str:
        pts = [xy(k, values[str(k)]) for k in ks if values.get(str(k)) is not None]
        if not pts:
            return ""
        dots = "".join(f'<circle cx="{x}" cy="{y}" r="{3 if css == "overall" else 1.5}"/>' for x, y in pts)
        path = " ".join(f"{x},{y}" for x, y in pts)
        return f'<g class="he-passk-{css}"><title>{escape(label)}</title><polyline points="{path}" fill="none"/>{dots}</g>'

    parts = [
        f'<svg class="he-passk-chart" id="ev-passk-chart" viewBox="0 0 {CHART_W} {CHART_H}" width="{CHART_W}" role="img" aria-label="pass@k against k">',
        "<style>.he-passk-chart text{font:11px sans-serif;fill:currentColor}.he-passk-task polyline{stroke:#9ab;stroke-width:1}"
        ".he-passk-task circle{fill:#9ab}.he-passk-overall polyline{stroke:#e06c00;stroke-width:2.5}"
        ".he-passk-overall circle{fill:#e06c00}.he-passk-axis{stroke:#888}</style>",
    ]
    for v in (0, 0.5, 1):
        _, y = xy(1, v)
        parts.append(
            f'<line class="he-passk-axis" x1="{PAD}" x2="{CHART_W - PAD}" y1="{y}" y2="{y}" stroke-dasharray="2,3"/><text x="4" y="{y + 4}">{v}</text>'
        )
    for k in ks:
        x, _ = xy(k, 0)
        parts.append(f'<text x="{x - 3}" y="{CHART_H - PAD + 16}">{k}</text>')
    parts.append(f'<text x="{CHART_W / 2 - 10}" y="{CHART_H - 4}">k</text>')
    parts += [line(s["pass_at_k"], "task", tid) for tid, s in summary["tasks"].items()]
    parts.append(line(summary["overall"]["pass_at_k"], "overall", "overall"))
    parts.append("</svg>")
    return "".join(parts)


def errors_html(overall: dict[str, Any], attempts: list[dict[str, Any]]) -> str:
    """Error kinds with the messages behind them; infrastructure failures (no reward) counted apart."""
    infra = [(a["error_kind"], a["error"]) for a in attempts if Outcome(a["reward"], a["error_kind"]).infra_failed]
    graded = [(a["error_kind"], a["error"]) for a in attempts if not Outcome(a["reward"], a["error_kind"]).infra_failed]
    parts = [
        f'<h4>infrastructure failures: <span id="ev-infra">{overall["infra_failures"]}</span> of {overall["attempts"]} attempts '
        "(no reward; left out of every mean and pass@k)</h4>",
        _groups(infra, "ev-infra-errors"),
    ]
    parts += ["<h4>errors of graded attempts</h4>", _groups(graded, "ev-graded-errors")]
    return "".join(parts)


def _groups(pairs: list[tuple[str | None, str | None]], elem_id: str) -> str:
    groups = error_groups(pairs)
    if not groups:
        return f'<p id="{elem_id}">none</p>'
    items = []
    for kind, messages in groups.items():
        total = sum(1 for k, _ in pairs if k == kind)
        shown = "".join(f"<li>{n} × <code>{escape(m)}</code></li>" for m, n in messages)
        items.append(f'<li data-kind="{escape(kind)}"><b>{escape(kind)}</b> ({total})<ul>{shown}</ul></li>')
    return f'<ul id="{elem_id}">{"".join(items)}</ul>'


def attempts_html(attempts: list[dict[str, Any]], threshold: float, task: str | None, outcome: str | None) -> str:
    """The run's rollouts, filtered by task and outcome; each links to its page in the Rollouts tab."""

    def keep(a: dict[str, Any]) -> bool:
        o = Outcome(a["reward"], a["error_kind"])
        passed = a["reward"] is not None and a["reward"] >= threshold
        return (not task or task == "all" or a["task_id"] == task) and {
            "passed": passed,
            "not passed": not passed and not o.infra_failed,
            "infrastructure failure": o.infra_failed,
        }.get(outcome or "all", True)

    shown = [a for a in attempts if keep(a)]
    rows = [
        [
            f'<a href="?rollout={escape(a["id"])}">{escape(a["id"])}</a>',
            escape(a["task_id"] or "-"),
            str(a["eval_attempt"]),
            escape(a["status"]),
            _n(a["reward"]),
            "-" if a["wall_s"] is None else f"{a['wall_s']:.1f}",
            escape(a["error_kind"] or "-"),
            escape((a["error"] or "").splitlines()[0][:160] if a["error"] else ""),
        ]
        for a in shown
    ]
    table = _table(["rollout", "task", "attempt", "status", "reward", "wall (s)", "error kind", "error"], rows, "he-eval-attempts")
    return f'<p id="ev-attempts-count">{len(shown)} of {len(attempts)} rollouts</p>' + table


def compare_html(a: dict[str, Any], sa: dict[str, Any], b: dict[str, Any], sb: dict[str, Any]) -> str:
    """Two runs task by task: each mean ± se, and the difference B - A with its standard error
    (sqrt(se_a² + se_b²): the runs are independent)."""
    tasks = list(sa["tasks"]) + [t for t in sb["tasks"] if t not in sa["tasks"]]
    rows = [_delta_row(escape(t), sa["tasks"].get(t), sb["tasks"].get(t)) for t in tasks]
    rows.append(_delta_row("<b>overall</b>", sa["overall"], sb["overall"]))
    p1a, p1b = pass1_stderr(sa), pass1_stderr(sb)
    head = ["task", f"A: {a['harness']} · {a['model']}", f"B: {b['harness']} · {b['model']}", "B − A ± se"]
    return (
        f'<div class="he-eval-compare"><p>A = run <code>{escape(a["id"][:12])}</code>, B = run <code>{escape(b["id"][:12])}</code>; '
        f"pass@1 A {_pm(*p1a)}, B {_pm(*p1b)}, B − A {_pm(*_diff(p1a, p1b))}</p>" + _table(head, rows, "he-eval-compare-table") + "</div>"
    )


def _diff(a: tuple[float | None, float | None], b: tuple[float | None, float | None]) -> tuple[float | None, float | None]:
    if a[0] is None or b[0] is None:
        return None, None
    se = None if a[1] is None or b[1] is None else math.sqrt(a[1] ** 2 + b[1] ** 2)
    return b[0] - a[0], se


def _delta_row(name: str, a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    ma = (a["mean_reward"], a["stderr"]) if a else (None, None)
    mb = (b["mean_reward"], b["stderr"]) if b else (None, None)
    d = _diff(ma, mb)
    sign = "" if d[0] is None else ("+" if d[0] > 0 else "")
    delta = "-" if d[0] is None else f"{sign}{d[0]:.3f} ± {'-' if d[1] is None else f'{d[1]:.3f}'}"
    return [name, _pm(*ma), _pm(*mb), f'<span class="he-delta">{delta}</span>']
