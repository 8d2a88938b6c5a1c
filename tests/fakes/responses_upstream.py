"""A scripted upstream that speaks the OpenAI Responses API natively: for the capture proxy's
pass-through, where nothing is translated.

Scripts are FakePolicy's (tests/fakes/policy.py), per model name, one step per `function_call`
item already in the input: {"bash": CMD} calls the harness's shell tool (`exec_command` for Codex),
{"text": T} answers and ends, {"status": N} answers an error in OpenAI's shape. A request without
tools gets "Fake title". It answers only `Authorization: Bearer <its key>` (401 otherwise), streams
Responses events (created, output item added, deltas, item done, completed) or answers whole, and
records every request and its headers.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.loopback import LoopbackServer
from tests.fakes.native_upstream import ScriptedUpstream
from tests.fakes.policy import SHELL_TOOL_NAMES, pieces, shell_arguments


@dataclass
class FakeResponsesUpstream(ScriptedUpstream):
    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/responses", self._responses, methods=["POST"])])

    def _step(self, body: dict[str, Any]) -> dict[str, Any]:
        if not body.get("tools"):
            return {"text": "Fake title"}
        items = body.get("input") if isinstance(body.get("input"), list) else []
        return self._scripted(body.get("model", ""), sum(1 for item in items if isinstance(item, dict) and item.get("type") == "function_call"))

    async def _responses(self, request: Request) -> Response:
        body = await self._record(request)
        if request.headers.get("authorization") != f"Bearer {self.key}":
            return JSONResponse(
                {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "code": "invalid_api_key"}}, status_code=401
            )
        step = self._step(body)
        if "status" in step:
            return JSONResponse({"error": {"message": f"scripted failure {step['status']}", "type": "server_error"}}, status_code=step["status"])
        n = len(self.requests)
        if "bash" in step:
            tool = next((t for t in body.get("tools", []) if str(t.get("name")).lower() in SHELL_TOOL_NAMES), None)
            name = tool["name"] if tool else "shell"
            arguments = json.dumps(shell_arguments((tool or {}).get("parameters") or {}, step["bash"]))
            item: dict[str, Any] = {
                "type": "function_call",
                "id": f"fc_{n}",
                "status": "completed",
                "call_id": f"call_{n}",
                "name": name,
                "arguments": arguments,
            }
        else:
            text = step.get("text", "done")
            item = {
                "type": "message",
                "id": f"msg_{n}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        usage = {
            "input_tokens": len(json.dumps(body)) // 4,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": len(json.dumps(item)) // 4,
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        response = {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": body.get("model"),
            "output": [item],
            "usage": usage,
            "error": None,
            "incomplete_details": None,
        }
        if not body.get("stream"):
            return JSONResponse(response)

        def event(kind: str, **data: Any) -> str:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"

        async def stream():
            yield event("response.created", response={**response, "status": "in_progress", "output": [], "usage": None})
            if item["type"] == "function_call":
                yield event("response.output_item.added", output_index=0, item={**item, "status": "in_progress", "arguments": ""})
                for p in pieces(item["arguments"], 8):
                    yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=0, delta=p)
                yield event("response.function_call_arguments.done", item_id=item["id"], output_index=0, arguments=item["arguments"])
            else:
                yield event("response.output_item.added", output_index=0, item={**item, "status": "in_progress", "content": []})
                for p in pieces(item["content"][0]["text"]):
                    yield event("response.output_text.delta", item_id=item["id"], output_index=0, content_index=0, delta=p)
            yield event("response.output_item.done", output_index=0, item=item)
            yield event("response.completed", response=response)

        return StreamingResponse(stream(), media_type="text/event-stream")


class FakeResponsesServer(LoopbackServer):
    """Serves a FakeResponsesUpstream on a loopback port; its `base_url` ends in /v1."""

    def __init__(self, upstream: FakeResponsesUpstream) -> None:
        self.upstream = upstream
        super().__init__(upstream.app())
