"""A scripted upstream that speaks Google's Gemini API natively: for the capture proxy's
pass-through, where nothing is translated.

Scripts are FakePolicy's (tests/fakes/policy.py), per model name (as it stands in the path), one
step per `model` content already in the conversation: {"bash": CMD} calls the harness's shell tool
(`run_shell_command` for Gemini CLI), {"text": T} answers and ends, {"status": N} answers an error
in Google's shape. A request without tools gets "Fake title". It answers only
`x-goog-api-key: <its key>` (401 otherwise), streams `GenerateContentResponse` chunks as SSE for
`:streamGenerateContent?alt=sse` or answers whole for `:generateContent`, counts tokens for
`:countTokens`, and records every request, its path and headers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.loopback import LoopbackServer
from tests.fakes.native_upstream import ScriptedUpstream
from tests.fakes.policy import SHELL_TOOL_NAMES, pieces, shell_arguments


def _error(status: int, message: str) -> JSONResponse:
    names = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 429: "RESOURCE_EXHAUSTED"}
    return JSONResponse({"error": {"code": status, "message": message, "status": names.get(status, "INTERNAL")}}, status_code=status)


@dataclass
class FakeGeminiUpstream(ScriptedUpstream):
    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1beta/models/{call:path}", self._call, methods=["POST"])])

    @staticmethod
    def _declarations(body: dict[str, Any]) -> list[dict[str, Any]]:
        return [d for t in body.get("tools") or [] for d in t.get("functionDeclarations") or []]

    def _step(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        if not self._declarations(body):
            return {"text": "Fake title"}
        return self._scripted(model, sum(1 for c in body.get("contents", []) if c.get("role") == "model"))

    async def _call(self, request: Request) -> Response:
        body = await self._record(request)
        if request.headers.get("x-goog-api-key") != self.key:
            return _error(401, "API key not valid. Please pass a valid API key.")
        model, _, method = request.path_params["call"].rpartition(":")
        if method == "countTokens":
            return JSONResponse({"totalTokens": len(json.dumps(body)) // 4})
        step = self._step(model, body)
        if "status" in step:
            return _error(step["status"], f"scripted failure {step['status']}")
        if "bash" in step:
            tool = next((d for d in self._declarations(body) if str(d.get("name")).lower() in SHELL_TOOL_NAMES), None)
            schema = (tool or {}).get("parametersJsonSchema") or (tool or {}).get("parameters") or {}
            parts = [{"functionCall": {"name": tool["name"] if tool else "bash", "args": shell_arguments(schema, step["bash"])}}]
        else:
            parts = [{"text": p} for p in pieces(step.get("text", "done"))]
        usage = {"promptTokenCount": len(json.dumps(body)) // 4, "candidatesTokenCount": len(json.dumps(parts)) // 4}
        usage["totalTokenCount"] = usage["promptTokenCount"] + usage["candidatesTokenCount"]
        chunks = [{"candidates": [{"content": {"role": "model", "parts": [part]}, "index": 0}]} for part in parts]
        chunks[-1]["candidates"][0]["finishReason"] = "STOP"
        chunks[-1]["usageMetadata"] = usage
        if method == "generateContent":
            return JSONResponse({"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}], "usageMetadata": usage})

        async def stream():
            for chunk in chunks:
                yield f"data: {json.dumps(chunk)}\r\n\r\n"

        return StreamingResponse(stream(), media_type="text/event-stream")


class FakeGeminiServer(LoopbackServer):
    """Serves a FakeGeminiUpstream on a loopback port (`base_url` ends in /v1; the API's root is
    what a user gives, with or without it)."""

    def __init__(self, upstream: FakeGeminiUpstream) -> None:
        self.upstream = upstream
        super().__init__(upstream.app())
