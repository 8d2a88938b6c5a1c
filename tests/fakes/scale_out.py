"""The scripted policy with vLLM's scale-out routes answering (token continuity,
core/capture/continuity.py): render (FakePolicy's), generate from token ids, streamed or whole,
and derender, whole or one streamed chunk at a time with its carried state.

What it generates is the script's step for the conversation last rendered whole (the proxy
renders the whole conversation before it generates), with the fake's ids and logprobs; a tool call
is sampled as its argument pieces, as the chat route does. `gate`: a streamed generate sends its
first token chunk, then waits until the test sets the event (at most GATE_TIMEOUT_S), then the
rest: `timeline` says what happened in which order ("engine: first chunk sent", "engine:
released" or "engine: gate timed out", "engine: last chunk sent"), so a test can assert that the
client saw its first chunk before the engine was let go on.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.policy import FakePolicy, completion_pieces, fake_logprob, piece_ids

GATE_TIMEOUT_S = 20.0


@dataclass
class Generation:
    pieces: list[str]
    kinds: list[int]  # per piece: -1 text, else the index of the tool call whose arguments it is
    tool_calls: list[dict[str, Any]]
    ids: list[int]


@dataclass
class ScaleOutPolicy(FakePolicy):
    scale_out: bool = True
    gate: threading.Event | None = None
    timeline: list[str] = field(default_factory=list)
    generated: list[dict[str, Any]] = field(default_factory=list)  # each generate request's body
    derender_calls: int = 0
    stream_derender: bool = True  # off: a streamed derender request is refused (422), as an older vLLM
    _last_whole: dict[str, Any] | None = None
    _by_prompt: dict[tuple[int, ...], Generation] = field(default_factory=dict)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models),
                Route("/v1/chat/completions/render", self._render_noting, methods=["POST"]),
                Route("/inference/v1/generate", self._generate, methods=["POST"]),
                Route("/v1/chat/completions/derender", self._derender, methods=["POST"]),
            ]
        )

    async def _render_noting(self, request: Request) -> Response:
        body = await request.json()
        if "add_generation_prompt" not in body:
            self._last_whole = body
        return await self._render(request)

    def _generation(self, prompt: list[int], max_tokens: int | None) -> tuple[Generation, str]:
        step = self._step(self._last_whole or {})
        tool_calls: list[dict[str, Any]] = []
        if "bash" in step:
            tool_calls = [
                {"id": f"call_{len(self.generated)}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": step["bash"]})}}
            ]
        text = "" if tool_calls else step.get("text", "done")
        parts = completion_pieces(text, tool_calls)
        kinds = [-1] * len(completion_pieces(text, [])) + [i for i, c in enumerate(tool_calls) for _ in completion_pieces("", [c])]
        finish = "tool_calls" if tool_calls else "stop"
        if max_tokens is not None and len(parts) > max_tokens:
            parts, kinds, finish = parts[:max_tokens], kinds[:max_tokens], "length"
        gen = Generation(parts, kinds, tool_calls, piece_ids(parts))
        self._by_prompt[tuple(prompt)] = gen
        return gen, ("stop" if finish == "tool_calls" else finish)

    async def _generate(self, request: Request) -> Response:
        body = await request.json()
        self.routes_hit.append(request.url.path)
        self.generated.append(body)
        prompt = body["token_ids"]
        params = body.get("sampling_params") or {}
        gen, finish = self._generation(prompt, params.get("max_tokens"))
        top_n = int(params.get("logprobs") or 0)
        text_mode = body.get("output_mode") == "text"

        def logprobs(at: int) -> dict[str, Any]:
            piece, tid = gen.pieces[at], gen.ids[at]
            lp = fake_logprob(tid)
            if text_mode:
                tops = [{"token": piece, "logprob": lp, "bytes": list(piece.encode())}] + [
                    {"token": f"alt{k}", "logprob": lp - 1 - k, "bytes": []} for k in range(max(0, top_n - 1))
                ]
                return {"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": tops}
            tops = [{"token_id": tid, "logprob": lp}] + [{"token_id": 900_000 + k, "logprob": lp - 1 - k} for k in range(max(0, top_n - 1))]
            return {"token_id": tid, "logprob": lp, "top_logprobs": tops}

        versions = [{"version": "default", "start": 0, "end": len(gen.ids)}]
        if not body.get("stream"):
            choice = {
                "index": 0,
                "finish_reason": finish,
                "token_ids": gen.ids,
                "logprobs": {"content": [logprobs(i) for i in range(len(gen.ids))]},
                "weight_versions": versions,
            }
            return JSONResponse({"request_id": "gen-fake", "choices": [choice], "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(gen.ids)}})

        async def stream():
            for i in range(len(gen.ids)):
                last = i == len(gen.ids) - 1
                choice = {"index": 0, "token_ids": [gen.ids[i]], "logprobs": {"content": [logprobs(i)]}, "finish_reason": finish if last else None}
                if last:
                    choice["weight_versions"] = versions
                if text_mode:
                    choice["text"] = gen.pieces[i]
                yield f"data: {json.dumps({'request_id': 'gen-fake', 'output_mode': body.get('output_mode', 'tokens'), 'choices': [choice]})}\n\n"
                if i == 0:
                    self.timeline.append("engine: first chunk sent")
                    if self.gate is not None:
                        released = await asyncio.to_thread(self.gate.wait, GATE_TIMEOUT_S)
                        self.timeline.append("engine: released" if released else "engine: gate timed out")
                await asyncio.sleep(0)
            self.timeline.append("engine: last chunk sent")
            usage = {"prompt_tokens": len(prompt), "completion_tokens": len(gen.ids), "total_tokens": len(prompt) + len(gen.ids)}
            yield f"data: {json.dumps({'request_id': 'gen-fake', 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    def _deltas(self, gen: Generation, start: int, end: int) -> tuple[str, list[dict[str, Any]]]:
        """The chat delta for pieces [start, end): text, and tool-call deltas (head on a call's first piece)."""
        text, calls = "", []
        for i in range(start, end):
            kind = gen.kinds[i]
            if kind < 0:
                text += gen.pieces[i]
                continue
            call = gen.tool_calls[kind]
            delta: dict[str, Any] = {"index": kind, "function": {"arguments": gen.pieces[i]}}
            if i == 0 or gen.kinds[i - 1] != kind:
                delta.update(id=call["id"], type="function")
                delta["function"]["name"] = call["function"]["name"]
            calls.append(delta)
        return text, calls

    async def _derender(self, request: Request) -> Response:
        body = await request.json()
        self.routes_hit.append(request.url.path)
        self.derender_calls += 1
        gen = self._by_prompt.get(tuple(body.get("prompt_token_ids") or ()))
        if gen is None:
            return JSONResponse({"error": {"message": "unknown prompt"}}, status_code=400)
        if not body.get("stream"):
            choice = body["generate_response"]["choices"][0]
            text, _ = self._deltas(gen, 0, len(gen.ids))
            lps = [
                {
                    "token": gen.pieces[i],
                    "logprob": e["logprob"],
                    "top_logprobs": [
                        {"token": gen.pieces[i] if t["token_id"] == gen.ids[i] else f"alt{k - 1}", "logprob": t["logprob"]}
                        for k, t in enumerate(e["top_logprobs"])
                    ],
                }
                for i, e in enumerate(choice["logprobs"]["content"])
            ]
            finish = "tool_calls" if gen.tool_calls and choice["finish_reason"] == "stop" else choice["finish_reason"]
            msg = {"role": "assistant", "content": text or None, "tool_calls": gen.tool_calls if finish == "tool_calls" else []}
            out = {
                "id": "chatcmpl-derender",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [{"index": 0, "message": msg, "finish_reason": choice["finish_reason"], "logprobs": {"content": lps}}],
            }
            if (body.get("chat_request") or {}).get("return_token_ids"):  # as vLLM: the ids only when the chat request asks
                out["choices"][0]["token_ids"] = choice["token_ids"]
            return JSONResponse(out)
        if not self.stream_derender:
            return JSONResponse({"detail": [{"msg": "Input should be False", "loc": ["body", "stream"]}]}, status_code=422)
        state = body.get("stream_state") or {"seen": 0, "role_sent": False}
        choice = body["generate_chunk"]["choices"][0]
        start, end = state["seen"], state["seen"] + len(choice.get("token_ids") or [])
        text, calls = self._deltas(gen, start, end)
        delta: dict[str, Any] = {"role": None if state["role_sent"] else "assistant", "content": text or None, "reasoning": None, "tool_calls": calls}
        finish = choice.get("finish_reason")
        if finish == "stop" and gen.tool_calls:
            finish = "tool_calls"
        chunk = {
            "id": "chatcmpl-derender",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": body.get("model"),
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "stop_reason": None, "token_ids": None}],
            "usage": None,
        }
        return JSONResponse({"chunk": chunk, "stream_state": {"seen": end, "role_sent": True}})
