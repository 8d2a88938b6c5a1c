"""On-policy GRPO (or GSPO) inside a real harness, on a GPU host.

The policy the harnesses sample from is the policy being trained: TRL's vLLM server mode pushes the
trainer's weights into vLLM before every generation step, and harness-env's capture proxy calls
that same vLLM. docs/training.md has the whole recipe; in short, three processes:

1. vLLM on GPU 0, with the weight-transfer engine (what `trl vllm-serve` runs in TRL 1.16), the
   processed logprobs the trainer compares with, and a tool-call parser for the harnesses:

       CUDA_VISIBLE_DEVICES=0 VLLM_SERVER_DEV_MODE=1 vllm serve Qwen/Qwen3-1.7B --host 127.0.0.1 --port 8000 \\
           --weight-transfer-config '{"backend": "nccl"}' --logprobs-mode processed_logprobs \\
           --max-logprobs -1 --enable-auto-tool-choice --tool-call-parser hermes

2. harness-env, with the same vLLM as its policy endpoint:

       VLLM_URL=http://127.0.0.1:8000/v1 VLLM_MODEL=Qwen/Qwen3-1.7B harness-env serve --port 8100

3. this trainer on GPU 1 (`pip install "harness-env[vllm]"`: TRL's vLLM client needs vllm):

       CUDA_VISIBLE_DEVICES=1 python examples/train_grpo.py --tasks tasks.jsonl --harness pi \\
           --server http://127.0.0.1:8100 --vllm-url http://127.0.0.1:8000 --model Qwen/Qwen3-1.7B

`tasks.jsonl` holds one Task a line (instruction, setup, verify, files, task_id). Each rollout
runs the harness against vLLM through the capture proxy at `--temperature` (forced on every model
call, so the logprobs TRL compares with are the ones it trains at); the branch the agent ended on
becomes token ids + loss mask + logprobs, the reward is the task's verify reward. Failed rollouts
come back unscored and cost the step nothing.

The trainer tells harness-env which endpoint to use on every request (`--vllm-url` + /v1 and
`--model`), so the vLLM that receives the weights and the one the harnesses call are the same by
construction; `--policy-url` is for a harness-env server that reaches that vLLM by another address.

`build_config` and `build_trainer_kwargs` are pure (no GPU, no network):
tests/examples/test_train_grpo.py builds the trainer from them on CPU and checks that it is
on-policy.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness_env.client.trl import HarnessRolloutFunc, RunMany, harness_reward

DEFAULT_MODEL = "Qwen/Qwen3-1.7B"
HARNESSES = ("pi", "opencode", "whitebox")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The flags; URLs and the model also come from the environment (the same VLLM_URL / VLLM_MODEL
    the harness-env server reads, so one export configures both)."""
    env = os.environ
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--tasks", required=True, help="JSON lines of Task fields (instruction, verify, setup, files, task_id)")
    ap.add_argument(
        "--server",
        default=env.get("HARNESS_ENV_URL", "http://127.0.0.1:8100"),
        help="harness-env server URL, or several separated by commas: each rollout goes to the one with the "
        "fewest in flight (env HARNESS_ENV_URL; default %(default)s)",
    )
    ap.add_argument("--token", default=env.get("HARNESS_ENV_TOKEN"), help="the harness-env server's token, if it has one (env HARNESS_ENV_TOKEN)")
    ap.add_argument(
        "--vllm-url",
        default=env.get("VLLM_URL", "http://127.0.0.1:8000"),
        help="the vLLM server the trainer pushes its weights into and the harnesses sample from (env VLLM_URL, a trailing /v1 ignored; default %(default)s)",
    )
    ap.add_argument("--policy-url", default=None, help="that same vLLM's OpenAI base URL as the harness-env server reaches it (default: --vllm-url + /v1)")
    ap.add_argument(
        "--model",
        default=env.get("VLLM_MODEL", DEFAULT_MODEL),
        help="the policy being trained: the name vLLM serves it under (env VLLM_MODEL; default %(default)s)",
    )
    ap.add_argument("--harness", default="pi", choices=HARNESSES, help="the harness every rollout runs (default %(default)s)")
    ap.add_argument(
        "--algorithm",
        default="grpo",
        choices=["grpo", "gspo"],
        help="grpo: token-level importance ratios, TRL's default loss; gspo: sequence-level ratios, TRL's GSPO recipe (default %(default)s)",
    )
    ap.add_argument("--num-generations", type=int, default=8, help="rollouts per task, the GRPO group (default %(default)s)")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature, forced on every policy call (default %(default)s)")
    ap.add_argument("--max-turns", type=int, default=30, help="model calls per rollout (default %(default)s)")
    ap.add_argument("--concurrency", type=int, default=32, help="rollouts in flight on the harness-env server (default %(default)s)")
    ap.add_argument(
        "--max-completion-length",
        type=int,
        default=16384,
        help="GRPOConfig.max_completion_length: a rollout's length is bounded by --max-turns and the "
        "model's context, TRL reports longer completions as clipped (default %(default)s)",
    )
    ap.add_argument("--learning-rate", type=float, default=1e-6, help="(default %(default)s)")
    ap.add_argument("--max-steps", type=int, default=-1, help="optimiser steps; -1: one pass over the tasks (default %(default)s)")
    ap.add_argument("--output-dir", default="runs/harness-grpo", help="checkpoints and logs (default %(default)s)")
    ap.add_argument("--save-steps", type=int, default=50, help="a checkpoint every N optimiser steps (default %(default)s)")
    return ap.parse_args(argv)


