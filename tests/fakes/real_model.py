"""A small OpenAI-compatible server on a real model (SmolLM2-135M-Instruct, CPU), answering like vLLM.

The scripted fake (tests/fakes/policy.py) says what vLLM would send; this one computes it. Training
contract tests need the real thing: token ids from a real chat template and tokenizer, sampled
tokens whose logprobs are the model's processed logprobs (vLLM's `--logprobs-mode
processed_logprobs`), so a test can recompute them by teacher forcing and compare.

The server itself is examples/cpu_policy.py (the live-weights policy server of the CPU training
example; one implementation for both): wire shapes, the chat template with tools, the Hermes tool
parser and the weights cache are documented there. This module adds the test defaults: one model
per process (`load_real_model()`), 1 torch thread (`HARNESS_ENV_TEST_MODEL_THREADS`), no prefix
cache (every answer computed from scratch), a LoopbackServer, `force` for answers the 135M model
would seldom give.

Use: `with RealModelServer() as srv: ...srv.base_url...`, or the `real_model_server` fixture
(import it into a test module). Each answer is recorded in `srv.answers` (`Answer`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from examples.cpu_policy import (  # noqa: F401 - re-exported for the tests
    CHAT_TEMPLATE,
    DEFAULT_SYSTEM,
    GGUF_FILE,
    LOGPROB_FLOOR,
    MODEL_NAME,
    Answer,
    ChatCompletionsApp,
    ChatModel,
    Generation,
    RequestError,
    gguf_dir,
    load_smollm2,
    parse_tool_calls,
    prepare_messages,
)
from tests.fakes.loopback import LoopbackServer

# torch threads. 1 by default: on this 2-core machine, while other tests or harness processes
# run, 2 OpenMP threads spin against each other and decode 3-5x slower than 1 (measured 2.4 vs
# 11 tokens/s at load average 3.5); override with HARNESS_ENV_TEST_MODEL_THREADS.
NUM_THREADS = int(os.environ.get("HARNESS_ENV_TEST_MODEL_THREADS") or 1)

RealModel = ChatModel  # the names the tests were written with
RealModelPolicy = ChatCompletionsApp

_MODEL: ChatModel | None = None
_MODEL_LOCK = threading.Lock()


def load_real_model() -> ChatModel:
    """The process's one model, loaded on first use (no prefix cache: answers computed whole)."""
    global _MODEL
    with _MODEL_LOCK:
        if _MODEL is None:
            _MODEL = load_smollm2(threads=NUM_THREADS, prefix_cache_entries=0)
        return _MODEL


def generate(prompt_ids: list[int], max_tokens: int, temperature: float = 1.0, top_logprobs: int = 0, seed: int | None = None) -> Generation:
    return load_real_model().generate(prompt_ids, max_tokens, temperature, top_logprobs, seed)


def teacher_forced_logprobs(prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0) -> list[float]:
    return load_real_model().teacher_forced_logprobs(prompt_ids, completion_ids, temperature)


class RealModelServer(LoopbackServer):
    """Serves a ChatCompletionsApp on a loopback port from a background thread (like FakePolicyServer).

    `with RealModelServer() as srv:` -> `srv.base_url` (ends in /v1), `srv.model_name`,
    `srv.answers` (one `Answer` per answered request), `srv.model` (the `ChatModel`)."""

    def __init__(
        self,
        *,
        max_tokens_cap: int = 64,
        served_model_name: str = MODEL_NAME,
        default_seed: int | None = 0,
        force: Callable[[dict[str, Any]], str | None] | None = None,
        model: ChatModel | None = None,
    ) -> None:
        self.model = model or load_real_model()
        self.policy = ChatCompletionsApp(self.model, served_model_name, max_tokens_cap, default_seed, force)
        self.model_name = served_model_name
        super().__init__(self.policy.app(), join_timeout_s=30)  # a generation in progress finishes first

    @property
    def answers(self) -> list[Answer]:
        return self.policy.answers

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.policy.requests


@pytest.fixture
def real_model_server() -> Iterator[RealModelServer]:
    """A fresh server (the model is loaded once per process). Import this name into a test module."""
    with RealModelServer() as srv:
        yield srv
