"""Does a policy trained on harness-env's rollouts get better inside a harness? On-policy GRPO on CPU.

    nice -n 10 .venv/bin/python bench/learning.py [--steps 20] [--out runs/learning] [--plot docs/learning.png]
    nice -n 10 .venv/bin/python bench/learning.py --measure-base 64     # the candidate families' base rates

Runs examples/train_cpu.py (SmolLM2-135M-Instruct served with the trainer's live weights, the
white-box harness, TRL's GRPOTrainer with the project's rollout function) and prints the figures:

- the held-out success before training and after N steps, each with n and its standard error, and
  the difference with the standard error of the difference;
- whether every captured turn of step k was sampled from weights version k (the on-policy join);
- wall time per step (and its parts: rollouts, training, checks), sampled tokens per second;
- where the curve (curve.json) and the plot (learning.png) went.

Flags after `--` go to the example unchanged (`--learning-rate`, `--num-generations`, ...).
The whole run with the defaults took 32 minutes on this 2-core machine (load average ~2 from
other work); the model's weights are cached after the first load (tests/cpu_policy/smollm2.py).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples import train_cpu  # noqa: E402

ON_POLICY_GAP = 1e-3  # largest |captured - trainer| logprob of an on-policy step (measured: ~5e-5)
# The defaults of the documented run (docs/training.md, "Learning on CPU").
DEFAULTS = [
    "--family",
    "write_call",
    "--tasks-per-step",
    "2",
    "--num-generations",
    "4",
    "--learning-rate",
    "1e-4",
    "--temperature",
    "0.7",
    "--max-turns",
    "2",
    "--max-tokens",
    "64",
    "--eval-attempts",
    "4",
    "--check-rollouts",
    "1",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="optimiser steps (default %(default)s)")
    ap.add_argument("--out", default="runs/learning", help="curve.json and learning.png (default %(default)s)")
    ap.add_argument("--plot", default=None, help="also copy the plot here (e.g. docs/learning.png)")
    ap.add_argument("--measure-base", type=int, default=0, metavar="N", help="only the base success of every family over N attempts")
    ap.add_argument("--families", default=",".join(sorted(train_cpu.FAMILIES)), help="with --measure-base: these (comma-separated)")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="-- then flags for examples/train_cpu.py")
    args = ap.parse_args()
    rest = [a for a in args.rest if a != "--"]
    if args.measure_base:
        example = train_cpu.parse_args([*DEFAULTS, *rest])
        print(
            f"base success over {args.measure_base} attempts per family (training tasks, T={example.temperature}, "
            f"max_turns={example.max_turns}, {example.max_tokens} tokens per call):"
        )
        families = [f for f in args.families.split(",") if f]
        if unknown := set(families) - set(train_cpu.FAMILIES):
            ap.error(f"--families: no family {sorted(unknown)}; the families are {sorted(train_cpu.FAMILIES)}")
        found = train_cpu.measure_base(example, args.measure_base, log=lambda line: None, families=families)
        for family, ev in found.items():
            print(f"  {family:<11} {ev.line()}  mean reward {ev.mean_reward:.3f}  ({train_cpu.FAMILIES[family][1]})")
        return 0

    example = train_cpu.parse_args([*DEFAULTS, "--steps", str(args.steps), "--out", args.out, *rest])
    run = train_cpu.train(example)
    out = Path(example.out)
    curve = train_cpu.write_curve(run, out)
    train_cpu.plot(curve, out / "learning.png")
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "learning.png", args.plot)

    steps = curve["steps"]
    # The versions the turns record, and the numbers: the captured logprobs are the trainer's own
    # (float32 summation order apart). With vLLM the versions are a label; the gap is the evidence.
    on_policy = all(
        s["turn_versions"] == [s["step"] - 1]
        and s["unmatched_turns"] == 0
        and s["served_version_after"] in (None, s["step"] - 1)
        and s["logp_gap_max"] is not None
        and s["logp_gap_max"] < ON_POLICY_GAP
        for s in steps
    )
    walls = [s["wall_s"] for s in steps if s["wall_s"]]
    gen = [s["generation_s"] for s in steps]
    checks = [s["check_s"] + s["probe_s"] + s["sync_s"] for s in steps]
    rates = [s["sampled_tokens_per_s"] for s in steps if s["sampled_tokens_per_s"]]
    print()
    print(
        f"task family {example.family}: {train_cpu.FAMILIES[example.family][1]}; "
        f"{example.tasks_per_step} tasks x {example.num_generations} rollouts per step, lr {example.learning_rate}, "
        f"T {example.temperature}, top {example.train_layers} blocks trained"
    )
    if run.base and run.final:
        print(f"held-out success before training: {run.base.line()}")
        print(f"held-out success after {len(steps)} steps: {run.final.line()}")
        diff, se = curve["difference"], curve["difference_stderr"]
        print(
            f"difference: {diff:+.3f} ± {se:.3f} (standard error of the difference: {diff / se if se else float('inf'):.1f} of them); "
            f"{'above' if diff > run.final.stderr else 'not above'} the base by more than the after rate's standard error"
        )
    first, last = steps[: len(steps) // 2], steps[len(steps) // 2 :]
    mean = lambda xs: statistics.fmean(xs) if xs else float("nan")  # noqa: E731
    print(
        f"training rollouts' mean reward: first half {mean([s['reward_mean'] for s in first if s['reward_mean'] is not None]):.3f}, "
        f"second half {mean([s['reward_mean'] for s in last if s['reward_mean'] is not None]):.3f}"
    )
    constrained = [s["constrained_logp_gap_max"] for s in steps if s["constrained_logp_gap_max"] is not None]
    apart = f" (turns under structured outputs apart: {max(constrained):.1f}, the grammar's masking)" if constrained else ""
    print(
        f"on-policy: every captured turn of every step labelled with, and its logprobs those of, the weights the step started with: {on_policy}; "
        f"largest captured-vs-trainer logprob gap {max((s['logp_gap_max'] or 0) for s in steps):.1e}{apart}; "
        f"KL to the initial weights at the last step {steps[-1]['kl'] if steps[-1]['kl'] is not None else float('nan'):.3g}"
    )
    print(
        f"wall time per step: {mean(walls):.0f} s (rollouts {mean(gen):.0f} s, sync + probe + checks {mean(checks):.0f} s, "
        f"training the rest); sampled tokens/s {mean(rates):.1f}"
    )
    if run.base and run.final:
        print(f"evaluations: {run.base.seconds:.0f} s before, {run.final.seconds:.0f} s after")
    print(f"whole run {run.total_seconds / 60:.1f} min; curve {out / 'curve.json'}, plot {out / 'learning.png'}" + (f" (and {args.plot})" if args.plot else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
