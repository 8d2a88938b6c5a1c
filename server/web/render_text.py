"""Text helpers shared by the render modules: everything shown is HTML-escaped, long text is
clipped (the JSON download has everything), numbers are rounded, message content is flattened."""

from __future__ import annotations

import json
import string
from html import escape
from typing import Any

MAX_SHOWN_CHARS = 20_000  # per output or file shown inline; the JSON download has everything


def clip(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... ({len(text) - limit} more characters in the JSON download)"


# Every ASCII punctuation character as a character reference: Markdown shows a reference as the
# character and never reads it as syntax, and all of Markdown's syntax (emphasis, links, images,
# code, tables, raw HTML) and what its autolinks need (":", ".", "@") is punctuation. What is left
# is letters, digits and spaces: text.
_MARKDOWN_INERT = {ord(c): f"&#{ord(c)};" for c in string.punctuation}


def md_text(text: str) -> str:
    """`text` (anything the agent, a tool, a task or a file wrote) for a Markdown component: shown
    as the characters it holds, never as markup."""
    return text.translate(_MARKDOWN_INERT)


def md_cell(text: str) -> str:
    """md_text on one line (a table cell, a title)."""
    return md_text(text).replace("\r", " ").replace("\n", " ")


def html_text(text: str, tag: str = "div", css_class: str = "he-text") -> str:
    """`text` as an HTML element of its own, escaped and clipped: what the conversation shows."""
    return f'<{tag} class="{css_class}">{escape(clip(text))}</{tag}>'


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
