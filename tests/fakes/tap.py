"""A recording pass-through in front of a real engine: every request body the capture proxy sent
and every answer the engine gave, byte for byte, so a test can check the captured turns against
what the engine really received and returned. Not a fake: it changes nothing (an answer is relayed
chunk by chunk as the engine sends it), unless a test gives it `shape`, a rewrite of the request
bodies it relays (it then records what it sent)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp


@dataclass
class Exchange:
    path: str
    request: bytes
    status: int
    answer: bytes
    content_type: str

    @property
    def body(self) -> dict[str, Any]:
        return json.loads(self.request)

    @property
    def streamed(self) -> bool:
        return self.content_type.startswith("text/event-stream")

    def answer_choice(self) -> dict[str, Any]:
        """The answer's one choice as a whole message: token ids, logprobs, text, tool calls (a
        stream's chunks put together in order)."""
        if not self.streamed:
            choice = json.loads(self.answer)["choices"][0]
            return {
                "token_ids": choice.get("token_ids") or [],
                "prompt_token_ids": json.loads(self.answer).get("prompt_token_ids") or [],
                "logprobs": [c["logprob"] for c in (choice.get("logprobs") or {}).get("content") or []],
                "content": (choice.get("message") or {}).get("content"),  # a generate answer has ids, no message
                "tool_calls": [(c["function"]["name"], c["function"]["arguments"]) for c in (choice.get("message") or {}).get("tool_calls") or []],
            }
        out: dict[str, Any] = {"token_ids": [], "prompt_token_ids": [], "logprobs": [], "content": None, "tool_calls": []}
        calls: dict[int, list[str]] = {}
        for line in self.answer.decode().splitlines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            out["prompt_token_ids"] = out["prompt_token_ids"] or chunk.get("prompt_token_ids") or []
            for choice in chunk.get("choices") or []:
                out["token_ids"] += choice.get("token_ids") or []
                out["logprobs"] += [c["logprob"] for c in (choice.get("logprobs") or {}).get("content") or []]
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    out["content"] = (out["content"] or "") + delta["content"]
                for call in delta.get("tool_calls") or []:
                    entry = calls.setdefault(call.get("index", 0), ["", ""])
                    fn = call.get("function") or {}
                    entry[0] += fn.get("name") or ""
                    entry[1] += fn.get("arguments") or ""
        out["tool_calls"] = [tuple(calls[i]) for i in sorted(calls)]
        return out


class Tap:
    """An ASGI app relaying to `upstream` (a root URL) and recording each exchange."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
        # (path, body) -> the body to send instead: what a test injects that the engine will not do
        # on demand. None: relay as received.
        self.shape: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None

    def chat_calls(self) -> list[Exchange]:
        """The chat completions that carried tools: the harness's policy calls (the proxy's own
        probe and auxiliary calls carry none)."""
        return [x for x in self.exchanges if x.path.endswith("/chat/completions") and x.body.get("tools")]

    def policy_tool_calls(self) -> list[tuple[str, str]]:
        """The tool calls the engine wrote in answer to the harness's policy calls, in order: a
        chat completion's, or a call continued as token ids (core/capture/continuity.py) from its
        derendered answer: whole, or the chunks of a streamed one (one derender call per chunk,
        after its generate call) put together."""
        out: list[tuple[str, str]] = []
        parts: dict[int, list[str]] = {}  # the streamed call's tool calls so far, by index

        def flush() -> None:
            out.extend(tuple(parts[i]) for i in sorted(parts))
            parts.clear()

        for x in self.exchanges:
            if x.path.endswith("/chat/completions/derender") and x.body.get("stream"):
                chunk = json.loads(x.answer).get("chunk") or {}
                for choice in chunk.get("choices") or []:
                    for call in (choice.get("delta") or {}).get("tool_calls") or []:
                        entry = parts.setdefault(call.get("index", 0), ["", ""])
                        fn = call.get("function") or {}
                        entry[0] += fn.get("name") or ""
                        entry[1] += fn.get("arguments") or ""
                continue
            flush()
            if (x.path.endswith("/chat/completions") and x.body.get("tools")) or x.path.endswith("/chat/completions/derender"):
                out += x.answer_choice()["tool_calls"]
        flush()
        return out

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if self.shape is not None and body:
            body = json.dumps(self.shape(scope["path"], json.loads(body))).encode()
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k.decode().lower() in ("content-type", "authorization", "accept")}
        # Recorded in the order the proxy sent them (the order of its turns), not the order the
        # engine finished them: two calls in flight at once finish in either order.
        exchange = Exchange(scope["path"], body, 0, b"", "")
        self.exchanges.append(exchange)
        async with aiohttp.ClientSession() as http:
            async with http.request(
                scope["method"], self.upstream + scope["path"], data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=900)
            ) as resp:
                exchange.content_type = resp.headers.get("content-type", "application/json")
                exchange.status = resp.status
                # Relayed as it comes: a harness waits for the headers only so long (Gemini CLI
                # 60 s), and a long prompt's prefill takes longer than that here.
                await send({"type": "http.response.start", "status": resp.status, "headers": [(b"content-type", exchange.content_type.encode())]})
                async for chunk in resp.content.iter_any():
                    exchange.answer += chunk
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
