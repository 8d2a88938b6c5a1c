"""examples/train_grpo.py is on-policy: its trainer samples every step's rollouts from the weights it
is about to update.

Two checks, both on CPU without a GPU or a vLLM server:

- the configuration the example builds: TRL's vLLM server mode, pointed at the same vLLM that
  every rollout's harness calls, under the trained model's name, with the project's rollout
  function and TRL's default loss;
- the trainer built from the example's own arguments, run for real for a few optimiser steps on a
  tiny model. Only the vLLM server is replaced, by a stand-in that holds a copy of the weights
  (what vLLM holds), takes what TRL's `sync_weights` pushes, and samples the rollouts from that copy
  with their logprobs, as vLLM with `--logprobs-mode processed_logprobs` would. TRL recomputes each
  sampled token's logprob with the weights it trains and logs the largest gap
  (`sampling/sampling_logp_difference/max`): zero at every step means every rollout was sampled
  from the weights being updated. The same loop with the weight push switched off (the example as
  it was before it used server mode) shows the gap opening after the first step.
"""

from __future__ import annotations

import copy
import importlib.util
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness_env.client import trl as project_trl
from harness_env.models import RolloutResult, Turn

pytestmark = pytest.mark.slow  # a trainer and its policy server: not in the fast tier


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_grpo.py"
TASKS = [{"task_id": f"t{i}", "instruction": f"make file {i}", "verify": [f"test -f f{i}"]} for i in range(2)]
CPU = dict(use_cpu=True, bf16=False)  # the device settings only: the example asks for bf16 on a GPU


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("train_grpo_example", EXAMPLE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example() -> Any:
    return load_example()


@pytest.fixture(autouse=True)
def _no_url_from_the_environment(monkeypatch):
    for var in ("VLLM_URL", "VLLM_MODEL", "HARNESS_ENV_URL", "HARNESS_ENV_TOKEN"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("algorithm", ["grpo", "gspo"])
def test_the_trainer_syncs_its_weights_into_the_vllm_the_harnesses_call(example, algorithm, tmp_path):
    from trl import GRPOConfig

    args = example.parse_args(
        ["--tasks", "tasks.jsonl", "--algorithm", algorithm, "--model", "org/policy-7b", "--vllm-url", "http://gpu-host:8000/v1", "--output-dir", str(tmp_path)]
    )
    kwargs = example.build_trainer_kwargs(args, TASKS, run_many=lambda requests: [], **CPU)
    config = kwargs["args"]

    # TRL's vLLM server mode: the trainer streams its weights into this server before generating.
    assert config.use_vllm is True and config.vllm_mode == "server"
    assert config.vllm_server_base_url == "http://gpu-host:8000"
    # ... and every rollout's harness samples from that same server, under the trained model's name.
    func = kwargs["rollout_func"]
    assert type(func) is project_trl.HarnessRolloutFunc  # the project's rollout function, not a copy
    assert func.request["endpoint"] == {"base_url": config.vllm_server_base_url + "/v1", "model": kwargs["model"]}
    assert kwargs["model"] == "org/policy-7b"
    # The project's reward function, and the sampler's temperature is the one TRL trains at.
    assert len(kwargs["reward_funcs"]) == 1 and kwargs["reward_funcs"][0] is project_trl.harness_reward
    assert func.request["temperature"] == config.temperature
    # The importance-sampling correction uses the captured (processed) logprobs.
    assert config.vllm_importance_sampling_correction is True
    assert config.num_iterations == 1 and config.beta == 0.0
    if algorithm == "grpo":
        assert config.loss_type == GRPOConfig.__dataclass_fields__["loss_type"].default  # TRL's default, not "grpo"
        assert config.importance_sampling_level == "token"
        assert config.steps_per_generation == config.gradient_accumulation_steps  # one generation per optimiser step
    else:  # TRL's documented GSPO recipe (the example says why it keeps loss_type="grpo")
        assert (config.loss_type, config.importance_sampling_level, config.epsilon, config.epsilon_high, config.steps_per_generation) == (
            "grpo",
            "sequence",
            3e-4,
            4e-4,
            4,
        )


def test_the_rollout_function_runs_through_the_harness_env_server(example, monkeypatch):
    made = []

    def recording_runner(client, concurrency=8):
        made.append((client, concurrency))
        return real_runner(client, concurrency)

    real_runner = project_trl.remote_runner
    monkeypatch.setattr(project_trl, "remote_runner", recording_runner)
    args = example.parse_args(["--tasks", "tasks.jsonl", "--server", "http://harness-host:8100", "--concurrency", "3"])
    func = example.build_trainer_kwargs(args, TASKS, **CPU)["rollout_func"]
    # By default the rollouts go through the project's remote runner, to a client of --server.
    ((client, concurrency),) = made
    assert client.base_url == "http://harness-host:8100" and concurrency == 3
    assert type(func) is project_trl.HarnessRolloutFunc
    assert func.task_for_prompt([{"role": "user", "content": "make file 1"}]) == TASKS[1]
    # Several servers, comma-separated: one client spreading the rollouts over them.
    made.clear()
    args = example.parse_args(["--tasks", "tasks.jsonl", "--server", "http://a:8100, http://b:8100"])
    example.build_trainer_kwargs(args, TASKS, **CPU)
    ((client, _),) = made
    assert client.base_urls == ["http://a:8100", "http://b:8100"]


def test_urls_and_model_default_to_the_variables_the_harness_env_server_reads(example, monkeypatch):
    monkeypatch.setenv("VLLM_URL", "http://10.0.0.5:8001/v1")
    monkeypatch.setenv("VLLM_MODEL", "org/m")
    args = example.parse_args(["--tasks", "t.jsonl"])
    assert example.vllm_root(args.vllm_url) == "http://10.0.0.5:8001"
    assert example.policy_endpoint(args) == {"base_url": "http://10.0.0.5:8001/v1", "model": "org/m"}
    # A harness-env server that reaches the same vLLM by another address.
    args = example.parse_args(["--tasks", "t.jsonl", "--policy-url", "http://vllm.internal:8001/v1/"])
    assert example.policy_endpoint(args) == {"base_url": "http://vllm.internal:8001/v1", "model": "org/m"}


# -- the trainer, run for a few steps against a stand-in for the vLLM server ----------------------
VOCAB = ["<pad>", "<eos>", "<unk>", "make", "file", "0", "1", "a", "b", "c", "d", "e"]
STEPS = 3


def tiny_policy() -> tuple[Any, Any]:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(VOCAB),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=64,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=None,
            tie_word_embeddings=False,
        )
    )
    return model, tokenizer


