"""Pure functions that turn a RolloutResult (and PhaseEvents) into what the page shows.

No Gradio here: every function takes plain data and returns HTML, Markdown, rows or chat messages,
so each can be unit-tested without a browser. Everything that came from the sandbox or the model
(commands, outputs, file contents, tokens) is HTML-escaped: an agent must not be able to inject
markup into the page of the person watching it.

The page imports this module alone; the pieces live by concern: render_turns.py (the conversation
and the per-token logprobs), render_tokens.py (the token view), render_evidence.py (a task family's grading, a harness's own account),
render_text.py (escaping, clipping, numbers) and here (live log, reward, summary, commands, files,
history, redaction).
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from harness_env.models import CommandResult, PhaseEvent, RolloutResult
from harness_env.models.jobs import ended_status
from harness_env.server.web.render_evidence import MAX_STEP_MESSAGE_CHARS, MAX_TRAJECTORY_STEPS, grading_html, png_img, run_facts_html, trajectory_html
from harness_env.server.web.render_text import MAX_SHOWN_CHARS, clip, format_reward, md_cell
from harness_env.server.web.render_tokens import trajectory_tokens_html
from harness_env.server.web.render_turns import LOWEST_TOKENS, TokenPoint, conversation, logprob_points, logprob_summary_markdown, logprob_svg

__all__ = [
    "HISTORY_HEADERS",
    "LOWEST_TOKENS",
    "MAX_SHOWN_CHARS",
    "MAX_STEP_MESSAGE_CHARS",
    "MAX_TRAJECTORY_STEPS",
    "TokenPoint",
    "commands_html",
    "conversation",
    "files_html",
    "format_reward",
    "grading_html",
    "history_row",
    "json_html",
    "log_line",
    "logprob_points",
    "logprob_summary_markdown",
    "logprob_svg",
    "png_img",
    "redact",
    "result_json",
    "run_facts_html",
    "reward_html",
    "status_line",
    "summary_markdown",
    "trajectory_html",
    "trajectory_tokens_html",
]


# -- live log -------------------------------------------------------------------------------------
def log_line(ev: PhaseEvent) -> str:
    """One line of the live phase log: elapsed time, phase, status, detail."""
    if ev.status == "info":  # e.g. one model call the proxy saw
        return f"{ev.elapsed_s:7.2f}s  {ev.phase:<8} · {ev.detail}".rstrip()
    detail = f"  {ev.detail}" if ev.detail else ""
    return f"{ev.elapsed_s:7.2f}s  {ev.phase:<8} {ev.status}{detail}".rstrip()


def status_line(state: str, elapsed_s: float, phase: str = "") -> str:
    """The status as Markdown ("not run: ..." quotes an error: made inert)."""
    where = f" ({md_cell(phase)})" if phase else ""
    return f"**{md_cell(state)}**{where} · {elapsed_s:.1f} s"


# -- reward and summary ---------------------------------------------------------------------------
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
    why = f'<div class="he-reward-error">{escape(result.error_kind or "")}: {escape(clip(result.error or "", 500))}</div>' if result.error else ""
    if result.turn_limit_hit:  # else a bare 0.0 reads as a failed task, not a stopped agent
        why += f'<div class="he-reward-why">the turn limit ended it after {len(result.proxy_turns)} model call(s), before the agent said it was done</div>'
    value = "" if result.reward is None else format_reward(result.reward)
    return (
        f'<div class="he-reward he-{cls}" data-reward="{escape(value)}">'
        f'<span class="he-reward-label">reward</span><span class="he-reward-value">{escape(label)}</span>{why}</div>'
    )


def _training_line(result: RolloutResult) -> str:
    """rollout_type in words: "eval" read as the mode it ran in, when it says whether its tokens
    can be trained on."""
    if result.rollout_type == "train":
        return "certified for training (token ids and processed logprobs on every model call)"
    return f"not certified for training: {result.rollout_type_reason or 'the endpoint gave no token ids and processed logprobs'}"


def _trained_line(graph) -> str:
    share = graph.trained_share
    if share is None:  # nothing sampled, or stored before the graph counted it
        return f"{graph.trainable_tokens} trainable tokens"
    auxiliary = f"; {graph.auxiliary_tokens} auxiliary, never trained" if graph.auxiliary_tokens else ""
    return f"{graph.trainable_tokens} of {graph.sampled_tokens} sampled tokens trainable ({share:.0%}){auxiliary}"


def summary_markdown(result: RolloutResult) -> str:
    policy = [t for t in result.proxy_turns if t.purpose == "policy"]
    rows = [
        ("harness", result.harness),
        ("mode", result.mode),
        ("capture level", f"{result.capture_level} (tokens > logprobs > text)"),
        ("training", _training_line(result)),
        ("turn graph", f"{result.graph.branches} branch(es), {result.graph.auxiliary_turns} auxiliary turn(s), {_trained_line(result.graph)}"),
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
    lines += [f"| {k} | {md_cell(v)} |" for k, v in rows]
    return "\n".join(lines)


# -- verify table and files -----------------------------------------------------------------------
def _output_details(name: str, text: str) -> str:
    """One output of a command, in a block of its own (inline, stdout's and stderr's notes ran
    together as "no stdoutno stderr")."""
    if not text:
        return f'<div class="he-output he-empty">no {name}</div>'
    n = text.count("\n") + (0 if text.endswith("\n") else 1)
    return f'<details class="he-output"><summary>{name} ({n} lines)</summary><pre>{escape(clip(text))}</pre></details>'


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
    return (
        '<table class="he-table he-commands"><thead><tr><th>command</th><th>exit code</th><th>duration</th>'
        f"<th>output</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def files_html(files: dict[str, str]) -> str:
    """The workspace's files after the rollout, each expandable."""
    if not files:
        return '<p class="he-empty">no files collected</p>'
    items = [
        f'<details class="he-file"><summary><code>{escape(path)}</code> ({len(content)} chars)</summary><pre>{escape(clip(content))}</pre></details>'
        for path, content in sorted(files.items())
    ]
    return "".join(items)


# -- history and the raw JSON ---------------------------------------------------------------------
HISTORY_HEADERS = ["#", "reward", "harness", "duration (s)", "status", "error kind", "task"]


def history_row(n: int, result: RolloutResult | None, harness: str, wall_s: float, instruction: str, cancelled: bool = False) -> list[Any]:
    """A history row: how the run ended (its status as the Rollouts tab shows it, or no result)
    and, apart, the error kind it reported ("-" for none)."""
    if result is None:
        reward, status, kind = "-", "cancelled" if cancelled else "no result", "-"
    else:
        reward, status, kind = format_reward(result.reward), ended_status(result), result.error_kind or "-"
    task = instruction.strip().splitlines()[0][:60] if instruction.strip() else ""
    return [n, reward, harness, round(wall_s, 2), status, kind, task]


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


def json_html(text: str, limit: int) -> str:
    """The result's JSON, collapsed under its size (the download button above it has it whole),
    clipped at `limit` characters when opened."""
    shown = text if len(text) <= limit else text[:limit] + "\n... (cut here; the download has everything)"
    return (
        f'<details class="he-json"><summary>show the RolloutResult JSON here ({len(text):,} characters; '
        f"the download has it whole)</summary><pre>{escape(shown)}</pre></details>"
    )
