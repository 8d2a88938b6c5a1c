"""Plumbing of the /mcp endpoint (server/mcp/tools.py): the checks a request passes before the MCP
SDK sees it (refused in one line, where the SDK would log a multi-kilobyte dump, or turn NaN into
null without a word), and the ASGI helpers around the SDK's transport.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from mcp import types as mcp_types
from pydantic import ValidationError

from harness_env.core.capture.asgi import Receive, Scope, Send
from harness_env.models import MAX_NESTING, SURROGATE

MAX_RPC_BYTES = 32 * 1024 * 1024


def invalid_request(msg: dict[str, Any]) -> str | None:
    """Why `msg` is not a well-formed MCP client request, or None."""
    try:
        mcp_types.JSONRPCRequest.model_validate(msg, strict=True)
    except ValidationError as e:
        return f"not a valid JSON-RPC request: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}"
    return None


async def cancel_and_wait(task: asyncio.Task) -> None:
    """Cancel `task` and wait until its clean-up has run."""
    task.cancel()
    await asyncio.wait({task})


async def unless_disconnected(receive: Receive, work) -> Any:
    """Run `work` (after the request body was read) while watching the connection: a client that
    goes away cancels it (None). The plain JSON-RPC face has no SDK doing this for it."""

    async def until_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    task = asyncio.create_task(work)
    watcher = asyncio.create_task(until_disconnect())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            await cancel_and_wait(task)
        watcher.cancel()
    return task.result() if not task.cancelled() else None


def unrepresentable(value: Any, where: str) -> str | None:
    """Why a parsed request value cannot reach a tool as sent, naming where: a number JSON cannot
    carry (NaN, Infinity, 1e400), a lone surrogate, or lists/objects nested deeper than tool
    arguments may be (models.MAX_NESTING inside params.arguments.<name>). None when fine."""
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        v, at, depth = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return f"{at} is not a finite number (NaN, Infinity and numbers like 1e400 are not JSON numbers)"
        if isinstance(v, str) and not v.isascii() and SURROGATE.search(v):
            return f"{at} contains a lone surrogate; send valid Unicode text"
        if isinstance(v, (dict, list)):
            if depth >= MAX_NESTING + 2:  # params.arguments.<name> is at depth 2
                return f"{at} is nested more than {MAX_NESTING} levels deep; flatten it"
            for k, item in v.items() if isinstance(v, dict) else enumerate(v):
                if isinstance(k, str) and not k.isascii() and SURROGATE.search(k):
                    return f"a key in {at} contains a lone surrogate; send valid Unicode text"
                name = k[:40] if isinstance(k, str) else str(k)
                stack.append((item, f"{at}.{name}" if depth < 4 else at, depth + 1))
    return None


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A receive() that hands over a body already read, then passes the client's own messages on
    (the SDK watches for http.disconnect, which cancels the tool call and so the rollout)."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


class AsgiEndpoint:
    """Starlette treats a non-function endpoint as a raw ASGI app."""

    def __init__(self, handler) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handler(scope, receive, send)
