"""The evaluation's numbers and their table: pure functions of the attempts' outcomes.

An attempt's outcome is its reward (None: an infrastructure failure, which is excluded from every
denominator and counted apart: `infra_failures`, the reward lost to infrastructure counted in
attempts, and `masked_share`, their share of the attempts) and its error kind. Per task: the mean reward with its standard
error over the attempts that have a reward, and unbiased pass@k for k in 1..K, with c the attempts
whose reward is at least the threshold. Overall: the mean and standard error over every attempt
with a reward, and pass@k averaged over the tasks with at least k such attempts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from harness_env.evals.passk import mean_and_stderr, pass_at_k
from harness_env.models.results import is_masked


@dataclass(frozen=True)
class Outcome:
    reward: float | None
    error_kind: str | None = None

    @property
    def infra_failed(self) -> bool:
        """No reward for a reason other than a caller's cancel (which is nobody's failure)."""
        return self.reward is None and self.error_kind != "cancelled"

    @property
    def masked(self) -> bool:
        """As RolloutResult.mask_sample: ended by what the agent did not cause (a cancel too); never trained, never voting."""
        return is_masked(self.error_kind)


def task_stats(outcomes: list[Outcome], attempts: int, threshold: float) -> dict[str, Any]:
    rewards = [o.reward for o in outcomes if o.reward is not None]
    passed = sum(r >= threshold for r in rewards)
    mean, stderr = mean_and_stderr(rewards)
    return {
        "attempts": len(outcomes),
        "missing": max(0, attempts - len(outcomes)),
        "scored": len(rewards),
        "passed": passed,
        "infra_failures": sum(o.infra_failed for o in outcomes),
        "masked": sum(o.masked for o in outcomes),
        "masked_share": _share(sum(o.masked for o in outcomes), len(outcomes)),
        "mean_reward": mean,
        "stderr": stderr,
        "pass_at_k": {str(k): pass_at_k(len(rewards), passed, k) for k in range(1, attempts + 1)},
        "errors": dict(sorted(Counter(o.error_kind for o in outcomes if o.error_kind).items())),
    }


def summarize(outcomes: dict[str, list[Outcome]], attempts: int, threshold: float) -> dict[str, Any]:
    """summary.json's numbers: per task (in the given order) and overall."""
    tasks = {tid: task_stats(outs, attempts, threshold) for tid, outs in outcomes.items()}
    rewards = [o.reward for outs in outcomes.values() for o in outs if o.reward is not None]
    mean, stderr = mean_and_stderr(rewards)
    errors: Counter[str] = Counter()
    for t in tasks.values():
        errors.update(t["errors"])
    overall_pass: dict[str, float | None] = {}
    for k in range(1, attempts + 1):
        values = [t["pass_at_k"][str(k)] for t in tasks.values() if t["pass_at_k"][str(k)] is not None]
        overall_pass[str(k)] = sum(values) / len(values) if values else None
    overall = {
        "tasks": len(tasks),
        "attempts": sum(t["attempts"] for t in tasks.values()),
        "missing": sum(t["missing"] for t in tasks.values()),
        "scored": len(rewards),
        "passed": sum(t["passed"] for t in tasks.values()),
        "infra_failures": sum(t["infra_failures"] for t in tasks.values()),
        "mean_reward": mean,
        "stderr": stderr,
        "pass_at_k": overall_pass,
        "errors": dict(sorted(errors.items())),
    }
    overall["masked"] = sum(t["masked"] for t in tasks.values())
    overall["masked_share"] = _share(overall["masked"], overall["attempts"])
    return {"attempts_per_task": attempts, "threshold": threshold, "tasks": tasks, "overall": overall}


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def shown_ks(attempts: int) -> list[int]:
    """The k columns of the table: all up to 8, then powers of two and K."""
    if attempts <= 8:
        return list(range(1, attempts + 1))
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if k < attempts]
    return ks + [attempts]


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _row(name: str, s: dict[str, Any], ks: list[int]) -> list[str]:
    mean = "-" if s["mean_reward"] is None else f"{s['mean_reward']:.3f} ± {_num(s['stderr'])}"
    errors = " ".join(f"{k}:{v}" for k, v in s["errors"].items()) or "-"
    return [name, str(s["scored"]), str(s["infra_failures"]), mean, *(_num(s["pass_at_k"][str(k)]) for k in ks), errors]


