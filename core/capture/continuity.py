"""Token continuity: a call that continues a thread is sent to the engine as token ids.

A harness resends its whole history every call, and the engine renders it again with its chat
template. Templates do not always render an earlier answer as the tokens that were sampled
(SmolLM2's re-serialises a tool call, others drop old reasoning), so the new prompt would not
extend the previous prompt + completion and the thread would split in the turn graph. When a
request continues a thread of its session (its messages are an earlier call's messages, then that
call's answer, then new messages; the same tools), the proxy instead asks vLLM (served with
`--enable-scale-out`):
1. `POST /v1/chat/completions/render` of the conversation up to that answer (no generation
   prompt), and of the whole conversation: the new messages' ids are what the second adds to the
   first, after the template's trailer of the answer's turn (what follows its end-of-turn token);
2. `POST /inference/v1/generate` with the earlier prompt ids + the sampled ids + those new ids,
   and the sampling parameters render resolved (max_tokens recomputed for the longer prompt);
3. `POST /v1/chat/completions/derender`: the engine's own chat answer (tool calls parsed) for it.
The harness gets that answer as it would have from chat completions (streamed as chunks when it
asked to stream), and the turn records the spliced prompt ids: one branch.

Anything else goes the normal way: a first call, a thread the harness changed, a template that
renders the earlier turns differently once new messages follow (the prefix check), an earlier
answer cut at max_tokens, an engine without the routes. The builders here are pure; `Continuity`
makes the calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import aiohttp

from harness_env.core.capture import fastjson
from harness_env.core.capture.asgi import Reply
from harness_env.core.capture.graph import is_answer
from harness_env.core.capture.probe import RENDER, probe_continuity
from harness_env.core.capture.record import CapturedTurn
from harness_env.core.capture.sse import encode_event

if TYPE_CHECKING:
    from harness_env.core.capture.call import ModelCall
    from harness_env.models import Endpoint

DERENDER, GENERATE = "/chat/completions/derender", "/inference/v1/generate"
MAX_TRAILER = 8  # tokens a template may put after an answer's end-of-turn token ("\n")
ENDED = ("stop", "tool_calls")  # an answer that ended with its end-of-turn token
CUT = "length"  # an answer cut at max_tokens: no end-of-turn token sampled


def continued_turn(messages: list[dict[str, Any]], tools: list[Any], turns: Sequence[CapturedTurn], continues_final: bool = False) -> CapturedTurn | None:
    """The latest turn whose thread `messages` continue: its messages, then its answer (tool calls
    by name and arguments, else the text), then at least one message more; the same tools. Only a
    turn the engine answered whole, with token ids, ended by its end-of-turn token or cut at
    max_tokens. `continues_final`: the harness asks the engine to continue its last (assistant)
    message: then a cut answer with nothing after it is continued too (`continues_in_place`)."""
    for t in reversed(turns):
        n = len(t.request_messages)
        if (
            t.upstream_status != 200
            or t.upstream_error
            or t.prompt is None
            or not t.completion
            or t.finish_reason not in (*ENDED, CUT)
            or len(messages) < n + 1
            or (len(messages) == n + 1 and not (continues_final and t.finish_reason == CUT))
            or t.request_tools != tools
            or not isinstance(messages[n], dict)
            or messages[n].get("role") != "assistant"
        ):
            continue
        if messages[:n] == t.request_messages and is_answer(messages[n], t):
            return t
    return None


def continues_in_place(messages: list[dict[str, Any]], prev: CapturedTurn) -> bool:
    """Whether `messages` end with `prev`'s (cut) answer: the engine goes on with that same
    message, so the prompt is exactly `prev`'s prompt + its sampled ids."""
    return len(messages) == len(prev.request_messages) + 1


def spliced_ids(prompt: list[int], completion: list[int], before: list[int], full: list[int], trailer: list[int] | None = None) -> list[int] | None:
    """`prompt` + `completion` + the new messages' ids: what the template's rendering `full` of
    the whole conversation adds to its rendering `before` of the conversation up to the answer,
    preceded by `before`'s trailer after the answer's end-of-turn token (`completion`'s last).
    `trailer`: for an answer cut at max_tokens (no end-of-turn token sampled), what the template
    puts after an assistant message's content (`cut_trailer`), put after the sampled ids; it must
    end `before`. None when `full` does not start with `before` (the template rendered the
    earlier turns otherwise once more messages followed) or the end is not where it should be."""
    if not completion or len(full) <= len(before) or full[: len(before)] != before:
        return None
    if trailer is not None:
        if not trailer or before[-len(trailer) :] != trailer:
            return None
        return [*prompt, *completion, *trailer, *full[len(before) :]]
    end = completion[-1]
    at = next((i for i in range(len(before) - 1, max(-1, len(before) - 2 - MAX_TRAILER), -1) if before[i] == end), None)
    if at is None:
        return None
    return [*prompt, *completion, *before[at + 1 :], *full[len(before) :]]


