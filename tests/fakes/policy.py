"""A scripted OpenAI-compatible policy server that emulates vLLM's exact-data extensions.

It answers /v1/chat/completions, streaming (SSE, chunk shapes as vLLM sends them: prompt_token_ids
on the first chunk, per-choice token_ids and logprobs on each delta) or not, and returns token ids
only when asked with `return_token_ids`, logprobs only with `logprobs`. What it does is scripted
per model name: the step taken is the number of assistant messages already in the conversation,
so a retried request gets the same answer. Every answer it sends is recorded in `sent` so tests can
compare the captured turns with the truth.

Token ids come from a stand-in chat template that only ever appends: the prompt renders each
message (an assistant message as exactly the tokens that were sampled for it), then the generation
header. So a harness that sends its history back verbatim gets prompts that extend the previous
prompt + completion, and one that rewrites it (re-serialised tool arguments, dropped turns) does not,
as with a real model.

Steps: {"bash": CMD} calls the harness's shell tool; {"call": NAME, "arguments": STR} calls any
tool with that exact argument string; {"text": T} answers and ends;
{"hang": S} sleeps S seconds first (cut short when the caller hangs up, as vLLM aborts a request
whose client went away); {"status": N} answers an HTTP error ("down": True: every later
call too, the proxy's own included; with "echo_auth": True its
message quotes the presented key, as hosted APIs do on a 401); {"malformed": True} streams a broken
chunk; {"raw": BODY} answers BODY as is (a str: one JSON body, with "status" if given; a list: SSE
chunks sent "gap_s" seconds apart), "{key}" in it replaced by the presented key.

A conversation whose user messages hold `[tag:NAME]`, NAME one of the scripts, follows that script
whatever its model (two rollouts on one model, scripted apart).

`max_in_flight` gives the endpoint that many slots: a call arriving while they are all taken is
answered 503 (an overloaded server or gateway). `delay_s` paces every answer (a busy inference server: each call takes that long, however many
arrive at once). A conversation whose first user message holds `[tag:NAME]` has the arrival time
of each of its calls recorded in `arrivals` (GET /v1/_arrivals), so a benchmark can tell when each
rollout's agent made its first model call.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.loopback import LoopbackServer

TAG = re.compile(r"\[tag:([\w-]{1,64})\]")
SHELL_TOOL_NAMES = ("bash", "shell", "run_shell_command", "exec", "execute", "exec_command", "shell_command")  # any case: Claude Code's is `Bash`


# Tool arguments as models often write them: no spaces, UTF-8 as is (json.dumps' default spaces
# them and escapes non-ASCII).
compact_arguments = functools.partial(json.dumps, separators=(",", ":"), ensure_ascii=False)


def fake_token_ids(text: str) -> list[int]:
    """A deterministic stand-in tokenizer: one id per 4-byte piece."""
    data = text.encode()
    return [int.from_bytes(hashlib.blake2b(data[i : i + 4], digest_size=3).digest(), "big") % 150_000 for i in range(0, len(data), 4)] or []


def pieces(text: str, size: int = 4) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


GEN_HEADER = "<|assistant|>"
END = "<|end|>"


def _text_of(content: Any) -> str:
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def completion_pieces(text: str, tool_calls: list[dict[str, Any]]) -> list[str]:
    """What is sampled for an answer: the text, then each tool call's argument string."""
    return pieces(text) + [p for c in tool_calls for p in pieces(str((c.get("function") or {}).get("arguments", "")))]


@functools.lru_cache(maxsize=1 << 16)
def _piece_id(piece: str) -> int:
    return fake_token_ids(piece)[0]


def piece_ids(parts: list[str]) -> list[int]:
    # Cached per piece: a benchmark's 20 KB prompts arriving together must not queue behind
    # thousands of hashes each (that would be the fake's latency, not the server's).
    return [_piece_id(p) for p in parts if p]


def render_prompt(body: dict[str, Any]) -> list[int]:
    """The stand-in chat template: tools, then each message, then the generation header."""
    ids = fake_token_ids(json.dumps(body.get("tools") or [], sort_keys=True))
    for m in body.get("messages", []):
        if m.get("role") == "assistant":
            ids += fake_token_ids(GEN_HEADER) + piece_ids(completion_pieces(_text_of(m.get("content")), m.get("tool_calls") or []))
        else:
            ids += fake_token_ids(f"<|{m.get('role')}|>") + piece_ids(pieces(_text_of(m.get("content"))))
        ids += fake_token_ids(END)
    return ids + fake_token_ids(GEN_HEADER)


