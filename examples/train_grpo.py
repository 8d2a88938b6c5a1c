"""GRPO (or GSPO) training inside a real harness, on a GPU host.

Three processes:

1. the policy, served by vLLM with what the capture needs (token ids come back on request; the
   logprobs must be the processed ones the sampler drew from):

       vllm serve Qwen/Qwen3-1.7B --port 8000 --enable-auto-tool-choice --tool-call-parser hermes \\
           --logprobs-mode processed_logprobs --max-logprobs 20

2. harness-env (`./dev serve`, or the Docker image) next to it:

       VLLM_URL=http://127.0.0.1:8000/v1 VLLM_MODEL=Qwen/Qwen3-1.7B ./dev serve --port 8100

3. this trainer:

       pip install "harness-env[train]"
       python examples/train_grpo.py --server http://127.0.0.1:8100 --tasks tasks.jsonl --harness pi

`tasks.jsonl` holds one Task a line (instruction, setup, verify, files, task_id). Every rollout
runs the harness against vLLM through harness-env's capture proxy at `--temperature` (forced on
every model call, so the logprobs TRL compares with are the ones it trains at); each branch of a
rollout becomes token ids + loss mask + logprobs, the reward is the task's verify reward. Failed
rollouts come back unscored and cost the step nothing.

The trainer's weights reach the vLLM server the way your vLLM deployment supports (TRL's vLLM
server mode, or a checkpoint reload every `--save-steps`); until then rollouts are slightly
off-policy, which the importance ratios (per token for GRPO, per sequence for GSPO) account for.
This script is not run in CI (no GPU there); tests/client/test_trl_real_model.py runs the same rows through one TRL
GRPO step on a small real model on CPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True, help="harness-env server URL")
    ap.add_argument("--token", default=None, help="the server's token, if it has one")
    ap.add_argument("--tasks", required=True, help="JSON lines of Task fields")
    ap.add_argument("--model", default="Qwen/Qwen3-1.7B", help="the policy being trained (the one vLLM serves)")
    ap.add_argument("--harness", default="pi", choices=["pi", "opencode", "whitebox"])
    ap.add_argument("--algorithm", default="grpo", choices=["grpo", "gspo"])
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-turns", type=int, default=30)
    ap.add_argument("--concurrency", type=int, default=32, help="rollouts in flight on the server")
    ap.add_argument("--output-dir", default="runs/harness-grpo")
    ap.add_argument("--save-steps", type=int, default=50)
    args = ap.parse_args()

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from harness_env.client import HarnessEnv
    from harness_env.client.trl import HarnessRolloutFunc, harness_reward, remote_runner

    tasks = [json.loads(line) for line in Path(args.tasks).read_text().splitlines() if line.strip()]
    by_instruction = {t["instruction"]: t for t in tasks}
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": t["instruction"]}]} for t in tasks])

    client = HarnessEnv(args.server, token=args.token)
    rollout_func = HarnessRolloutFunc(
        run_many=remote_runner(client, concurrency=args.concurrency),
        task_for_prompt=lambda prompt: by_instruction[prompt[-1]["content"]],
        # "vllm": the server's VLLM_URL / VLLM_MODEL; the upstream stays configured on the server.
        request={"harness": args.harness, "endpoint": "vllm", "temperature": args.temperature, "max_turns": args.max_turns},
    )

    common = dict(output_dir=args.output_dir, num_generations=args.num_generations, temperature=args.temperature,
                  per_device_train_batch_size=args.num_generations, gradient_accumulation_steps=1, bf16=True,
                  max_completion_length=16384, save_steps=args.save_steps, logging_steps=1, report_to="none")
    if args.algorithm == "gspo":  # sequence-level importance ratios
        config = GRPOConfig(**common, loss_type="grpo", importance_sampling_level="sequence", beta=0.0,
                            epsilon=3e-4, epsilon_high=4e-4, steps_per_generation=4)
    else:  # token-level ratios, the GRPO objective
        config = GRPOConfig(**common, loss_type="grpo", importance_sampling_level="token", beta=0.0)
    trainer = GRPOTrainer(model=args.model, args=config, train_dataset=dataset,
                          reward_funcs=[harness_reward], rollout_func=rollout_func)
    trainer.train()


if __name__ == "__main__":
    main()
