"""What the Gemini dialect declares of Gemini's generateContent API: the shape of a request
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
        "contents": (list,),
        "systemInstruction": (str, dict),
        "system_instruction": (str, dict),
        "tools": (list,),
        "generationConfig": (dict,),
        "toolConfig": (dict,),
        "generateContentRequest": (dict,),
    },
    inline_media=" (inlineData, not fileData)",
)


@dataclass
class GeminiReader:
    """A stream's chunk and a whole answer have the same shape."""

    draft: TurnDraft

    def event(self, obj: dict[str, Any], data: str) -> None:
        self.whole(obj)

    def whole(self, obj: dict[str, Any]) -> None:
        draft = self.draft
        for candidate in (obj.get("candidates") or [])[:1]:
            for part in (candidate.get("content") or {}).get("parts") or []:
                if "functionCall" in part:
                    call = part["functionCall"] or {}
                    add_call(draft, call.get("id"), call.get("name"), json.dumps(call.get("args") or {}))
                elif isinstance(part.get("text"), str):
                    (draft.reasoning_parts if part.get("thought") else draft.text_parts).append(part["text"])
            draft.finish_reason = candidate.get("finishReason") or draft.finish_reason
        if isinstance(obj.get("usageMetadata"), dict):
            draft.usage = obj["usageMetadata"]


NATIVE = NativeAPI(
    wire_api="gemini",
    auth_header="x-goog-api-key",
    auth_template="{key}",
    max_tokens=(("generationConfig",), "maxOutputTokens"),
    reader=GeminiReader,
    count=(("generationConfig",), "candidateCount"),
    count_suffix=":countTokens",
)
