"""Token continuity, streamed: a call continued in token ids streams as a chat call would.

vLLM's generate route streams the answer to the spliced ids (core/capture/continuity.py) as
chunks of token ids; its chat derender route turns each chunk into the chat-completion chunk its
chat route would have sent (text detokenized, tool calls parsed by the server's parser), carrying
its state from call to call in `stream_state` (vLLM 0.32: `"stream": true` on derender). So:
1. `POST /inference/v1/generate` with `"stream": true` and `output_mode: "text"` (its chunks'
   logprobs then name their tokens as chat's do: the turn records them as from a chat stream);
2. per chunk, `POST /v1/chat/completions/derender` (`"stream": true`) with the chunk's ids, the
   prompt's ids (a parser looks back into the prompt) and the state the last call returned; the
   chat chunk gets the generate chunk's ids and logprobs (derender's parser path has none) and goes
   to the dialect's translation at once, as a relayed engine chunk would.
Chunks that arrive while a derender call is out are derendered together in the next one, so the
stream is never more than one derender call behind the engine. The prompt's ids and the chat
request are encoded once per call; per chunk only the chunk and the state are.

The first chunk is derendered before the reply starts: an engine whose derender cannot stream
(`streams_not`) is answered the whole way, before anything was sent to the harness.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import aiohttp

from harness_env.core.capture import fastjson
from harness_env.core.capture.asgi import Reply
from harness_env.core.capture.assemble import TurnDraft
from harness_env.core.capture.continuity import DERENDER, GENERATE, asked_max_tokens, engine_root, engine_weight_version, generate_body, render_body
from harness_env.core.capture.redact import StreamRedactor
from harness_env.core.capture.sse import SSEDecoder

if TYPE_CHECKING:
    from harness_env.core.capture.call import ModelCall
    from harness_env.core.capture.dialects import StreamTranslation

CANNOT_STREAM = "cannot stream"  # the engine's derender refused a streamed chunk: answer whole


def stream_generate_body(rendered: dict[str, Any], ids: list[int], asked_max: int | None, max_model_len: int) -> dict[str, Any] | None:
    body = generate_body(rendered, ids, asked_max, max_model_len)
    if body is not None:
        body.update(stream=True, output_mode="text", stream_options={"include_usage": True})
    return body


def merged(chunks: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, dict[str, Any] | None, dict[str, Any] | None]:
    """Generate chunks that arrived together as (one choice: ids, logprobs, how it ended; the
    usage; an error object), each None when none came."""
    choice: dict[str, Any] | None = None
    usage = error = None
    for chunk in chunks:
        if isinstance(chunk.get("error"), dict):
            error = chunk["error"]
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        for c in chunk.get("choices") or ():
            if c.get("index", 0) != 0:
                continue
            if choice is None:
                choice = {"index": 0, "token_ids": [], "logprobs": None, "finish_reason": None, "stop_reason": None, "weight_versions": None}
            choice["token_ids"] += c.get("token_ids") or []
            content = (c.get("logprobs") or {}).get("content")
            if isinstance(content, list):
                choice["logprobs"] = (choice["logprobs"] or []) + content
            for key in ("finish_reason", "stop_reason", "weight_versions"):
                if c.get(key) is not None:
                    choice[key] = c[key]
    return choice, usage, error


def chat_chunk(derendered: dict[str, Any], choice: dict[str, Any]) -> dict[str, Any]:
    """Derender's chat chunk with the engine's ids and logprobs of its choice, nulls left out."""
    chunk = {k: v for k, v in derendered.items() if v is not None}
    for c in chunk.get("choices") or ():
        c["delta"] = {k: v for k, v in (c.get("delta") or {}).items() if v is not None and v != []}
        c["token_ids"] = choice["token_ids"]
        c["logprobs"] = {"content": choice["logprobs"]} if choice["logprobs"] is not None else None
    return chunk


def event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + fastjson.dumps(chunk) + b"\n\n"


class GenerateReader:
    """The engine's generate stream as batches of parsed chunks: what has arrived, at least one."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp, self.decoder, self.done = resp, SSEDecoder(), False

    def _parse(self, data: bytes, out: list[dict[str, Any]]) -> None:
        for payload in self.decoder.feed(data) if data else self.decoder.flush():
            if payload.strip() == "[DONE]":
                self.done = True
                continue
            try:
                chunk = fastjson.loads(payload)
            except ValueError:
                chunk = {"error": {"message": f"malformed generate chunk: {payload[:200]!r}"}}
            if isinstance(chunk, dict):
                out.append(chunk)

    async def batch(self) -> list[dict[str, Any]] | None:
        """The chunks that arrived since the last batch (waiting for one); None at the end."""
        out: list[dict[str, Any]] = []
        while not out and not self.done:
            data = await self.resp.content.readany()
            self._parse(data, out)
            if not data:
                self.done = True
        while not self.done:  # and what came meanwhile, without waiting
            data = self.resp.content.read_nowait()
            if not data:
                break
            self._parse(data, out)
        return out or None