class VLLMStandIn:
    """What TRL's server mode talks to, reduced to what this test needs: a copy of the policy's
    weights, replaced by whatever `sync_weights` pushes, that samples rollouts with processed
    logprobs (log_softmax(logits / T) of each sampled token)."""

    def __init__(self, served: Any, push_weights: bool) -> None:
        self.served = served  # copied before the trainer exists (the trainer wraps its model's forward)
        self.push_weights = push_weights
        self.trainer_model: Any = None
        self.calls: list[tuple[str, Any]] = []
        self.rng = random.Random(0)

    def generation_backend(self, *, model: Any, mode: str, server_base_url: str | None, **_: Any) -> Any:
        """Stands for TRL's VLLMGeneration (which would connect to the server and open NCCL)."""
        self.calls.append(("connect", (mode, server_base_url)))
        self.trainer_model = model
        info = {"model_config": {"logprobs_mode": "processed_logprobs"}}
        return SimpleNamespace(sync_weights=self.sync_weights, vllm_client=SimpleNamespace(get_server_info=lambda: info))

    def sync_weights(self) -> None:
        self.calls.append(("sync", None))
        if self.push_weights:
            self.served.load_state_dict(self.trainer_model.state_dict())

    def run_many(self, requests: list[dict[str, Any]], tokenizer: Any) -> list[RolloutResult]:
        import torch

        self.calls.append(("rollouts", [r["endpoint"] for r in requests]))
        results = []
        for i, req in enumerate(requests):
            prompt = tokenizer(req["task"]["instruction"], add_special_tokens=False)["input_ids"]
            ids, logps = list(prompt), []
            with torch.no_grad():
                for _ in range(4):
                    logits = self.served(torch.tensor([ids])).logits[0, -1].float() / req["temperature"]
                    lp = torch.log_softmax(logits, dim=-1)
                    tid = self.rng.choices(range(len(lp)), weights=lp.exp().tolist())[0]
                    ids.append(tid)
                    logps.append(lp[tid].item())
            turn = Turn(
                index=0,
                branch=0,
                prompt_token_ids=prompt,
                completion_token_ids=ids[len(prompt) :],
                per_token_logps=logps,
                capture_level="tokens",
                upstream_status=200,
            )
            results.append(RolloutResult(task_id=req["task"]["task_id"], reward=float(i % 2), proxy_turns=[turn]))
        return results