def cut_trailer(opened: list[int], empty: list[int]) -> list[int] | None:
    """What the template puts after an assistant message's content (its end-of-turn token and
    what follows it): its rendering `empty` of the conversation with an empty assistant message
    after what `opened` renders with the generation prompt. None when `empty` does not start with
    `opened` (the template opens an answer otherwise than it renders one) or it is no short end."""
    if len(empty) <= len(opened) or empty[: len(opened)] != opened or len(empty) - len(opened) > MAX_TRAILER + 1:
        return None
    return empty[len(opened) :]


def render_body(chat: dict[str, Any], messages: list[dict[str, Any]] | None = None, generation_prompt: bool = False) -> dict[str, Any]:
    """A chat request for render: whole (`messages` None) or up to an answer (no generation
    prompt unless asked)."""
    body = {k: v for k, v in chat.items() if k not in ("stream", "stream_options")}
    if messages is not None:
        body.update(messages=messages, add_generation_prompt=generation_prompt)
    return body


def generate_body(rendered: dict[str, Any], ids: list[int], asked_max: int | None, max_model_len: int) -> dict[str, Any] | None:
    """The generate request for `ids`, with render's sampling parameters. Render sized max_tokens
    for its own (shorter) prompt: it is what the harness asked (or the policy's cap), within what
    the context leaves, else left to the engine (the rest of the context). None: no room left."""
    left = max_model_len - len(ids)
    if left <= 0:
        return None
    params = dict(rendered.get("sampling_params") or {})
    params.pop("max_tokens", None)
    if asked_max is not None:
        params["max_tokens"] = min(asked_max, left)
    return {**rendered, "token_ids": ids, "sampling_params": params, "stream": False}


def asked_max_tokens(chat: dict[str, Any]) -> int | None:
    asked = chat.get("max_completion_tokens") or chat.get("max_tokens")
    return asked if isinstance(asked, int) else None


def derender_body(chat: dict[str, Any], generated: dict[str, Any], ids: list[int]) -> dict[str, Any]:
    """The whole derender request for the engine's answer to `ids`."""
    return {"generate_response": generated, "prompt_token_ids": ids, "prompt_tokens": len(ids), "chat_request": render_body(chat), "model": chat.get("model")}


def answer_body(derendered: dict[str, Any], ids: list[int]) -> dict[str, Any]:
    """Derender's chat answer as chat completions gives it: the prompt's ids (those sent) and a
    finish reason of `tool_calls` when it called tools (derender says `stop`)."""
    for choice in derendered.get("choices") or ():
        message = choice.get("message") or {}
        if message.get("tool_calls") and choice.get("finish_reason") == "stop":
            choice["finish_reason"] = "tool_calls"
    derendered["prompt_token_ids"] = ids
    return derendered


def as_chunks(answer: dict[str, Any]) -> bytes:
    """A whole chat completion as the SSE stream chat completions sends: one chunk with the whole
    message, its logprobs and token ids, then one with the usage, then [DONE]."""
    base = {"id": answer.get("id"), "object": "chat.completion.chunk", "created": answer.get("created"), "model": answer.get("model")}
    choices = []
    for choice in answer.get("choices") or ():
        message = choice.get("message") or {}
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if message.get("reasoning") or message.get("reasoning_content"):
            delta["reasoning_content"] = message.get("reasoning") or message.get("reasoning_content")
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        choices.append(
            {
                "index": choice.get("index", 0),
                "delta": delta,
                "logprobs": choice.get("logprobs"),
                "finish_reason": choice.get("finish_reason"),
                "token_ids": choice.get("token_ids"),
            }
        )
    events = [{**base, "choices": choices, "prompt_token_ids": answer.get("prompt_token_ids")}]
    if answer.get("usage"):
        events.append({**base, "choices": [], "usage": answer["usage"]})
    return b"".join(encode_event(fastjson.dumps(e).decode()) for e in events) + encode_event("[DONE]")


def engine_weight_version(generated: dict[str, Any]) -> int | None:
    """The one weight version the engine says sampled the answer, when it is a number (vLLM
    says "default" until a trainer names its weights)."""
    versions = {str(v.get("version")) for c in generated.get("choices") or () for v in c.get("weight_versions") or ()}
    if len(versions) == 1:
        (only,) = versions
        if only.isdigit():
            return int(only)
    return None


def engine_root(base_url: str) -> str:
    """The engine's root URL (generate is served beside /v1, not under it)."""
    return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url


