"""Reading `gemini --output-format stream-json`: final text, verified tool-call count, errors.

A tool call counts when its `tool_use` event got a `tool_result` (success or error), each id once.
The final text is what the model wrote after its last tool call (its `message` deltas). A `result`
event with status "error" (or an `error` event of severity "error", until a successful result) is
the run's error.
"""

from __future__ import annotations

from typing import Any

from harness_env.core.harness import CallResultParser


class GeminiEventParser(CallResultParser):
    def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message" and event.get("role") == "assistant" and isinstance(event.get("content"), str):
            self.final_text = self.final_text + event["content"] if event.get("delta") else event["content"]
        elif kind == "tool_use" and event.get("tool_id"):
            self.calls.add(str(event["tool_id"]))
            self.final_text = ""
        elif kind == "tool_result" and event.get("tool_id"):
            self.results.add(str(event["tool_id"]))
        elif kind == "error" and event.get("severity") == "error":
            self.error = str(event.get("message") or "gemini reported an error")[:2000]
        elif kind == "result":
            err = event.get("error")
            if event.get("status") == "success":
                self.error = None
            else:
                self.error = str((err.get("message") if isinstance(err, dict) else err) or "gemini reported a failed run")[:2000]
