"""The HTTP face of the stand-in: OpenAI chat completions answered as vLLM answers them.

What it sends is what vLLM sends, so the capture proxy records the same things:

- `return_token_ids`: `prompt_token_ids` at top level (non-stream) or on the first chunk (stream)
  and per-choice `token_ids`; the stop token (`<|im_end|>`) is part of the completion ids and
  logprobs, not of the text;
- `logprobs`/`top_logprobs`: the model's processed logprobs (logprobs.py);
- tool calls in the Hermes format, parsed as vLLM's `hermes` tool parser does (chat_template.py),
  only when the request has tools; streams carry one sampled token per chunk.

Every answer is kept in `ChatCompletionsApp.answers` (`Answer.weight_version`, the prompt and
completion ids) and sent as the OpenAI `system_fingerprint` (`weights-v<version>`). The capture
proxy records what vLLM sends and vLLM sends no weight version, so a trainer joins its captured
turns to these answers on their exact token ids (nothing is re-tokenized anywhere, so the join is
exact): examples/train_cpu.py does.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.cpu_policy.batching import Generation
from tests.cpu_policy.chat_model import ChatModel
from tests.cpu_policy.chat_template import TOOL_CALL_START, RequestError, held_back, parse_tool_calls
from tests.cpu_policy.smollm2 import MODEL_NAME


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
                    visible = full[:cut] if cut >= 0 else full[: len(full) - held_back(full)]
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
