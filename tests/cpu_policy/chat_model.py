"""A transformers causal LM serving chat as vLLM does: rendering, sampling, batching, live weights.

`ChatModel` renders a request as vLLM does (chat_template.py), samples with processed logprobs
(logprobs.py), decodes the answers in progress together on one engine thread (batching.py), and
takes new weights between answers.

Weight versions. `ChatModel.version` counts the weight loads (the trainer passes its optimiser
step); each generation runs under the model's lock and records the version it was sampled from,
so a load never lands in the middle of an answer.
"""

from __future__ import annotations

import atexit
import copy
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from tests.cpu_policy.batching import Batch, CacheEntry, Generation, Job, cache_of, common_prefix, layers_of
from tests.cpu_policy.chat_template import CHAT_TEMPLATE, RequestError, prepare_messages
from tests.cpu_policy.logprobs import LOGPROB_FLOOR, processed, teacher_forced_logprobs


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
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()  # None: stop the engine
        self._loading = threading.Event()
        self._engine: threading.Thread | None = None
        self._engine_lock = threading.Lock()
        self._prefix_cache: list[CacheEntry] = []
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
    def _cached_start(self, prompt_ids: list[int]) -> tuple[Any, int]:
        """(a copy of the cache holding the longest cached prefix of the prompt, its length); at
        least the prompt's last token is left to compute (its logits start the answer)."""
        best, best_len = None, 0
        for entry in self._prefix_cache:
            n = common_prefix(entry.tokens, prompt_ids)
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
        self._prefix_cache = [e for e in self._prefix_cache if not (len(e.tokens) <= n and common_prefix(e.tokens, tokens) == len(e.tokens))]
        self._prefix_cache.append(CacheEntry(tokens, cache, time.monotonic()))
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
        job = Job(list(prompt_ids), max_tokens, temperature, top_logprobs, rng, forced_ids, on_token, cancel)
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
        waiting: deque[Job] = deque()
        while True:
            if not waiting:
                job = self._queue.get()
                if job is None:
                    return
                waiting.append(job)
            while self._loading.is_set():  # a weight load is waiting for the lock: let it in
                time.sleep(0.002)
            with self.lock, self.torch.inference_mode():
                batch: Batch | None = None
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

    def _admit(self, job: Job, batch: Batch | None) -> Batch | None:
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
                self._keep(job.prompt_ids, cache_of(layers_of(cache)))
            if self._advance(job, out.logits[0, -1]):
                self._keep(job.prompt_ids + job.gen.completion_ids, cache)
                return batch
        except Exception as e:  # this answer fails, the batch goes on
            job.fail(e)
            return batch
        if batch is None:
            return Batch([job], cache, t.ones((1, job.length), dtype=t.long))
        batch.add(job, cache)
        return batch

    def _decode(self, batch: Batch) -> None:
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

    def _advance(self, job: Job, logits: Any) -> bool:
        """Take the job's next token from the logits of its last position; True when it is done."""
        t = self.torch
        gen = job.gen
        lp = processed(logits.float(), job.temperature)
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
