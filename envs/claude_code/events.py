"""Reading `claude -p --output-format stream-json --verbose`: final text, verified tool-call count,
errors.

Claude Code exits 0 even when a tool call was refused or failed (the model is told in a tool
result), so a tool call counts when its `tool_use` (in an assistant event) got a `tool_result` (in
a user event), each id once, refused and failed ones included. The final text is the last text
the model wrote in the main conversation (not a sub-agent's, not the API error Claude Code shows as
a `<synthetic>` message), replaced by the `result` event's on success; with `is_error`, the
result's text (the API error quoted) or subtype is the run's error.
"""

from __future__ import annotations

from typing import Any

from harness_env.core.harness import CallResultParser


def _blocks(event: dict[str, Any]) -> list[dict[str, Any]]:
    message = event.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _synthetic(event: dict[str, Any]) -> bool:
    """A message Claude Code wrote itself (an API error shown as the answer), not the model."""
    message = event.get("message")
    return isinstance(message, dict) and message.get("model") == "<synthetic>"


class ClaudeCodeEventParser(CallResultParser):
    def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "assistant":
            blocks = _blocks(event)
            self.calls.update(str(b["id"]) for b in blocks if b.get("type") == "tool_use" and b.get("id"))
            texts = [str(b.get("text", "")) for b in blocks if b.get("type") == "text"]
            if texts and event.get("parent_tool_use_id") is None and not _synthetic(event):
                self.final_text = "".join(texts)
        elif kind == "user":
            self.results.update(str(b["tool_use_id"]) for b in _blocks(event) if b.get("type") == "tool_result" and b.get("tool_use_id"))
        elif kind == "result":
            self._result(event)

    def _result(self, event: dict[str, Any]) -> None:
        text = event.get("result")
        if event.get("is_error") or str(event.get("subtype", "success")) != "success":
            self.error = str(text or event.get("subtype") or "claude reported an error")[:2000]
        else:
            self.error = None
            if isinstance(text, str):
                self.final_text = text
