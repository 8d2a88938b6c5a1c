"""What the scripted native-API upstreams (messages_upstream.py, responses_upstream.py,
gemini_upstream.py) share: their script, what they record of each request, the step a
conversation is at."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request


@dataclass
class ScriptedUpstream:
    key: str
    scripts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    def tool_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r.get("tools")]

    async def _record(self, request: Request) -> dict[str, Any]:
        """The request's JSON body, after recording it, its headers and its path."""
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        self.paths.append(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
        return body

    def _scripted(self, model: str, answered: int) -> dict[str, Any]:
        """The step of `model`'s script after `answered` assistant turns ("done" past its end)."""
        script = self.scripts.get(model, [])
        return script[answered] if answered < len(script) else {"text": "done"}
