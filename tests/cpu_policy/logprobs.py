"""Processed logprobs as vLLM computes them, and teacher forcing: a model's logprobs of given tokens.

vLLM's `--logprobs-mode processed_logprobs` reports log_softmax(logits / temperature), and at
temperature 0 (greedy) the raw log_softmax; a -inf logprob is clamped to `LOGPROB_FLOOR` in its
answers. The sampler (chat_model.py) and teacher forcing here use the same `processed`, so a
trainer's importance ratios compare like with like.
"""

from __future__ import annotations

from typing import Any

LOGPROB_FLOOR = -9999.0  # vLLM clamps -inf logprobs to this in its answers


def processed(logits: Any, temperature: float) -> Any:
    """log_softmax(logits / temperature) over the last axis; the raw log_softmax when greedy."""
    import torch

    if temperature < 1e-5:  # greedy, as vLLM: raw logprobs
        return torch.log_softmax(logits, dim=-1)
    return torch.log_softmax(logits / temperature, dim=-1)


def teacher_forced_logprobs(model: Any, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0) -> list[float]:
    """`model`'s processed logprob of each completion token after the prompt, in one forward pass
    (any causal LM: the served model, a trainer's, a reference copy)."""
    return token_logprobs(model, [*prompt_ids, *completion_ids], len(prompt_ids), temperature)


def token_logprobs(model: Any, token_ids: list[int], start: int, temperature: float = 1.0) -> list[float]:
    """`model`'s processed logprob of every token of `token_ids` from index `start` on, each given
    the tokens before it, in one forward pass over the whole sequence: a multi-turn row is scored
    once, its turns' tokens read off by position (a causal model's logits at a position depend on
    the tokens before it only). Only the positions from `start` on go through the output layer."""
    import torch

    scored = len(token_ids) - start
    if scored == 0:
        return []
    if not 0 < start < len(token_ids):
        raise ValueError(f"start must leave a token before it and be within the {len(token_ids)} tokens, not {start}")
    ids = torch.tensor([list(token_ids)], dtype=torch.long, device=next(model.parameters()).device)
    with torch.inference_mode():
        logits = model(input_ids=ids, use_cache=False, logits_to_keep=scored + 1).logits[0, :-1].float()
    lp = processed(logits, temperature)
    picked = lp.gather(1, ids[0, start:].unsqueeze(1)).squeeze(1)
    return [max(float(v), LOGPROB_FLOOR) for v in picked.tolist()]
