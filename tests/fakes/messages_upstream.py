"""A scripted upstream that speaks the Anthropic Messages API natively (as a hosted Anthropic
endpoint would): for the capture proxy's pass-through, where nothing is translated.

Scripts are FakePolicy's (tests/fakes/policy.py), per model name, one step per assistant message
already in the conversation: {"bash": CMD} calls the harness's shell tool (`Bash` for Claude Code),
{"text": T} answers and ends, {"status": N} answers an error in Anthropic's shape, {"hang": S}
sleeps first, {"redirect": URL} answers a 307 to URL. "{key}" in a text is replaced by the key the request presented, as an upstream that
echoes it would. A request without tools (a title, a summary) gets "Fake title". It answers only
`x-api-key: <its key>` (401 otherwise), streams as Anthropic does (message_start, content blocks,
message_delta, message_stop) or answers whole, and records every request and its headers.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.loopback import LoopbackServer
from tests.fakes.native_upstream import ScriptedUpstream
from tests.fakes.policy import SHELL_TOOL_NAMES, pieces, shell_arguments


def _error(status: int, message: str) -> JSONResponse:
    kind = {401: "authentication_error", 400: "invalid_request_error", 529: "overloaded_error"}.get(status, "api_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)


@dataclass
class FakeMessagesUpstream(ScriptedUpstream):
    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/messages", self._messages, methods=["POST"]), Route("/v1/messages/count_tokens", self._count, methods=["POST"])])

    def _step(self, body: dict[str, Any]) -> dict[str, Any]:
        if not body.get("tools"):
            return {"text": "Fake title"}
        return self._scripted(body.get("model", ""), sum(1 for m in body.get("messages", []) if m.get("role") == "assistant"))

    async def _authorised(self, request: Request) -> tuple[dict[str, Any] | None, Response | None]:
        body = await self._record(request)
        if request.headers.get("x-api-key") != self.key:
            return None, _error(401, f"invalid x-api-key: {request.headers.get('x-api-key')}")
        return body, None

    async def _count(self, request: Request) -> Response:
        body, refused = await self._authorised(request)
        if refused is not None:
            return refused
        return JSONResponse({"input_tokens": len(json.dumps(body)) // 4})

    async def _messages(self, request: Request) -> Response:
        body, refused = await self._authorised(request)
        if refused is not None:
            return refused
        assert body is not None
        step = self._step(body)
        if "hang" in step:
            await asyncio.sleep(step["hang"])
        if "status" in step:
            return _error(step["status"], f"scripted failure {step['status']}")
        if "redirect" in step:
            return RedirectResponse(step["redirect"], status_code=307)
        blocks: list[dict[str, Any]] = []
        if "bash" in step:
            tool = next((t for t in body.get("tools", []) if str(t.get("name")).lower() in SHELL_TOOL_NAMES), None)
            name = tool["name"] if tool else "bash"
            args = shell_arguments((tool or {}).get("input_schema") or {}, step["bash"])
            blocks.append({"type": "tool_use", "id": f"toolu_{len(self.requests)}", "name": name, "input": args})
        else:
            blocks.append({"type": "text", "text": step.get("text", "done").replace("{key}", request.headers.get("x-api-key", ""))})
        stop = "tool_use" if "bash" in step else "end_turn"
        usage = {"input_tokens": len(json.dumps(body)) // 4, "output_tokens": sum(len(json.dumps(b)) // 4 for b in blocks)}
        message = {
            "id": f"msg_{len(self.requests)}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": blocks,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        if not body.get("stream"):
            return JSONResponse(message)

        def event(kind: str, data: dict[str, Any]) -> str:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"

        async def stream():
            yield event(
                "message_start",
                {"message": {**message, "content": [], "stop_reason": None, "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 0}}},
            )
            for i, block in enumerate(blocks):
                if block["type"] == "text":
                    yield event("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}})
                    for p in re.split(r"(?<= )", block["text"]):  # word by word
                        yield event("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": p}})
                else:
                    yield event("content_block_start", {"index": i, "content_block": {**block, "input": {}}})
                    for p in pieces(json.dumps(block["input"]), 8):
                        yield event("content_block_delta", {"index": i, "delta": {"type": "input_json_delta", "partial_json": p}})
                yield event("content_block_stop", {"index": i})
            yield event("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": usage["output_tokens"]}})
            yield event("message_stop", {})

        return StreamingResponse(stream(), media_type="text/event-stream")


class FakeMessagesServer(LoopbackServer):
    """Serves a FakeMessagesUpstream on a loopback port; its `base_url` ends in /v1, as a user
    would give Anthropic's."""

    def __init__(self, upstream: FakeMessagesUpstream) -> None:
        self.upstream = upstream
        super().__init__(upstream.app())
