"""What the Messages dialect declares of Anthropic's Messages API: the shape of a request
(REQUEST_SHAPE) and how an upstream that speaks it is reached and read (NATIVE, for pass-through:
core/capture/dialects/native.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from harness_env.core.capture.assemble import TurnDraft
from harness_env.core.capture.dialects.base import RequestShape
from harness_env.core.capture.dialects.native import NativeAPI, add_call

REQUEST_SHAPE = RequestShape(
    {"messages": (list,), "system": (str, list), "tools": (list,), "stream": (bool,), "stop_sequences": (list,), "tool_choice": (dict,), "max_tokens": (int,)},
    required=("messages",),
    inline_media=" (an image block with a base64 source)",
)


def read_answer(draft: TurnDraft, message: dict[str, Any]) -> None:
    """A whole Messages answer (or the `message` of `message_start`, whose content is empty)."""
    for block in message.get("content") or []:
        if block.get("type") == "text":
            draft.text_parts.append(str(block.get("text", "")))
        elif block.get("type") == "thinking":
            draft.reasoning_parts.append(str(block.get("thinking", "")))
        elif block.get("type") in ("tool_use", "server_tool_use"):
            add_call(draft, block.get("id"), block.get("name"), json.dumps(block.get("input") or {}))
    draft.finish_reason = message.get("stop_reason") or draft.finish_reason
    if isinstance(message.get("usage"), dict):
        draft.usage = {**(draft.usage or {}), **message["usage"]}


@dataclass
class MessagesReader:
    draft: TurnDraft
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)  # the tool calls open in this stream, by index

    def event(self, obj: dict[str, Any], data: str) -> None:
        draft, kind = self.draft, obj.get("type")
        if kind == "message_start":
            read_answer(draft, obj.get("message") or {})
        elif kind == "content_block_start":
            block = obj.get("content_block") or {}
            if block.get("type") in ("tool_use", "server_tool_use"):
                self.blocks[int(obj.get("index") or 0)] = add_call(draft, block.get("id"), block.get("name"))
        elif kind == "content_block_delta":
            delta = obj.get("delta") or {}
            if delta.get("type") == "text_delta":
                draft.text_parts.append(str(delta.get("text", "")))
            elif delta.get("type") == "thinking_delta":
                draft.reasoning_parts.append(str(delta.get("thinking", "")))
            elif delta.get("type") == "input_json_delta" and int(obj.get("index") or 0) in self.blocks:
                self.blocks[int(obj.get("index") or 0)]["function"]["arguments"] += str(delta.get("partial_json", ""))
        elif kind == "message_delta":
            draft.finish_reason = (obj.get("delta") or {}).get("stop_reason") or draft.finish_reason
            if isinstance(obj.get("usage"), dict):
                draft.usage = {**(draft.usage or {}), **obj["usage"]}
        elif kind == "error":
            draft.errors.append(f"error in stream: {json.dumps(obj.get('error'))[:500]}")

    def whole(self, obj: dict[str, Any]) -> None:
        read_answer(self.draft, obj)


NATIVE = NativeAPI(
    wire_api="messages", auth_header="x-api-key", auth_template="{key}", max_tokens=((), "max_tokens"), reader=MessagesReader, count_suffix="/count_tokens"
)
