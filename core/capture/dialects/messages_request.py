"""Anthropic Messages requests translated to chat completions (the pure half of
dialects/messages.py: its module docstring says what is translated and how).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness_env.core.capture.dialects.base import ChatRequest
from harness_env.core.capture.dialects.chunks import chat_content, user_turn
from harness_env.core.capture.dialects.sampled import SampledArguments
from harness_env.core.errors import InvalidRequestError

if TYPE_CHECKING:
    pass

BILLING_HEADER = "x-anthropic-billing-header:"  # Claude Code's first system block: not for the model
SIGNATURE_PREFIX = "harness-env.thinking.v1:"


@dataclass(slots=True)
class MessagesChatRequest(ChatRequest):
    count_only: bool = False  # count_tokens: the engine is asked for the prompt's length only
    stop_sequences: list[str] = field(default_factory=list)


def thinking_signature(text: str) -> str:
    """The signature of a thinking block this proxy wrote: a digest of its text (the text is what
    is read back; the signature only has to be there and stay the same)."""
    return SIGNATURE_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:32]


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise InvalidRequestError(f"{where}: content must be a string or a list of blocks")
    return content


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        url = f"data:{source.get('media_type') or 'image/png'};base64,{source['data']}"
    elif source.get("type") == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise InvalidRequestError(
            f"{where}: an image's source must be base64 data (a url is refused: the engine is never made to fetch "
            "anything; file ids need the Files API, which this proxy does not serve)"
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _document(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A document as text: a plain-text source, or a content source of text blocks."""
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    if source.get("type") == "text" and isinstance(source.get("data"), str):
        return {"type": "text", "text": source["data"]}
    if source.get("type") == "content":
        return {"type": "text", "text": "".join(_text_of(b, where) for b in _blocks(source.get("content"), where))}
    raise InvalidRequestError(f"{where}: a document of source type {source.get('type')!r} is not supported by this proxy (text documents are)")


def _text_of(block: dict[str, Any], where: str) -> str:
    if block.get("type") != "text":
        raise InvalidRequestError(f"{where}: only text blocks are supported here, not {block.get('type')!r}")
    return str(block.get("text", ""))


def _part(block: dict[str, Any], where: str, referenced: list[str]) -> dict[str, Any]:
    """A user-side block (in a user message or a tool result) -> a chat content part."""
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": str(block.get("text", ""))}
    if kind == "image":
        return _image(block, where)
    if kind == "document":
        return _document(block, where)
    if kind == "tool_reference" and isinstance(block.get("tool_name"), str):
        referenced.append(block["tool_name"])
        return {"type": "text", "text": f"Tool {block['tool_name']} loaded."}
    raise InvalidRequestError(f"{where}: content blocks of type {kind!r} are not supported by this proxy")


def _assistant(blocks: list[dict[str, Any]], where: str, sampled: SampledArguments) -> dict[str, Any]:
    """An assistant message's blocks -> one chat assistant message, as the engine produced it (a
    tool_use's input as the engine's own text when it is the object the harness was handed)."""
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind, at = block.get("type"), f"{where}.content[{j}]"
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue  # encrypted by another server: nothing to read
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise InvalidRequestError(f"{at}: a tool_use needs 'id' and 'name'")
            calls.append(
                {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": sampled.text(block["id"], block.get("input"))}}
            )
        else:
            raise InvalidRequestError(f"{at}: assistant blocks of type {kind!r} are not supported by this proxy")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text else None}
    if calls:
        msg["tool_calls"] = calls
    if reasoning:
        msg["reasoning_content"] = "".join(reasoning)
    return msg


def _user(blocks: list[dict[str, Any]], where: str, referenced: list[str]) -> list[dict[str, Any]]:
    """A user message's blocks -> chat messages: each tool_result a tool message, the other blocks
    user messages between them, in the order given."""
    pieces = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if block.get("type") != "tool_result":
            pieces.append(_part(block, at, referenced))
            continue
        if not isinstance(block.get("tool_use_id"), str):
            raise InvalidRequestError(f"{at}: a tool_result needs 'tool_use_id'")
        result = block.get("content")
        if result is None:
            result = ""
        content = result if isinstance(result, str) else chat_content([_part(b, at, referenced) for b in _blocks(result, at)])
        pieces.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": content})
    return user_turn(pieces)


def system_text(system: Any) -> str:
    """`system`: a string or text blocks, joined by a line break; Claude Code's billing block out."""
    if system is None or system == "":
        return ""
    texts = [_text_of(b, "system") for b in _blocks(system, "system")]
    return "\n".join(t for t in texts if not t.startswith(BILLING_HEADER))


def translate_messages(body: dict[str, Any], sampled: SampledArguments) -> tuple[list[dict[str, Any]], list[str]]:
    """`system` and `messages` -> chat messages (a pure function of them and the session's sampled
    arguments: replays translate alike), and the names of the tools `tool_reference` blocks loaded."""
    items = body.get("messages")
    if not isinstance(items, list):
        raise InvalidRequestError("'messages' must be a list")
    referenced: list[str] = []
    out: list[dict[str, Any]] = []
    system = system_text(body.get("system"))
    if system:
        out.append({"role": "system", "content": system})
    for i, msg in enumerate(items):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise InvalidRequestError(f"{where} must be an object")
        role, blocks = msg.get("role"), _blocks(msg.get("content"), where)
        if role == "assistant":
            out.append(_assistant(blocks, where, sampled))
        elif role == "user":
            out.extend(_user(blocks, where, referenced))
        elif role == "system":
            out.append({"role": "system", "content": "\n".join(_text_of(b, where) for b in blocks)})
        else:
            raise InvalidRequestError(f"{where}: unknown role {role!r}")
    return out, referenced


def translate_tools(tools: Any, referenced: list[str]) -> list[dict[str, Any]]:
    """Messages tools -> chat tools. Tools Anthropic runs or defines itself (web search, code
    execution, its bash and text editor: a `type` and no `input_schema`) have no chat form and are
    left out, as are deferred tools no `tool_reference` loaded."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequestError("'tools' must be a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise InvalidRequestError(f"tools[{i}] must be an object")
        if tool.get("type") not in (None, "custom") or not isinstance(tool.get("name"), str):
            continue
        if tool.get("defer_loading") and tool["name"] not in referenced:
            continue
        fn: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description"):
            fn["description"] = tool["description"]
        fn["parameters"] = tool.get("input_schema") or {"type": "object", "properties": {}}
        if tool.get("strict") is not None:
            fn["strict"] = tool["strict"]
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: Any) -> tuple[Any, bool | None]:
    """Messages tool_choice -> chat tool_choice and parallel_tool_calls."""
    if not isinstance(choice, dict):
        return None, None
    parallel = False if choice.get("disable_parallel_tool_use") else None
    kind = choice.get("type")
    if kind == "tool" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}.get(kind), parallel
