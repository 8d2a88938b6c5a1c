"""Reading `opencode run --format json`: final text, verified tool-call count, errors.

A tool call counts once per call id, and only when its last state is completed or error.
"""

from __future__ import annotations

from typing import Any

from harness_env.core.harness import AgentOutcome, JsonEventParser


class OpenCodeEventParser(JsonEventParser):
    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, str] = {}  # call id -> last status
        self.texts: list[str] = []

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        part = event.get("part") if isinstance(event.get("part"), dict) else {}
        if kind == "tool_use" and part.get("callID"):
            state = part.get("state") if isinstance(part.get("state"), dict) else {}
            self.calls[str(part["callID"])] = str(state.get("status", ""))
        elif kind == "text" and isinstance(part.get("text"), str):
            self.texts.append(part["text"])
        elif kind == "step_start":
            self.texts = []  # the final text is the last step's
        elif kind == "error":
            err = event.get("error")
            data = err.get("data") if isinstance(err, dict) else None
            message = (data or {}).get("message") if isinstance(data, dict) else None
            self.error = str(message or err or "opencode reported an error")[:2000]

    def outcome(self) -> AgentOutcome:
        done = sum(1 for status in self.calls.values() if status in ("completed", "error"))
        return AgentOutcome(final_text="".join(self.texts), tool_calls=done, error=self.error, events=self.events)
