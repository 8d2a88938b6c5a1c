"""Reading `codex exec --json` (JSONL thread events): final text, verified tool-call count, errors.

A tool call counts once per item id, when Codex reports its item completed in a terminal state
(a command that ran, a patch applied or refused, an MCP call answered). Items of type `error` are
warnings (a deprecated setting, unknown model metadata) and fail nothing; a `turn.failed` or a
top-level `error` event is the run's error, and a later completed turn supersedes it.
"""

from __future__ import annotations

from typing import Any

from harness_env.core.harness import AgentOutcome, JsonEventParser

TOOL_ITEMS = ("command_execution", "file_change", "mcp_tool_call", "collab_tool_call", "web_search")
TERMINAL = ("completed", "failed", "declined")


class CodexEventParser(JsonEventParser):
    def __init__(self) -> None:
        super().__init__()
        self.tool_calls: set[str] = set()

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "item.completed" and isinstance(event.get("item"), dict):
            self._item(event["item"])
        elif kind == "turn.failed":
            err = event.get("error")
            self.error = str((err.get("message") if isinstance(err, dict) else err) or "codex reported a failed turn")[:2000]
        elif kind == "error":
            self.error = str(event.get("message") or "codex reported an error")[:2000]
        elif kind == "turn.completed":
            self.error = None

    def _item(self, item: dict) -> None:
        kind = item.get("type")
        if kind == "agent_message" and isinstance(item.get("text"), str):
            self.final_text = item["text"]
        elif kind in TOOL_ITEMS and item.get("id") and item.get("status", "completed") in TERMINAL:
            self.tool_calls.add(str(item["id"]))

    def outcome(self) -> AgentOutcome:
        return AgentOutcome(final_text=self.final_text, tool_calls=len(self.tool_calls), error=self.error, events=self.events)
