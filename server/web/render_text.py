"""Text helpers shared by the render modules: everything shown is HTML-escaped, long text is
clipped (the JSON download has everything), numbers are rounded, message content is flattened."""

from __future__ import annotations

import json
from html import escape
from typing import Any

MAX_SHOWN_CHARS = 20_000  # per output or file shown inline; the JSON download has everything


def clip(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... ({len(text) - limit} more characters in the JSON download)"


def md_cell(text: str) -> str:
    return escape(text).replace("|", "&#124;").replace("\n", " ")


def num(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else escape(str(value))
    return str(round(value, digits))


def format_reward(reward: float | None) -> str:
    return "-" if reward is None else str(round(reward, 4))


def content_text(content: Any) -> str:
    """Message content (OpenAI's, or an ATIF step's): a string, or a list of parts (text parts
    kept, others named)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                out.append(str(part.get("text") or ""))
            elif isinstance(part, dict):
                out.append(f"[{part.get('type', 'part')}]")
            else:
                out.append(str(part))
        return "\n".join(out)
    return json.dumps(content)