class ContinuedStream:
    """One streamed call continued in token ids: the generate stream, derendered chunk by chunk."""

    def __init__(self, call: ModelCall, chat: dict[str, Any], ids: list[int], headers: dict[str, str]) -> None:
        self.call, self.chat, self.ids, self.headers = call, chat, ids, headers
        self.url = call.session.endpoint.base_url + DERENDER
        head = {"stream": True, "model": chat.get("model"), "prompt_tokens": len(ids), "prompt_token_ids": ids, "chat_request": render_body(chat)}
        self.head = fastjson.dumps(head)[:-1]  # encoded once: each chunk's request adds its own fields
        self.state: Any = None
        self.first = True
        self.include_usage = bool((chat.get("stream_options") or {}).get("include_usage"))
        self.weight_versions: list[Any] = []

    async def derender(self, choice: dict[str, Any]) -> dict[str, Any] | str:
        """The chat chunk for one (merged) generate choice, or why there is none."""
        generate_chunk = {"output_mode": "tokens", "choices": [{k: choice[k] for k in ("index", "token_ids", "finish_reason", "stop_reason")}]}
        body = self.head + b',"generate_chunk":' + fastjson.dumps(generate_chunk)
        body += (b',"stream_state":' + fastjson.dumps(self.state) if self.state is not None else b"") + b"}"
        session = self.call.session
        post = asyncio.ensure_future(self.call.http().post(self.url, data=body, headers=self.headers))
        session.add_upstream_call(post)
        try:
            async with await post as resp:
                content = await resp.read()
                status = resp.status
        except asyncio.CancelledError:
            return "aborted: the rollout ended"
        except (aiohttp.ClientError, TimeoutError) as e:
            return f"derender failed: {type(e).__name__}: {e}"
        finally:
            session.discard_upstream_call(post)
        try:
            answer = fastjson.loads(content) if status == 200 else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or not isinstance(answer.get("chunk"), dict):
            return f"derender answered {status}: {session.redact(content[:300].decode('utf-8', errors='replace'))}"
        self.state = answer.get("stream_state")
        chunk = chat_chunk(answer["chunk"], choice)
        if self.first:
            chunk["prompt_token_ids"], self.first = self.ids, False
        if choice.get("weight_versions"):
            self.weight_versions = choice["weight_versions"]
        return chunk

    async def events(self, batch: list[dict[str, Any]]) -> tuple[bytes, str | None]:
        """The chat events for one batch of generate chunks, and what broke (None: nothing)."""
        choice, usage, error = merged(batch)
        out = b""
        if choice is not None and (choice["token_ids"] or choice["finish_reason"]):
            chunk = await self.derender(choice)
            if isinstance(chunk, str):
                return out, chunk
            out += event(chunk)
        if error is not None:
            return out + event({"error": error}), f"error in the engine's stream: {str(error.get('message'))[:500]}"
        if usage is not None and self.include_usage:
            out += event({"object": "chat.completion.chunk", "model": self.chat.get("model"), "choices": [], "usage": usage})
        return out, None

    def weight_version(self) -> int | None:
        return engine_weight_version({"choices": [{"weight_versions": self.weight_versions}]})


async def streamed_reply(
    call: ModelCall,
    chat: dict[str, Any],
    ids: list[int],
    full: dict[str, Any],
    max_model_len: int,
    headers: dict[str, str],
    translation: StreamTranslation,
    draft: TurnDraft,
) -> Reply | str | None:
    """The streamed reply to a call continued in `ids`; a Reply when the generate call got no
    answer (recorded), CANNOT_STREAM when the engine's derender takes no streamed chunk (nothing
    was sent yet), None when the call goes the normal way."""
    session = call.session
    body = stream_generate_body(full, ids, asked_max_tokens(chat), max_model_len)
    if body is None:
        return None
    resp = await call.post(engine_root(session.endpoint.base_url) + GENERATE, fastjson.dumps(body), {**headers, "accept": "text/event-stream"})
    if not isinstance(resp, aiohttp.ClientResponse):
        return resp
    if resp.status != 200:
        await call.error_body(resp)
        session.log(f"turn {call.index}: generate answered {resp.status}: messages sent as they are")
        return None
    session.add_relayed_answer(resp)
    stream, reader = ContinuedStream(call, chat, ids, headers), GenerateReader(resp)
    try:
        batch = await reader.batch()
        sent, broke = await stream.events(batch or [])
    except (aiohttp.ClientError, TimeoutError) as e:
        sent, broke = b"", f"upstream stream broke: {type(e).__name__}: {e}"
    if stream.first and broke is not None:  # nothing derendered: nothing sent to the harness yet
        session.discard_relayed_answer(resp)
        resp.close()  # the engine aborts the generation
        session.log(f"turn {call.index}: streamed derender: {broke[:300]}: answered whole")
        return CANNOT_STREAM if broke.startswith("derender answered 4") else None
    call.status = 200
    session.upstream_result(ok=True)
    session.log(f"turn {call.index}: continues in tokens, streamed ({len(ids)} prompt ids)")
    ttft = time.monotonic() - call.started
    redactor = StreamRedactor(session.answer_redactor)

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal broke
        try:
            data = redactor.relay(sent, translation.feed)
            if data:
                yield data
            while broke is None and not reader.done:
                batch = await reader.batch()
                if batch is None:
                    break
                data, broke = await stream.events(batch)
                data = redactor.relay(data, translation.feed)
                if data:
                    yield data
            # the generate stream's own end is not relayed (GenerateReader keeps it): a chat client
            # waits for the end its engine would have sent
            rest = redactor.relay(b"data: [DONE]\n\n" if broke is None else b"", translation.feed, last=True)
            if rest:
                yield rest
        except (aiohttp.ClientError, TimeoutError, RuntimeError) as e:
            broke = f"upstream stream broke: {type(e).__name__}: {e}"
        finally:
            session.discard_relayed_answer(resp)
            resp.close()
        if broke is not None:
            draft.errors.append(broke)
        tail = translation.close(broke)
        if tail:
            yield tail

    def record() -> None:
        translation.finish()
        if call.request.weight_version is None:  # the trainer named none: the engine's, when it is a number
            call.request.weight_version = stream.weight_version()
        call.answered(draft, ttft)

    return Reply(200, content_type=translation.content_type, stream=chunks(), after=record)