class Continuity:
    """The proxy's side of token continuity: which endpoints can (asked once each), and the calls."""

    def __init__(self) -> None:
        self._support: dict[tuple[str, str], asyncio.Future[int | None]] = {}
        self.cannot_stream: set[tuple[str, str]] = set()  # endpoints whose derender takes no streamed chunk

    async def max_model_len(self, http: aiohttp.ClientSession, endpoint: Endpoint, headers: dict[str, str]) -> int | None:
        """The context length of an endpoint that can continue threads in tokens, else None;
        asked once per endpoint and model (a probe with no clear answer is asked again)."""
        key = (endpoint.base_url, endpoint.model)
        task = self._support.get(key)
        if task is None:
            task = self._support[key] = asyncio.ensure_future(probe_continuity(http, endpoint, headers))
        try:
            return await asyncio.shield(task)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            self._support.pop(key, None)
            return None

    async def prompt(
        self, call: ModelCall, chat: dict[str, Any], prev: CapturedTurn, headers: dict[str, str]
    ) -> tuple[list[int], dict[str, Any]] | Reply | None:
        """The token ids to send for `chat` continuing `prev` in tokens, and render's answer for
        the whole conversation (its sampling parameters); a Reply when a call got no answer
        (recorded as the turn's), None when this call goes the normal way."""
        base = call.session.endpoint.base_url
        messages, n = chat["messages"], len(prev.request_messages) + 1
        full = await self._post(call, base + RENDER, render_body(chat), headers)
        if not isinstance(full, dict):
            return full
        if continues_in_place(messages, prev):  # the same (cut) message goes on
            return [*prev.prompt_token_ids, *prev.completion_token_ids], full
        before = await self._post(call, base + RENDER, render_body(chat, messages[:n]), headers)
        if not isinstance(before, dict):
            return before
        trailer = None
        if prev.finish_reason == CUT:  # no end-of-turn token sampled: the template's goes after the cut ids
            opened = await self._post(call, base + RENDER, render_body(chat, messages[: n - 1], generation_prompt=True), headers)
            if not isinstance(opened, dict):
                return opened
            empty = await self._post(call, base + RENDER, render_body(chat, [*messages[: n - 1], {"role": "assistant", "content": ""}]), headers)
            if not isinstance(empty, dict):
                return empty
            trailer = cut_trailer(opened.get("token_ids") or [], empty.get("token_ids") or [])
            if trailer is None:
                call.session.log(f"turn {call.index}: the chat template ends an answer otherwise than it opens one: messages sent as they are")
                return None
        ids = spliced_ids(prev.prompt_token_ids, prev.completion_token_ids, before.get("token_ids") or [], full.get("token_ids") or [], trailer)
        if ids is None:
            call.session.log(f"turn {call.index}: the chat template renders the earlier turns otherwise: messages sent as they are")
            return None
        return ids, full

    async def answer(
        self, call: ModelCall, chat: dict[str, Any], prev: CapturedTurn, max_model_len: int, headers: dict[str, str]
    ) -> tuple[dict[str, Any], int | None] | Reply | None:
        """The engine's whole chat answer for `chat` continuing `prev` in tokens, and the weight
        version the engine named; a Reply when a call got no answer (recorded as the turn's),
        None when this call goes the normal way."""
        prepared = await self.prompt(call, chat, prev, headers)
        if not isinstance(prepared, tuple):
            return prepared
        ids, full = prepared
        base = call.session.endpoint.base_url
        body = generate_body(full, ids, asked_max_tokens(chat), max_model_len)
        if body is None:
            return None
        generated = await self._post(call, engine_root(base) + GENERATE, body, headers)
        if not isinstance(generated, dict):
            return generated
        derendered = await self._post(call, base + DERENDER, derender_body(chat, generated, ids), headers)
        if not isinstance(derendered, dict):
            return derendered
        call.session.log(f"turn {call.index}: continues turn {prev.index} in tokens ({len(ids)} prompt ids)")
        call.status = 200
        call.session.upstream_result(ok=True)
        return answer_body(derendered, ids), engine_weight_version(generated)

    @staticmethod
    async def _post(call: ModelCall, url: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any] | Reply | None:
        """The engine's JSON object; None for an error answer or another body (the call goes the normal way), a
        Reply when none came (recorded)."""
        resp = await call.post(url, fastjson.dumps(body), headers)
        if not isinstance(resp, aiohttp.ClientResponse):
            return resp
        content = await call.error_body(resp)  # read whole and released (small but for the prompt's ids)
        if resp.status != 200:
            call.session.log(f"turn {call.index}: {url.rsplit('/', 1)[-1]} answered {resp.status}: messages sent as they are")
            return None
        try:
            answer = fastjson.loads(content)
        except ValueError:
            return None
        return answer if isinstance(answer, dict) else None
