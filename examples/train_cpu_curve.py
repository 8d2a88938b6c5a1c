"""What one run of examples/train_cpu.py made (`Run`), written as curve.json and drawn as learning.png."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from examples.train_cpu_onpolicy import OnPolicyRolloutFunc, StepRecord
from examples.train_cpu_tasks import Evaluation


@dataclass
class Run:
    """Everything one training run made, for the curve and the tests."""

    args: dict[str, Any]
    base: Evaluation | None
    final: Evaluation | None
    records: list[StepRecord]
    log_history: list[dict[str, Any]]
    step_seconds: list[float]
    trainable_parameters: int
    load_seconds: float
    total_seconds: float
    trainer: Any = None
    rollout_func: OnPolicyRolloutFunc | None = None

    def curve(self) -> dict[str, Any]:
        logs = {int(h["step"]): h for h in self.log_history if "loss" in h}
        steps = []
        for i, rec in enumerate(self.records):
            log = logs.get(i + 1, {})
            wall = self.step_seconds[i] if i < len(self.step_seconds) else None
            steps.append(
                {
                    "step": i + 1,
                    "sampled_from_version": rec.step,
                    "served_version": rec.served_version,
                    "served_version_after": rec.served_version_after,
                    "constrained_logp_gap_max": rec.constrained_gap_max,
                    "turn_versions": sorted({v for vs in rec.turn_versions for v in vs}),
                    "unmatched_turns": rec.unmatched_turns,
                    "reward_mean": rec.reward_mean,
                    "success_rate": rec.success_rate,
                    "scored": len(rec.scored),
                    "rollouts": len(rec.rewards),
                    "loss": log.get("loss"),
                    "grad_norm": log.get("grad_norm"),
                    "kl": rec.kl,
                    "logp_gap_max": rec.logp_gap_max,
                    "sampled_tokens": rec.sampled_tokens,
                    "sampled_tokens_per_s": rec.sampled_tokens / rec.generation_s if rec.generation_s else None,
                    "trained_tokens": log.get("num_tokens"),
                    "wall_s": wall,
                    "generation_s": rec.generation_s,
                    "sync_s": rec.sync_s,
                    "probe_s": rec.probe_s,
                    "check_s": rec.check_s,
                    "errors": rec.errors,
                }
            )
        walls = [s["wall_s"] for s in steps if s["wall_s"] is not None]
        return {
            "args": self.args,
            "base": _eval_dict(self.base),
            "final": _eval_dict(self.final),
            "difference": (self.final.rate - self.base.rate) if self.base and self.final else None,
            "difference_stderr": math.hypot(self.base.stderr, self.final.stderr) if self.base and self.final else None,
            "wall_s_per_step": statistics.fmean(walls) if walls else None,
            "trainable_parameters": self.trainable_parameters,
            "load_s": self.load_seconds,
            "total_s": self.total_seconds,
            "steps": steps,
        }


def _eval_dict(ev: Evaluation | None) -> dict[str, Any] | None:
    return None if ev is None else {**asdict(ev), "rate": ev.rate, "stderr": ev.stderr}


def write_curve(run: Run, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    curve = run.curve()
    (out / "curve.json").write_text(json.dumps(curve, indent=1))
    return curve


def plot(curve: dict[str, Any], path: Path) -> None:
    """Four panels: reward and success per step (with the held-out evaluations), loss, KL, speed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps = curve["steps"]
    x = [s["step"] for s in steps]

    def series(key: str) -> list[float]:
        return [math.nan if s[key] is None else s[key] for s in steps]

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    ax = axes[0][0]
    ax.plot(x, series("reward_mean"), marker="o", ms=3, label="mean reward (training rollouts)")
    ax.plot(x, series("success_rate"), marker="s", ms=3, alpha=0.6, label="success (training rollouts)")
    for key, at, colour in (("base", 0, "grey"), ("final", len(steps), "green")):
        ev = curve.get(key)
        if ev:
            ax.errorbar(
                [at],
                [ev["rate"]],
                yerr=[ev["stderr"]],
                fmt="D",
                color=colour,
                capsize=4,
                label=f"held-out success, {'before' if key == 'base' else 'after'} (n={ev['n']})",
            )
    ax.set(xlabel="optimiser step", ylabel="reward / success", ylim=(-0.05, 1.05), title="reward")
    ax.legend(fontsize=7, loc="lower right")
    axes[0][1].plot(x, series("loss"), marker="o", ms=3)
    axes[0][1].set(xlabel="optimiser step", title="GRPO loss (TRL's)")
    floor = 1e-8  # step 1 samples the initial weights: its KL is float noise
    axes[1][0].plot(x, [max(v, floor) for v in series("kl")], marker="o", ms=3, label="KL to the initial weights (k3, sampled tokens)")
    axes[1][0].plot(x, [max(v, floor) for v in series("logp_gap_max")], marker="x", ms=3, label="max |captured - trainer| logprob")
    axes[1][0].set(xlabel="optimiser step", yscale="log", ylim=(floor / 2, 1), title="KL and the on-policy gap")
    axes[1][0].legend(fontsize=7)
    axes[1][1].plot(x, series("sampled_tokens_per_s"), marker="o", ms=3, label="sampled tokens/s (rollouts)")
    axes[1][1].set(xlabel="optimiser step", ylabel="tokens/s", title="speed")
    axes[1][1].set_ylim(bottom=0)
    ax2 = axes[1][1].twinx()
    ax2.plot(x, series("wall_s"), color="tab:red", marker="x", ms=3, label="wall time per step")
    ax2.set(ylabel="s")
    ax2.set_ylim(bottom=0)
    axes[1][1].legend(fontsize=7, loc="lower left")
    ax2.legend(fontsize=7, loc="lower right")
    for row in axes:
        for a in row:
            a.xaxis.set_major_locator(MaxNLocator(integer=True))
    args = curve["args"]
    fig.suptitle(
        f"On-policy GRPO on CPU: SmolLM2-135M-Instruct, {args.get('harness', 'whitebox')} harness, "
        f"{'vLLM' if args.get('vllm_url') else 'example server'}, {args['family']} "
        f"({args['tasks_per_step']}x{args['num_generations']} rollouts/step, lr {args['learning_rate']}, T {args['temperature']})",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
