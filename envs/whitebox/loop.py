"""The white-box agent loop: the environment calls the policy and runs its tool calls.

The policy is reached through the capture proxy like any harness, so the same turn records and
token ids come back. The history keeps each assistant message as the endpoint returned it (content
and tool-call argument strings exactly as sampled, never re-serialised), so each turn's prompt is
the previous prompt + completion + the tool results, and the trajectory stays one branch.

The loop ends on submit, on a message without tool calls, on max_turns, on the deadline or when
the engine's stop event is set (the endpoint keeps failing).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

import certifi
import httpx

from harness_env.core.capture import fastjson
from harness_env.core.harness import AgentOutcome
from harness_env.core.sandbox.base import ExecResult, TailBuffer
from harness_env.envs.whitebox.options import DEFAULT_MAX_TOKENS
from harness_env.envs.whitebox.tools import SYSTEM_PROMPT, TOOL_SPECS, ToolBox

# httpx imports its transport (httpcore, h11, h2) when the first client is made: here, at the
# server's start, rather than on its event loop when the first white-box rollout runs (0.2 s).
importlib.import_module("httpcore")

# Kept from an answer's message when it is sent back: templates render reasoning too.
ASSISTANT_KEYS = ("role", "content", "tool_calls", "reasoning_content", "reasoning")
RETRY_STATUSES = {429, 500, 502, 503, 504}
RETRY_DELAYS_S = (0.5, 1.0, 2.0)
LOG_BYTES = 64 * 1024


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every loop: building one loads the CA bundle (about 90 ms of CPU, on
    the server's event loop), which a client made per rollout would do each time."""
    return ssl.create_default_context(cafile=certifi.where())


def initial_messages(instruction: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": instruction}]


def request_body(model: str, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    # max_tokens always: without it an endpoint samples until the context is full. (The proxy
    # lowers it to the rollout's max_tokens_cap and renames it where the endpoint wants so.)
    return {"model": model, "messages": messages, "tools": TOOL_SPECS, "tool_choice": "auto", "stream": False, "max_tokens": max_tokens}


def assistant_message(message: dict[str, Any]) -> dict[str, Any]:
    """The answer's message as it goes back into the history: the endpoint's own objects, with only
    empty optional fields left out."""
    kept = {k: message[k] for k in ASSISTANT_KEYS if message.get(k) not in (None, [])}
    kept["role"] = "assistant"
    kept.setdefault("content", message.get("content"))
    return kept


def tool_message(call: dict[str, Any], content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call.get("id") or "", "name": call.get("function", {}).get("name", ""), "content": content}


class PolicyCallFailed(Exception):
    def __init__(self, message: str, infra: bool) -> None:
        super().__init__(message)
        self.infra = infra


@dataclass
class LoopState:
    messages: list[dict[str, Any]]
    log: TailBuffer = field(default_factory=lambda: TailBuffer(LOG_BYTES))
    tool_calls: int = 0
    turns: int = 0
    final_text: str = ""
    submitted: bool = False

    def note(self, line: str) -> None:
        self.log.feed((line.rstrip("\n") + "\n").encode())


async def call_policy(http: httpx.AsyncClient, url: str, key: str, body: dict[str, Any], stop: asyncio.Event) -> dict[str, Any]:
    """One model call; retried on 429/5xx and connection errors while the engine has not given up
    on the endpoint (it sets `stop` after repeated failures)."""
    last = ""
    for delay in (*RETRY_DELAYS_S, None):
        try:
            # orjson both ways: an answer carries its thousands of token ids and logprobs, which
            # the stdlib's decoder took milliseconds of the server's event loop to read.
            r = await http.post(url, content=fastjson.dumps(body), headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        except httpx.TransportError as e:
            last, status = f"{type(e).__name__}: {e}", None
        else:
            if r.status_code == 200:
                try:
                    data = fastjson.loads(r.content)
                    return data["choices"][0]
                except (ValueError, KeyError, IndexError, TypeError):
                    raise PolicyCallFailed(f"the endpoint's answer has no choices[0]: {r.text[:300]}", infra=True) from None
            status, last = r.status_code, f"HTTP {r.status_code}: {r.text[:300]}"
            if status not in RETRY_STATUSES:
                raise PolicyCallFailed(last, infra=False)
        if delay is None or stop.is_set():
            break
        await asyncio.sleep(delay)
    raise PolicyCallFailed(last, infra=True)


async def run_loop(
    *,
    toolbox: ToolBox,
    proxy_base_url: str,
    session_key: str,
    model: str,
    instruction: str,
    max_turns: int | None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    timeout_s: float,
    stop: asyncio.Event,
) -> tuple[ExecResult, AgentOutcome]:
    state = LoopState(initial_messages(instruction))
    outcome = AgentOutcome()
    started = time.monotonic()
    toolbox.deadline = started + timeout_s
    timed_out = stopped = False
    url = proxy_base_url.rstrip("/") + "/chat/completions"
    try:
        async with asyncio.timeout(timeout_s), httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10), verify=_tls()) as http:
            await _turns(state, outcome, toolbox, http, url, session_key, model, max_turns, max_tokens, stop)
        stopped = stop.is_set() and not state.submitted
    except TimeoutError:
        timed_out = True
        state.note(f"deadline: agent_timeout_s={timeout_s} passed")
    outcome.final_text = state.final_text
    outcome.tool_calls = state.tool_calls
    result = ExecResult(
        exit_code=None if (timed_out or stopped) else 0,
        stdout=state.log.text(),
        stderr="",
        duration_s=time.monotonic() - started,
        timed_out=timed_out,
        stopped=stopped,
    )
    return result, outcome


async def _turns(
    state: LoopState,
    outcome: AgentOutcome,
    toolbox: ToolBox,
    http: httpx.AsyncClient,
    url: str,
    key: str,
    model: str,
    max_turns: int | None,
    max_tokens: int,
    stop: asyncio.Event,
) -> None:
    while not stop.is_set():
        if max_turns is not None and state.turns >= max_turns:
            outcome.turn_limit_hit = True
            state.note(f"max_turns={max_turns} reached")
            return
        state.turns += 1
        try:
            choice = await call_policy(http, url, key, request_body(model, state.messages, max_tokens), stop)
        except PolicyCallFailed as e:
            outcome.error = str(e)
            state.note(f"turn {state.turns}: model call failed: {e}")
            return
        message = choice.get("message") or {}
        state.messages.append(assistant_message(message))
        calls = message.get("tool_calls") or []
        if not calls:
            state.final_text = message.get("content") or ""
            state.note(f"turn {state.turns}: final message ({choice.get('finish_reason')})")
            return
        for call in calls:
            fn = call.get("function") or {}
            name, arguments = str(fn.get("name") or ""), fn.get("arguments")
            # Some endpoints hand back parsed arguments; the history keeps them as they came.
            reply = await toolbox.call(name, arguments if isinstance(arguments, str) else json.dumps(arguments or {}))
            if reply.submitted is None:
                state.tool_calls += 1
            state.note(f"turn {state.turns}: {name}({str(arguments)[:200]}) -> {'ok' if reply.ok else reply.content[:200]}")
            state.messages.append(tool_message(call, reply.content))
            if reply.submitted is not None:
                state.final_text, state.submitted = reply.submitted, True
        if state.submitted:
            return