def vllm_root(url: str) -> str:
    """The vLLM server's root URL, as TRL's client wants it (it adds /v1/... and /health itself)."""
    url = url.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def policy_endpoint(args: argparse.Namespace) -> dict[str, str]:
    """The endpoint every rollout's harness calls: the vLLM the trainer syncs, under the trained
    model's name. No key: vLLM is started without one (it sits next to the trainer)."""
    return {"base_url": (args.policy_url or vllm_root(args.vllm_url) + "/v1").rstrip("/"), "model": args.model}


def build_config(args: argparse.Namespace, **overrides: Any) -> Any:
    """The GRPOConfig of the run. `overrides` (GRPOConfig fields) win: a test builds it on CPU."""
    from trl import GRPOConfig

    kwargs: dict[str, Any] = dict(
        output_dir=args.output_dir,
        # Generation is the harness rollouts; vLLM server mode is what keeps them on-policy: before
        # each generation step (a new optimiser step) the trainer streams its weights into the vLLM
        # server over NCCL and resets its prefix cache, then calls the rollout function.
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=vllm_root(args.vllm_url),
        num_generations=args.num_generations,
        per_device_train_batch_size=args.num_generations,  # one task's group per micro-batch
        gradient_accumulation_steps=1,
        temperature=args.temperature,
        max_completion_length=args.max_completion_length,
        learning_rate=args.learning_rate,
        max_steps=args.max_steps,
        bf16=True,
        save_steps=args.save_steps,
        logging_steps=1,
        report_to="none",
    )
    if args.algorithm == "gspo":
        # TRL's documented GSPO recipe (paper index). loss_type="grpo" is kept on purpose: with a
        # sequence-level ratio every token of a rollout carries the same term, and "grpo"'s mean
        # over each sequence's tokens gives exactly GSPO's per-sequence objective; a token-weighted
        # loss (TRL's default) would weight long rollouts more than the paper does.
        # steps_per_generation=4 splits each rollout batch into 4 optimiser steps: the weights are
        # still synced before every generation, and the sequence-level ratios correct the 3 steps
        # that train on samples from the weights of up to 3 steps earlier.
        kwargs |= dict(importance_sampling_level="sequence", loss_type="grpo", beta=0.0, epsilon=3e-4, epsilon_high=4e-4, steps_per_generation=4)
    else:
        # Token-level ratios with TRL's default loss (DAPO's token-level normalisation, no length
        # bias; TRL marks loss_type="grpo" as not recommended for that reason). One generation
        # per optimiser step, one pass over it (num_iterations=1): every step trains on rollouts
        # sampled from the weights it starts with.
        kwargs |= dict(importance_sampling_level="token", beta=0.0)
    return GRPOConfig(**(kwargs | overrides))


def load_tasks(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def build_rollout_func(args: argparse.Namespace, tasks: list[dict[str, Any]], run_many: RunMany) -> HarnessRolloutFunc:
    """The project's rollout function: one harness rollout per prompt, against the synced vLLM."""
    by_instruction = {t["instruction"]: t for t in tasks}
    return HarnessRolloutFunc(
        run_many=run_many,
        task_for_prompt=lambda prompt: by_instruction[prompt[-1]["content"]],
        request={"harness": args.harness, "endpoint": policy_endpoint(args), "temperature": args.temperature, "max_turns": args.max_turns},
    )


def build_trainer_kwargs(args: argparse.Namespace, tasks: list[dict[str, Any]], run_many: RunMany | None = None, **config_overrides: Any) -> dict[str, Any]:
    """`GRPOTrainer(**build_trainer_kwargs(...))`. `run_many` defaults to the harness-env server at
    `--server` (constructing it opens no connection)."""
    from datasets import Dataset

    if run_many is None:
        from harness_env.client import HarnessEnv
        from harness_env.client.trl import remote_runner

        run_many = remote_runner(HarnessEnv(base_urls=[u.strip() for u in args.server.split(",")], token=args.token), concurrency=args.concurrency)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": t["instruction"]}]} for t in tasks])
    return dict(
        model=args.model,
        args=build_config(args, **config_overrides),
        train_dataset=dataset,
        reward_funcs=[harness_reward],
        rollout_func=build_rollout_func(args, tasks, run_many),
    )


def main(argv: Sequence[str] | None = None) -> None:
    from trl import GRPOTrainer

    args = parse_args(argv)
    trainer = GRPOTrainer(**build_trainer_kwargs(args, load_tasks(args.tasks)))
    trainer.train()


if __name__ == "__main__":
    main()