def table(summary: dict[str, Any]) -> str:
    """The summary as a plain-text table: one line per task, then the overall line."""
    ks = shown_ks(summary["attempts_per_task"])
    head = ["task", "scored", "infra", "mean ± se", *(f"pass@{k}" for k in ks), "errors"]
    rows = [_row(tid, s, ks) for tid, s in summary["tasks"].items()]
    rows.append(_row("overall", summary["overall"], ks))
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    lines = [fmt(head), fmt(["-" * w for w in widths]), *map(fmt, rows[:-1]), fmt(["-" * w for w in widths]), fmt(rows[-1])]
    o = summary["overall"]
    share = f" ({o['masked_share']:.1%} masked)" if o.get("masked_share") is not None else ""
    lines.append(
        f"threshold {summary['threshold']}; infrastructure failures (reward null) are left out of the means and pass@k: "
        f"{o['infra_failures']} of {o['attempts']} attempts{share}" + (f"; {o['missing']} attempts not run yet" if o["missing"] else "")
    )
    return "\n".join(lines)


def progress_line(done: int, total: int, running: int, failed: int, elapsed_s: float, resumed: int = 0, mean_reward: float | None = None) -> str:
    """'12/40 done, 3 running, 1 failed, 1m05s, mean reward 0.500, ETA 56s': the ETA from this run's
    own pace, once one of its attempts finished."""
    ran = done - resumed
    eta = f", ETA {_duration((total - done) * elapsed_s / ran)}" if ran > 0 and done < total else ""
    mean = "-" if mean_reward is None else f"{mean_reward:.3f}"
    return f"{done}/{total} done, {running} running, {failed} failed, {_duration(elapsed_s)}, mean reward {mean}{eta}"


def _duration(s: float) -> str:
    s = max(0, round(s))
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def pass1_stderr(summary: dict[str, Any]) -> tuple[float | None, float | None]:
    """Overall pass@1 (the mean of the tasks' pass@1) and its standard error over the tasks."""
    return mean_and_stderr([t["pass_at_k"]["1"] for t in summary["tasks"].values() if t["pass_at_k"].get("1") is not None])


def headline(summary: dict[str, Any]) -> str:
    """The one line a person reads first: pass@1 ± its standard error, and infrastructure failures."""
    o = summary["overall"]
    p1, se = pass1_stderr(summary)
    shown = "-" if p1 is None else f"{p1:.3f} ± {_num(se)}"
    mean = "-" if o["mean_reward"] is None else f"{o['mean_reward']:.3f}"
    graded = sum(t["pass_at_k"].get("1") is not None for t in summary["tasks"].values())
    return (
        f"pass@1 {shown} over {graded} graded tasks of {o['tasks']} (mean reward {mean}); "
        f"infrastructure failures: {o['infra_failures']} of {o['attempts']} attempts"
    )


def error_groups(errors: Iterable[tuple[str | None, str | None]], keep: int = 3) -> dict[str, list[tuple[str, int]]]:
    """(error kind, message) pairs -> per kind its most frequent messages (their first line, at most
    200 characters) with their counts: what lies behind each error kind."""
    found: dict[str, Counter[str]] = {}
    for kind, message in errors:
        if kind:
            first = (message or "(no message)").strip().splitlines()[0][:200] if (message or "").strip() else "(no message)"
            found.setdefault(kind, Counter())[first] += 1
    return {kind: c.most_common(keep) for kind, c in sorted(found.items())}


def error_lines(groups: dict[str, list[tuple[str, int]]]) -> str:
    lines = []
    for kind, messages in groups.items():
        lines.append(f"{kind}:")
        lines += [f"  {n} x {message}" for message, n in messages]
    return "\n".join(lines)
