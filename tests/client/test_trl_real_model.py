"""The training contract on a real model, end to end on CPU: SmolLM2-135M-Instruct served like
vLLM (tests/fakes/real_model.py), a white-box rollout through the capture proxy, the captured
logprobs against the model's own teacher-forced ones, and one TRL GRPO step on the rows.

Slow (minutes: the model loads once per process, decoding runs at ~10 tokens/s): deselect with
`-m "not real_model"` while developing; CI runs them."""

import functools
import itertools
import json
import math

import pytest

from harness_env import Endpoint, RolloutRequest, Task, run_rollout
from harness_env.client.trl import HarnessRolloutFunc, harness_reward
from harness_env.rollout import run_many_sync
from tests.fakes.real_model import RealModelServer, load_real_model

pytestmark = [pytest.mark.real_model, pytest.mark.timeout(1200)]

TEMPERATURE = 1.0
FIRST_CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "echo hi > a.txt"}}\n</tool_call>'


def force_first_call(body):
    """The 135M model seldom calls a tool unprompted: its first answer is fixed (tokens still
    scored by the model); the later ones are sampled."""
    return FIRST_CALL if sum(m.get("role") == "assistant" for m in body["messages"]) == 0 else None


@pytest.fixture(scope="module")
def model():
    return load_real_model()


async def test_captured_logprobs_equal_the_models_teacher_forced_ones(model):
    with RealModelServer(model=model, force=force_first_call, max_tokens_cap=48) as srv:
        req = RolloutRequest(task=Task(instruction="Create a.txt containing hi, then say done.", verify=["grep -q hi a.txt"]),
                             endpoint=Endpoint(base_url=srv.base_url, model=srv.model_name), harness="whitebox",
                             temperature=TEMPERATURE, max_turns=3, top_logprobs=2, agent_timeout_s=600)
        res = await run_rollout(req)
    assert res.error is None, res.error
    assert res.reward == 1.0 and res.agent_tool_calls >= 1
    assert res.rollout_type == "train", res.rollout_type_reason  # the probe found token ids and processed logprobs
    turns = [t for t in res.proxy_turns if t.purpose == "policy"]
    assert len(turns) >= 2
    sampled = 0
    for t in turns:
        assert t.completion_token_ids and len(t.per_token_logps) == len(t.completion_token_ids)
        truth = model.teacher_forced_logprobs(t.prompt_token_ids, t.completion_token_ids, TEMPERATURE)
        worst = max(abs(a - b) for a, b in zip(t.per_token_logps, truth))
        assert worst < 1e-3, (t.index, worst)
        sampled += len(t.completion_token_ids)
    assert sampled > 20
    # The white-box history is verbatim, so the trajectory is one branch the trainer can use whole.
    assert res.graph.branches == 1 and res.graph.untrainable_branches == 0
    (row,) = res.training_rows()
    assert sum(row.loss_mask) == sampled == res.graph.trainable_tokens


def test_rows_from_a_group_of_rollouts_take_one_grpo_step(model, tmp_path):
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    verdicts = itertools.cycle([["grep -q hi a.txt"], ["false"]])  # the same work, graded 1 then 0: a group with signal
    with RealModelServer(model=model, force=force_first_call, max_tokens_cap=40) as srv:
        func = HarnessRolloutFunc(
            run_many=functools.partial(run_many_sync, concurrency=1),
            task_for_prompt=lambda p: {"instruction": p[-1]["content"], "verify": next(verdicts)},
            request={"harness": "whitebox", "endpoint": {"base_url": srv.base_url, "model": srv.model_name},
                     "temperature": TEMPERATURE, "max_turns": 2, "agent_timeout_s": 600},
        )
        policy = model.trainable_copy()  # the server keeps serving the original weights
        before = {n: p.detach().clone() for n, p in policy.named_parameters()}
        config = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=2, num_generations=2,
                            max_steps=1, learning_rate=1e-4, loss_type="grpo", beta=0.0, temperature=TEMPERATURE,
                            max_completion_length=4096, gradient_checkpointing=False, report_to="none", save_strategy="no",
                            logging_steps=1, dataloader_num_workers=0)
        dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "Create a.txt containing hi."}]}])
        trainer = GRPOTrainer(model=policy, args=config, train_dataset=dataset, processing_class=model.tokenizer,
                              reward_funcs=[harness_reward], rollout_func=func)
        trainer.train()
    rewards = [r.reward for r in func.last_results]
    assert sorted(rewards) == [0.0, 1.0], [r.error for r in func.last_results]
    assert all(r.rollout_type == "train" for r in func.last_results)
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert logged and math.isfinite(logged[0]["loss"]), json.dumps(trainer.state.log_history)
    changed = [n for n, p in policy.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed, "one optimisation step changed no weight"