def shell_arguments(schema: dict[str, Any], command: str) -> dict[str, Any]:
    """The shell tool's arguments as its schema asks: the command as `cmd` (Codex's exec_command),
    as an argv list (a `command` array), or as a string; a description where one is required."""
    props, required = schema.get("properties") or {}, schema.get("required") or []
    if "cmd" in props and "command" not in props:
        args: dict[str, Any] = {"cmd": command}
    elif (props.get("command") or {}).get("type") == "array":
        args = {"command": ["bash", "-lc", command]}
    else:
        args = {"command": command}
    if "description" in required:
        args["description"] = "run a command"
    return args


def fake_logprob(token_id: int) -> float:
    return -round(((token_id % 97) + 1) / 50.0, 6)


@dataclass
class Sent:
    model: str
    stream: bool
    request: dict[str, Any]
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    text: str
    tool_calls: list[dict[str, Any]]


async def _hung_up(request: Request, seconds: float) -> bool:
    """Wait `seconds`, or until the caller hangs up (True then)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await request.is_disconnected():
            return True
        await asyncio.sleep(0.1)
    return False


@dataclass
class FakePolicy:
    scripts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    sent: list[Sent] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    reject_unknown_fields: bool = False  # behave like a hosted API: 400 on return_token_ids etc.
    require_max_completion_tokens: bool = False
    default_step: dict[str, Any] = field(default_factory=lambda: {"text": "done"})
    processed_logprobs: bool = True  # logprobs after temperature, as vLLM with --logprobs-mode processed_logprobs
    base_url: str = ""
    delay_s: float = 0.0  # every answer waits this long first
    arrivals: dict[str, list[float]] = field(default_factory=dict)  # [tag:NAME] -> arrival times of its calls
    down_status: int | None = None  # set by a step {"status": N, "down": True}: every later call answers N
    max_in_flight: int | None = None  # slots of an overloadable endpoint: past them, 503
    in_flight: int = 0
    # How a {"bash": CMD} step writes its tool call's arguments: json.dumps' spaced layout, escaping
    # non-ASCII, unless a test wants another (a model writing compact JSON, raw UTF-8, ...).
    dump_arguments: Callable[[dict[str, Any]], str] = json.dumps
    # vLLM's render route (--enable-scale-out), for token continuity (core/capture/continuity.py):
    # off, the route is missing as on a plain engine; `render_rewrites_history`: a template that
    # renders the earlier turns otherwise once more messages follow them.
    scale_out: bool = False
    render_rewrites_history: bool = False
    routes_hit: list[str] = field(default_factory=list)  # the scale-out routes asked, in order
    honor_max_tokens: bool = False  # a text answer longer than the request's max_tokens is cut there ("length")

    def tool_requests(self) -> list[dict[str, Any]]:
        """The requests an agent made with its tools (not capture probes, not titles)."""
        return [r for r in self.requests if r.get("tools")]

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models),
                Route("/v1/_arrivals", self._arrivals),
                Route("/v1/chat/completions/render", self._render, methods=["POST"]),
                Route("/inference/v1/generate", self._scale_out_route, methods=["POST"]),
                Route("/v1/chat/completions/derender", self._scale_out_route, methods=["POST"]),
            ]
        )

    async def _render(self, request: Request) -> Response:
        """The stand-in template's ids for a chat request; without the generation header when it
        asks for none (and, rewriting history, with the earlier turns rendered otherwise)."""
        if not self.scale_out:
            return JSONResponse({"error": {"message": "not found"}}, status_code=404)
        body = await request.json()
        self.routes_hit.append("render")
        ids = render_prompt(body)
        if body.get("add_generation_prompt") is False:
            ids = ids[: -len(fake_token_ids(GEN_HEADER))]
            if self.render_rewrites_history:
                ids = [0, *ids]
        return JSONResponse({"request_id": "render-fake", "token_ids": ids, "sampling_params": {"max_tokens": body.get("max_tokens")}})

    async def _scale_out_route(self, request: Request) -> Response:
        """Generate and derender: the tests that use the fake's render never get this far."""
        self.routes_hit.append(request.url.path)
        return JSONResponse({"error": {"message": "the fake does not generate from token ids"}}, status_code=501)

    async def _arrivals(self, request: Request) -> Response:
        return JSONResponse(self.arrivals)

    def _note_arrival(self, body: dict[str, Any]) -> None:
        first_user = next((m for m in body.get("messages", []) if m.get("role") == "user"), None)
        found = TAG.search(_text_of(first_user.get("content"))) if first_user else None
        if found:
            self.arrivals.setdefault(found.group(1), []).append(time.time())

    async def _models(self, request: Request) -> Response:
        extra = {"max_model_len": 32768} if self.scale_out else {}
        return JSONResponse({"object": "list", "data": [{"id": m, "object": "model", **extra} for m in self.scripts]})

    def _tagged_script(self, body: dict[str, Any]) -> str | None:
        """The script a user message names with `[tag:NAME]` (one of `scripts`), if any."""
        for m in body.get("messages", []):
            found = TAG.search(_text_of(m.get("content"))) if m.get("role") == "user" else None
            if found and found.group(1) in self.scripts:
                return found.group(1)
        return None

    def _step(self, body: dict[str, Any]) -> dict[str, Any]:
        if not body.get("tools"):
            return {"text": "Fake title"}  # auxiliary calls (titles, summaries)
        script = self.scripts.get(self._tagged_script(body) or body.get("model", ""), [])
        n = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        return script[n] if n < len(script) else self.default_step

    async def _chat(self, request: Request) -> Response:
        if self.max_in_flight is not None and self.in_flight >= self.max_in_flight:
            return JSONResponse({"error": {"message": "overloaded: every slot is taken", "type": "server_error"}}, status_code=503)
        self.in_flight += 1
        try:
            return await self._answer(request)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: Request) -> Response:
        body = await request.json()
        self._note_arrival(body)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if self.reject_unknown_fields:
            for name in ("return_token_ids", "chat_template_kwargs"):
                if name in body:
                    return JSONResponse(
                        {"error": {"message": f"Unrecognized request argument supplied: {name}", "type": "invalid_request_error", "param": None, "code": None}},
                        status_code=400,
                    )
        if self.require_max_completion_tokens and "max_tokens" in body:
            return JSONResponse(
                {
                    "error": {
                        "message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
                        "type": "invalid_request_error",
                        "param": "max_tokens",
                        "code": "unsupported_parameter",
                    }
                },
                status_code=400,
            )
        step = {"status": self.down_status} if self.down_status else self._step(body)
        if step.get("down"):  # the endpoint fails from this call on, whatever is asked (probes too)
            self.down_status = step["status"]
        if "hang" in step and await _hung_up(request, step["hang"]):
            return Response(status_code=499)
        key = request.headers.get("authorization", "").removeprefix("Bearer ")
        if "raw" in step:
            if isinstance(step["raw"], str):
                return Response(step["raw"].replace("{key}", key), status_code=step.get("status", 200), media_type="application/json")

            async def raw_chunks():
                for i, chunk in enumerate(step["raw"]):
                    if i:
                        await asyncio.sleep(step.get("gap_s", 0))
                    yield chunk.replace("{key}", key)

            return StreamingResponse(raw_chunks(), media_type="text/event-stream")
        if "malformed" in step:  # a stream with a broken chunk in the middle, then a normal end

            async def broken():
                yield 'data: {"choices": [{"index": 0, "delta": {"content": "par"}}]}\n\n'
                yield 'data: {"choices": [ this is not json\n\n'
                yield 'data: {"choices": [{"index": 0, "delta": {"content": "tial"}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'

            return StreamingResponse(broken(), media_type="text/event-stream")
        if "status" in step:
            message = f"scripted failure {step['status']}"
            if step.get("echo_auth"):
                message = f"Incorrect API key provided: {key}. You can find your API key in your account settings."
            return JSONResponse({"error": {"message": message, "type": "server_error"}}, status_code=step["status"])
        text, tool_calls = "", []
        if "bash" in step:
            tool = next((t for t in body.get("tools", []) if str(t.get("function", {}).get("name")).lower() in SHELL_TOOL_NAMES), None)
            name = tool["function"]["name"] if tool else "bash"
            args = shell_arguments((tool or {}).get("function", {}).get("parameters") or {}, step["bash"])
            tool_calls = [{"id": f"call_{len(self.sent)}", "type": "function", "function": {"name": name, "arguments": self.dump_arguments(args)}}]
        elif "call" in step:
            tool_calls = [{"id": f"call_{len(self.sent)}", "type": "function", "function": {"name": step["call"], "arguments": step["arguments"]}}]
        else:
            text = step.get("text", "done")
        prompt_ids = render_prompt(body)
        parts = completion_pieces(text, tool_calls)
        cut = self.honor_max_tokens and not tool_calls and isinstance(body.get("max_tokens"), int) and len(parts) > body["max_tokens"]
        if cut:
            parts = parts[: body["max_tokens"]]
            text = "".join(parts)
        ids = piece_ids(parts)
        want_ids = bool(body.get("return_token_ids"))
        want_lp = bool(body.get("logprobs"))
        top_n = int(body.get("top_logprobs") or 0)
        # Processed logprobs are the model's divided by the temperature (a stand-in for
        # log_softmax(logits / T)); raw ones ignore it.
        scale = float(body.get("temperature") or 1.0) if self.processed_logprobs else 1.0
        sent = Sent(
            model=body.get("model", ""),
            stream=bool(body.get("stream")),
            request=body,
            prompt_token_ids=prompt_ids if want_ids else [],
            completion_token_ids=ids if want_ids else [],
            logprobs=[fake_logprob(i) / scale for i in ids] if want_lp else [],
            text=text,
            tool_calls=tool_calls,
        )
        self.sent.append(sent)
        finish = "length" if cut else "tool_calls" if tool_calls else "stop"

        def lp_entry(piece: str, tid: int) -> dict[str, Any]:
            lp = fake_logprob(tid) / scale
            return {
                "token": piece,
                "logprob": lp,
                "bytes": list(piece.encode()),
                "top_logprobs": [{"token": piece, "logprob": lp, "bytes": list(piece.encode())}]
                + [{"token": f"alt{k}", "logprob": (fake_logprob(tid) - 1 - k) / scale, "bytes": []} for k in range(max(0, top_n - 1))],
            }

        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids), "total_tokens": len(prompt_ids) + len(ids)}
        if not body.get("stream"):
            msg: dict[str, Any] = {"role": "assistant", "content": text or None}
            if tool_calls:
                msg["tool_calls"] = tool_calls
            choice: dict[str, Any] = {
                "index": 0,
                "message": msg,
                "finish_reason": finish,
                "logprobs": {"content": [lp_entry(p, i) for p, i in zip(parts, ids)]} if want_lp else None,
            }
            out: dict[str, Any] = {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model"),
                "choices": [choice],
                "usage": usage,
            }
            if want_ids:
                choice["token_ids"] = ids
                out["prompt_token_ids"] = prompt_ids
            return JSONResponse(out)

        async def stream():
            base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()), "model": body.get("model")}
            first = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]}
            if want_ids:
                first["prompt_token_ids"] = prompt_ids
            yield f"data: {json.dumps(first)}\n\n"
            tids = iter(ids)  # one per piece, text first then each call's arguments

            def piece_chunk(delta: dict[str, Any], piece: str) -> str:
                tid = next(tids)
                ch: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None, "logprobs": {"content": [lp_entry(piece, tid)]} if want_lp else None}
                if want_ids:
                    ch["token_ids"] = [tid]
                return f"data: {json.dumps({**base, 'choices': [ch]})}\n\n"

            for p in pieces(text):
                yield piece_chunk({"content": p}, p)
            for ci, call in enumerate(tool_calls):
                head = {
                    "index": 0,
                    "delta": {
                        "tool_calls": [{"index": ci, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"], "arguments": ""}}]
                    },
                    "finish_reason": None,
                }
                yield f"data: {json.dumps({**base, 'choices': [head]})}\n\n"
                for p in pieces(call["function"]["arguments"]):
                    yield piece_chunk({"tool_calls": [{"index": ci, "function": {"arguments": p}}]}, p)
            last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
            yield f"data: {json.dumps(last)}\n\n"
            if (body.get("stream_options") or {}).get("include_usage"):
                yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")


class FakePolicyServer(LoopbackServer):
    """Serves a FakePolicy on a loopback port from a background thread."""

    def __init__(self, policy: FakePolicy | None = None) -> None:
        self.policy = policy or FakePolicy()
        super().__init__(self.policy.app())
        self.policy.base_url = self.base_url


# The task most server and client tests run: a white-box agent writing hello.txt, so it passes.
HELLO = [{"bash": "echo hello > hello.txt"}, {"text": "done"}]


def hello_rollout(server: FakePolicyServer, model: str, script: list[dict[str, Any]] = HELLO, **kw: Any) -> dict[str, Any]:
    """The arguments of a white-box rollout of the hello task against `server`, whose policy runs
    `script` for `model`; `kw` added (task_id, setup, ...)."""
    server.policy.scripts[model] = script
    return {
        "instruction": "Create hello.txt containing hello.",
        "base_url": server.base_url,
        "model": model,
        "harness": "whitebox",
        "verify": ["grep -qx hello hello.txt"],
        "agent_timeout_s": 120,
        **kw,
    }