def train_a_few_steps(example: Any, tmp_path: Path, monkeypatch: Any, push_weights: bool) -> tuple[VLLMStandIn, list[dict[str, Any]], Any]:
    import trl.trainer.grpo_trainer as grpo_trainer
    from trl import GRPOTrainer

    model, tokenizer = tiny_policy()
    vllm = VLLMStandIn(copy.deepcopy(model), push_weights)
    monkeypatch.setattr(grpo_trainer, "VLLMGeneration", vllm.generation_backend)
    args = example.parse_args(
        ["--tasks", "tasks.jsonl", "--num-generations", "2", "--model", "tiny-policy", "--vllm-url", "http://127.0.0.1:8000", "--output-dir", str(tmp_path)]
    )
    kwargs = example.build_trainer_kwargs(
        args,
        TASKS,
        run_many=lambda requests: vllm.run_many(requests, tokenizer),
        **CPU,
        max_steps=STEPS,
        learning_rate=0.05,
        max_completion_length=8,
        save_strategy="no",
        logging_steps=1,
        dataloader_num_workers=0,
    )
    assert kwargs["model"] == "tiny-policy"  # the name vLLM serves; the weights below stand in for it
    trainer = GRPOTrainer(**(kwargs | {"model": model}), processing_class=tokenizer)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "sampling/sampling_logp_difference/max" in h]
    return vllm, steps, args


def test_every_step_samples_from_the_weights_it_updates(example, tmp_path, monkeypatch):
    vllm, steps, args = train_a_few_steps(example, tmp_path, monkeypatch, push_weights=True)
    endpoint = {"base_url": "http://127.0.0.1:8000/v1", "model": "tiny-policy"}
    # Connect to the server once; then, every step: push the weights, then run the rollouts on them.
    assert vllm.calls == [("connect", ("server", "http://127.0.0.1:8000"))] + [("sync", None), ("rollouts", [endpoint] * 2)] * STEPS
    assert len(steps) == STEPS
    gaps = [s["sampling/sampling_logp_difference/max"] for s in steps]
    assert max(gaps) < 1e-4, gaps  # the rollouts' logprobs are the trained weights' own
    assert all(abs(s["sampling/importance_sampling_ratio/mean"] - 1.0) < 1e-4 for s in steps)


def test_without_the_weight_push_the_rollouts_drift_off_policy(example, tmp_path, monkeypatch):
    """The control: the same loop serving the initial weights forever (the old example)."""
    _, steps, _ = train_a_few_steps(example, tmp_path, monkeypatch, push_weights=False)
    gaps = [s["sampling/sampling_logp_difference/max"] for s in steps]
    assert gaps[0] < 1e-4 and min(gaps[1:]) > 1e-2, gaps
