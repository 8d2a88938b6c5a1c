"""A trainer's weights loaded into the real vLLM (tests/vllm_engine.py, CPU backend) through
client/vllm_weights.py: afterwards vLLM scores tokens as the trainer's model does, under the new
version; a case vLLM's CPU backend would get wrong is refused; an engine without the routes gets
one clear error."""

from __future__ import annotations

import httpx
import pytest

from harness_env.client.vllm_weights import VllmWeightSync, VllmWeightSyncError
from tests.vllm_engine import model_dir

TEXT = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"
TOLERANCE = 1e-3  # float32 engine vs float32 transformers, the same weights


def _trainer_model():
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir()), dtype=torch.float32).eval()
    model.get_input_embeddings().requires_grad_(False)  # tied to the output layer: see the module under test
    return model


def _trainer_logprobs(model, ids: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logps = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    return [logps[i - 1, t].item() for i, t in enumerate(ids) if i]


def _engine_logprobs(vllm_server, ids: list[int]) -> list[float]:
    body = {"model": vllm_server.model, "prompt": ids, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
    resp = httpx.post(vllm_server.base_url + "/completions", json=body, timeout=120)
    resp.raise_for_status()
    scored = resp.json()["choices"][0]["prompt_logprobs"][1:]
    return [entry[str(t)]["logprob"] for entry, t in zip(scored, ids[1:])]


@pytest.mark.real_model
def test_after_a_load_vllm_scores_tokens_as_the_trainers_model_does(vllm_server):
    import torch
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(model_dir()))(TEXT)["input_ids"]
    model = _trainer_model()
    before = _engine_logprobs(vllm_server, ids)
    assert max(abs(a - b) for a, b in zip(before, _trainer_logprobs(model, ids))) < TOLERANCE  # the same start

    # An optimiser step, as far as vLLM can tell: the last layer's MLP moves
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in model.model.layers[-2:]:
            layer.mlp.down_proj.weight.add_(torch.randn(layer.mlp.down_proj.weight.shape, generator=gen) * 0.05)
    trained = _trainer_logprobs(model, ids)
    assert max(abs(a - b) for a, b in zip(before, trained)) > 0.05  # a change the check below can see

    with VllmWeightSync(vllm_server.root_url) as sync:
        try:
            assert sync.load_weights(model, version=7) > 0
            assert sync.version() == "7"
            after = _engine_logprobs(vllm_server, ids)
            assert max(abs(a - b) for a, b in zip(after, trained)) < TOLERANCE, (after[:5], trained[:5])
            assert len(list(sync.scratch.iterdir())) == 1  # the checkpoint vLLM loaded, no more
        finally:  # the suite's other tests share this engine: its own weights back
            sync.load_directory(model_dir(), "default")
    assert _engine_logprobs(vllm_server, ids) == pytest.approx(before, abs=TOLERANCE)
    assert not sync.scratch.exists()


def test_a_trained_embedding_tied_to_the_output_layer_is_refused_before_anything_is_sent():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True
    )
    model = LlamaForCausalLM(config)
    sync = VllmWeightSync("http://127.0.0.1:9")  # nothing listens: the refusal comes first
    try:
        with pytest.raises(ValueError, match="freeze the embedding"):
            sync.load_weights(model, version=1)
        assert list(sync.scratch.iterdir()) == []
        model.get_input_embeddings().requires_grad_(False)
        with pytest.raises(VllmWeightSyncError, match="pause: vLLM at http://127.0.0.1:9 did not answer"):
            sync.load_weights(model, version=1)  # frozen: it goes on to the engine
    finally:
        sync.close()


def test_an_engine_without_its_weight_routes_gets_one_clear_error(policy_server):
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False
        )
    )
    with VllmWeightSync(policy_server.base_url) as sync, pytest.raises(VllmWeightSyncError) as err:
        sync.load_weights(model, version=1)
    assert "VLLM_SERVER_DEV_MODE=1" in str(err.value) and str(err.value).startswith("pause:"), err.value
