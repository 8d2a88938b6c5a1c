"""Reading Pi's `--mode json` event stream: final text, verified tool-call count, errors.

Pi exits 0 in JSON mode even when the model call failed, so the error comes from the events: an
assistant message ending with stopReason "error".
"""

from __future__ import annotations

from typing import Any

from harness_env.core.harness import AgentOutcome, JsonEventParser


class PiEventParser(JsonEventParser):
    def __init__(self) -> None:
        super().__init__()
        self.started: set[str] = set()
        self.finished: set[str] = set()

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "tool_execution_start" and event.get("toolCallId"):
            self.started.add(str(event["toolCallId"]))
        elif kind == "tool_execution_end" and event.get("toolCallId"):
            self.finished.add(str(event["toolCallId"]))
        elif kind == "message_end":
            self._message_end(event.get("message") or {})

    def _message_end(self, message: dict[str, Any]) -> None:
        if message.get("role") != "assistant":
            return
        stop = message.get("stopReason")
        if stop == "error":
            self.error = str(message.get("errorMessage") or "the model call failed")[:2000]
            return
        texts = [c.get("text", "") for c in message.get("content") or [] if isinstance(c, dict) and c.get("type") == "text"]
        if texts:
            self.final_text = "".join(texts)
        if stop in ("stop", "length", "toolUse"):
            self.error = None  # a later successful call supersedes a retried failure

    def outcome(self) -> AgentOutcome:
        # A call counts when it both started and finished (completed or errored).
        return AgentOutcome(final_text=self.final_text, tool_calls=len(self.started & self.finished), error=self.error, events=self.events)
