"""A scripted OpenAI-compatible vision judge for the SVG icon family's tests.

It answers /v1/chat/completions and checks every request as a real vision judge would need it:
the expected number of `image_url` parts, each a base64 data URL of a PNG, and a strict json_schema
`response_format`. A request that fails a check gets a 400 and the problem is recorded in
`problems` (tests assert it stays empty).

Steps are taken per call, in order (call n takes `script[n]`, then `default_step`):
{"status": N} answers an HTTP error (with "headers": {...} if given, "echo_auth": True puts the
Authorization header in the error text); {"scores": {dim: score}} answers those scores (dimensions
not listed get `default_score`); {"raw": TEXT} answers TEXT as the message content;
{"hang": S} sleeps S seconds first and then does the rest of the step.
The default answers valid scores for whatever dimensions the request's schema lists.
"""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.loopback import LoopbackServer

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass
class FakeJudge:
    script: list[dict[str, Any]] = field(default_factory=list)
    default_step: dict[str, Any] = field(default_factory=dict)
    default_score: float = 0.8
    expect_images: int | None = None  # None: accept 1 or 2
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    images: list[list[bytes]] = field(default_factory=list)  # decoded PNGs per request, in order
    problems: list[str] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    @property
    def calls(self) -> int:
        return len(self.requests)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])

    def _check(self, body: dict[str, Any]) -> tuple[list[bytes], list[str], list[str]]:
        """Decoded images, schema dimension names, and problems with the request."""
        problems: list[str] = []
        images: list[bytes] = []
        for m in body.get("messages", []):
            content = m.get("content")
            for part in content if isinstance(content, list) else []:
                if part.get("type") != "image_url":
                    continue
                url = str((part.get("image_url") or {}).get("url", ""))
                prefix = "data:image/png;base64,"
                if not url.startswith(prefix):
                    problems.append(f"image part is not a PNG data URL: {url[:40]!r}")
                    continue
                try:
                    png = base64.b64decode(url[len(prefix) :], validate=True)
                except ValueError:
                    problems.append("image part is not valid base64")
                    continue
                if not png.startswith(PNG_SIGNATURE):
                    problems.append("image part does not decode to a PNG")
                images.append(png)
        want = self.expect_images
        if (want is not None and len(images) != want) or (want is None and len(images) not in (1, 2)):
            problems.append(f"expected {want if want is not None else '1 or 2'} images, got {len(images)}")
        rf = body.get("response_format") or {}
        schema = (rf.get("json_schema") or {}).get("schema") or {}
        if rf.get("type") != "json_schema" or not (rf.get("json_schema") or {}).get("strict") or schema.get("type") != "object":
            problems.append(f"response_format is not a strict json_schema: {json.dumps(rf)[:200]}")
        return images, list(schema.get("required") or []), problems

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        n = len(self.requests)
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        images, dims, problems = self._check(body)
        self.images.append(images)
        if problems:
            self.problems += problems
            return JSONResponse({"error": {"message": "; ".join(problems), "type": "invalid_request_error"}}, status_code=400)
        step = self.script[n] if n < len(self.script) else self.default_step
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if "hang" in step:
                await asyncio.sleep(step["hang"])
        finally:
            self.in_flight -= 1
        if "status" in step:
            message = f"scripted failure {step['status']}"
            if step.get("echo_auth"):
                message += f" for {request.headers.get('authorization', '')}"
            return JSONResponse({"error": {"message": message, "type": "server_error"}}, status_code=step["status"], headers=step.get("headers"))
        if "raw" in step:
            content = step["raw"]
        else:
            scores = {d: self.default_score for d in dims} | dict(step.get("scores") or {})
            content = json.dumps({d: {"reason": f"fake reason for {d}", "score": s} for d, s in scores.items()})
        return JSONResponse(
            {
                "id": f"judge-{n}",
                "object": "chat.completion",
                "model": body.get("model", ""),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": step.get("finish_reason", "stop")}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150},
            }
        )


class FakeJudgeServer(LoopbackServer):
    """`with FakeJudgeServer(FakeJudge(...)) as srv:` -> `srv.judge`, `srv.base_url` (ends in /v1)."""

    def __init__(self, judge: FakeJudge | None = None) -> None:
        self.judge = judge or FakeJudge()
        super().__init__(self.judge.app())
