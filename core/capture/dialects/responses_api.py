"""What the Responses dialect declares of OpenAI's Responses API: the shape of a request
(REQUEST_SHAPE) and how an upstream that speaks it is reached and read (NATIVE, for pass-through:
core/capture/dialects/native.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from harness_env.core.capture.assemble import TurnDraft
from harness_env.core.capture.dialects.base import RequestShape
from harness_env.core.capture.dialects.native import NativeAPI, add_call

REQUEST_SHAPE = RequestShape(
    {
        "input": (str, list),
        "instructions": (str,),
        "tools": (list,),
        "stream": (bool,),
        "text": (dict,),
        "tool_choice": (str, dict),
        "parallel_tool_calls": (bool,),
        "previous_response_id": (str,),
    },
    inline_media=" (an input_image whose image_url is data:<mime>;base64,...)",
)

FINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")


def read_answer(draft: TurnDraft, response: dict[str, Any]) -> None:
    """A whole Responses object (also what a final event carries: the stream's deltas are not
    read, the final object has them all)."""
    for item in response.get("output") or []:
        if item.get("type") == "message":
            draft.text_parts.extend(str(p.get("text", "")) for p in item.get("content") or [] if p.get("type") == "output_text")
        elif item.get("type") == "reasoning":
            draft.reasoning_parts.extend(str(p.get("text", "")) for p in item.get("summary") or [])
        elif item.get("type") in ("function_call", "custom_tool_call"):
            add_call(draft, item.get("call_id"), item.get("name"), str(item.get("arguments", item.get("input", ""))))
    draft.finish_reason = response.get("status") or draft.finish_reason
    if isinstance(response.get("usage"), dict):
        draft.usage = response["usage"]
    if isinstance(response.get("error"), dict):
        draft.errors.append(f"error in answer: {json.dumps(response['error'])[:500]}")


@dataclass
class ResponsesReader:
    draft: TurnDraft

    def event(self, obj: dict[str, Any], data: str) -> None:
        if obj.get("type") in FINAL_EVENTS:
            read_answer(self.draft, obj.get("response") or {})
        elif obj.get("type") == "error":
            self.draft.errors.append(f"error in stream: {data[:500]}")

    def whole(self, obj: dict[str, Any]) -> None:
        read_answer(self.draft, obj)


NATIVE = NativeAPI(
    wire_api="responses", auth_header="authorization", auth_template="Bearer {key}", max_tokens=((), "max_output_tokens"), reader=ResponsesReader
)
