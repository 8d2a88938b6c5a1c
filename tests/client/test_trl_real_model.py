"""One TRL GRPO step on rows a real engine gave, end to end on CPU: white-box rollouts through the
capture proxy against a real vLLM (tests/vllm_engine.py: SmolLM2-135M-Instruct, float32, processed
logprobs), graded, turned into rows by the TRL adapter, and one optimisation step of the same
model's first two layers. (That the captured logprobs equal teacher-forced ones is tests/envs/test_vllm_contract.py.)"""

import functools
import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest

from harness_env.client.trl import HarnessRolloutFunc, harness_reward, rollout_batch
from harness_env.rollout import run_many_sync
from tests.envs.test_vllm_contract import regex_literal
from tests.vllm_engine import model_dir

pytestmark = [pytest.mark.real_model, pytest.mark.timeout(1200)]

TEMPERATURE = 1.0
# The 135M model seldom calls a tool unprompted: its first answer is constrained to this call
# (structured outputs: the tokens are still the model's, scored by it); the later ones are free.
FIRST_CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "echo hi > a.txt"}}\n</tool_call>'


def one_cpu_step(policy: Any, tokenizer: Any, func: HarnessRolloutFunc, prompt: str, output_dir: Path, **config: Any) -> Any:
    """One GRPO step of `policy` on CPU in float32 over `func`'s rollouts for `prompt`, logged,
    nothing saved or reported (`config`: the test's own GRPOConfig fields); the trainer after it."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,
        max_steps=1,
        learning_rate=1e-4,
        beta=0.0,
        max_completion_length=4096,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        dataloader_num_workers=0,
        **config,
    )
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": prompt}]}])
    trainer = GRPOTrainer(model=policy, args=args, train_dataset=dataset, processing_class=tokenizer, reward_funcs=[harness_reward], rollout_func=func)
    trainer.train()
    return trainer


def test_rows_from_a_group_of_rollouts_take_one_grpo_step(vllm_server, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    verdicts = itertools.cycle([["grep -q hi a.txt"], ["false"]])  # the same work, graded 1 then 0: a group with signal
    func = HarnessRolloutFunc(
        run_many=functools.partial(run_many_sync, concurrency=1),
        task_for_prompt=lambda p: {"instruction": p[-1]["content"], "verify": next(verdicts)},
        request={
            "harness": "whitebox",
            "endpoint": {"base_url": vllm_server.base_url, "model": vllm_server.model},
            "temperature": TEMPERATURE,
            "max_turns": 2,
            "agent_timeout_s": 600,
            "max_tokens_cap": 96,
            "structured_regex": regex_literal(FIRST_CALL),
            "structured_calls": 1,
        },
    )
    # The weights vLLM serves, cut to their first two layers: the rows' tokens and logprobs are the
    # engine's, and what is checked is that TRL takes them and steps (the trainer's own logprobs
    # against vLLM's are tests/examples/test_train_cpu_vllm.py's); all 30 cost four times the CPU.
    policy = AutoModelForCausalLM.from_pretrained(str(model_dir()), dtype=torch.float32, num_hidden_layers=2)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir()))
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    config = {"per_device_train_batch_size": 2, "num_generations": 2, "loss_type": "grpo", "temperature": TEMPERATURE}
    trainer = one_cpu_step(policy, tokenizer, func, "Create a.txt containing hi.", tmp_path, **config)
    rewards = [r.reward for r in func.last_results]
    assert sorted(rewards) == [0.0, 1.0], [r.error for r in func.last_results]
    assert all(r.rollout_type == "train" for r in func.last_results)
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert logged and math.isfinite(logged[0]["loss"]), json.dumps(trainer.state.log_history)
    changed = [n for n, p in policy.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed, "one optimisation step changed no weight"


@pytest.mark.usefixtures("compacting")
def test_a_grpo_step_gives_every_branch_of_a_compacted_rollout_gradient(request_for, tmp_path):
    """Two white-box rollouts that compact their history (two branches each, captured against the
    scripted policy), two branch slots each: one GRPO step of SmolLM2 gives all four rows gradient,
    with the advantages the adapter says. The scripted policy's token ids are mapped into the
    model's vocabulary (elementwise, so every prefix relation holds). The model is SmolLM2 cut to its
    first two layers: what is checked is where TRL's gradient goes, not what the model would sample,
    and the 30 layers cost four times the CPU (about a minute of it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir()))
    policy = AutoModelForCausalLM.from_pretrained(str(model_dir()), dtype=torch.float32, num_hidden_layers=2)
    assert len(policy.model.layers) == 2
    vocab = policy.get_input_embeddings().num_embeddings

    def run_many(requests):
        results = run_many_sync(requests, concurrency=1)
        for t in (t for r in results for t in r.proxy_turns):
            t.prompt_token_ids, t.completion_token_ids = [i % vocab for i in t.prompt_token_ids], [i % vocab for i in t.completion_token_ids]
        return results

    verdicts, n = itertools.cycle([["test -f a"], ["false"]]), itertools.count()
    func = HarnessRolloutFunc(
        run_many=run_many, request=request_for, branch_slots=2, task_for_prompt=lambda p: {"instruction": f"make a ({next(n)})", "verify": next(verdicts)}
    )
    seen = []  # (input ids, gradient at the embeddings' output) of each batch that is trained

    def keep_gradient(module, args, out):
        if out.requires_grad:
            out.register_hook(lambda g, ids=args[0]: seen.append((ids, g)))

    policy.get_input_embeddings().register_forward_hook(keep_gradient)
    trainer = one_cpu_step(policy, tokenizer, func, "make a", tmp_path, per_device_train_batch_size=2, num_generations=4, gradient_accumulation_steps=2)

    assert [r.reward for r in func.last_results] == [1.0, 0.0] and all(r.graph.branches == 2 for r in func.last_results)
    rows = [r.token_ids for res in func.last_results for r in res.training_rows()]
    assert len(rows) == 4 and all(rows)
    batch = [(seq, g) for ids, grad in seen for seq, g in zip(ids.tolist(), grad)]  # two micro-batches of two rows
    for row in rows:  # each row's tokens, found in the batch (left-padded prompt, right-padded completion)
        g, start = next((g, s) for seq, g in batch for s in range(len(seq) - len(row) + 1) if seq[s : s + len(row)] == row)
        assert g[start : start + len(row)].abs().sum() > 0
    expected = rollout_batch(func.last_results, 2, branch_slots=2)["harness_advantage"]  # what the adapter says TRL computes
    assert sorted(trainer._logs["advantages"]) == pytest.approx(sorted(expected), abs=1e-4) and min(expected) < 0 < max(expected)
