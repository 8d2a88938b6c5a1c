"""Reading an OpenAI Responses API request (`POST {base}/responses`, core/capture/dialects/responses.py)
as the engine's chat completions.

`instructions` and the leading system/developer messages become one system message; `input` items
become chat messages (a run of reasoning, assistant message and function-call items is one
assistant message, as the engine produced it; `function_call_output` a tool message); `tools` of
type function become chat functions, `custom` (freeform) tools a function taking one string
`input`, and the functions of a `namespace` tool chat functions named `<namespace>__<name>`. The
translation is a pure function of the request, so a harness that replays its history gets messages
that extend the previous call's, and the engine's prompt ids extend too. A reasoning item's text
travels in its `encrypted_content` (`encode_reasoning`: Codex replays that field, not the text), so
it round-trips; the reasoning of a foreign `encrypted_content` (one this proxy did not write) is
dropped on replay.

Not translated (dropped; the engine never sees them): hosted tools (`web_search`, `file_search`,
`code_interpreter`, `image_generation`, `mcp`, `local_shell`, `computer_use`), `reasoning` (effort,
summary), `text.verbosity`, `include`, `truncation`, `prompt_cache_key`, `metadata`,
`service_tier`, `top_logprobs` (the session's policy decides what the engine is asked for),
`background`. Input items of other types (`file` parts, `web_search_call`, `compaction`, ...) are
refused with a 400 naming them; so is `item_reference` (the proxy stores no response).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from harness_env.core.capture.dialects.base import ChatRequest
from harness_env.core.errors import InvalidRequestError

NAMESPACE_SEPARATOR = "__"
REASONING_PREFIX = "harness-env.reasoning.v1:"  # our encrypted_content: this prefix, then base64 of the text
SYSTEM_ROLES = ("system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text")
CUSTOM_TOOL_PARAMETERS = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}


@dataclass(frozen=True)
class ToolName:
    """What a chat function name stands for in the harness's request."""

    name: str
    kind: str = "function"  # or "custom" (freeform: the call carries one string, `input`)
    namespace: str | None = None


@dataclass(slots=True)
class ResponsesChatRequest(ChatRequest):
    tool_names: dict[str, ToolName] = field(default_factory=dict)  # chat function name -> the harness's tool


def _chat_name(name: str, namespace: str | None) -> str:
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name


def translate_tools(tools: list[Any]) -> tuple[list[dict[str, Any]], dict[str, ToolName]]:
    """Responses tools -> chat tools, and what each chat function name stands for. Hosted tools
    (web search, file search, ...) have no chat form and are left out."""
    out: list[dict[str, Any]] = []
    names: dict[str, ToolName] = {}

    def add(tool: dict[str, Any], namespace: str | None) -> None:
        kind, name = tool.get("type"), tool.get("name")
        if kind not in ("function", "custom") or not isinstance(name, str):
            return
        fn: dict[str, Any] = {"name": _chat_name(name, namespace)}
        if tool.get("description"):
            fn["description"] = tool["description"]
        if kind == "function":
            fn["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
            if tool.get("strict") is not None:
                fn["strict"] = tool["strict"]
        else:
            fn["parameters"] = CUSTOM_TOOL_PARAMETERS
        out.append({"type": "function", "function": fn})
        names[fn["name"]] = ToolName(name, kind, namespace)

    for tool in tools:
        if not isinstance(tool, dict):
            raise InvalidRequestError("each of 'tools' must be an object")
        if tool.get("type") == "namespace":
            for inner in tool.get("tools") or []:
                if isinstance(inner, dict):
                    add(inner, str(tool.get("name") or ""))
        else:
            add(tool, None)
    return out, names


def encode_reasoning(text: str) -> str:
    return REASONING_PREFIX + base64.b64encode(text.encode()).decode()


def decode_reasoning(item: dict[str, Any]) -> str:
    """The reasoning text of a replayed reasoning item: ours in `encrypted_content`, else its
    `content` text (a client that replays it); a foreign encrypted_content cannot be read."""
    encrypted = item.get("encrypted_content")
    if isinstance(encrypted, str) and encrypted.startswith(REASONING_PREFIX):
        try:
            return base64.b64decode(encrypted[len(REASONING_PREFIX) :], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise InvalidRequestError("a reasoning item's encrypted_content is damaged") from None
    return "".join(str(p.get("text", "")) for p in item.get("content") or [] if isinstance(p, dict))


def _parts(content: Any, where: str) -> list[dict[str, Any]]:
    """Responses content (a string or parts) -> chat content parts."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where}: content must be a string or a list of parts")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS:
            parts.append({"type": "text", "text": str(part.get("text", part.get("refusal", "")))})
        elif kind == "input_image" and part.get("image_url"):
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise InvalidRequestError(f"{where}: content part of type {kind!r} is not supported by this proxy")
    return parts


def _chat_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """One text part is a string, as chat clients send it; anything else stays a list of parts
    (the engine joins them as it does for any chat client)."""
    parts = _parts(content, where)
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def _text_only(content: Any, where: str) -> str:
    parts = _parts(content, where)
    if any(p["type"] != "text" for p in parts):
        raise InvalidRequestError(f"{where}: a system or developer message can hold text only")
    return "\n".join(p["text"] for p in parts)


class _Assistant:
    """One assistant chat message being gathered from a run of reasoning, message and call items."""

    def __init__(self) -> None:
        self.reasoning: list[str] = []
        self.text: list[str] = []
        self.calls: list[dict[str, Any]] = []

    def accepts(self, kind: str) -> bool:
        """Whether an item of `kind` still belongs to this turn (reasoning, then text, then calls)."""
        return kind in ("function_call", "custom_tool_call") or not (self.text or self.calls)

    def add(self, kind: str, item: dict[str, Any], where: str, chat_names: dict[tuple[str | None, str], str]) -> None:
        if kind == "message":
            self.text.append("".join(p["text"] for p in _parts(item.get("content"), where) if p["type"] == "text"))
        elif kind == "reasoning":
            text = decode_reasoning(item)
            if text:
                self.reasoning.append(text)
        else:
            name, call_id, namespace = item.get("name"), item.get("call_id"), item.get("namespace")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise InvalidRequestError(f"{where}: a {kind} needs 'name' and 'call_id'")
            if kind == "function_call":
                arguments = item.get("arguments")
                if not isinstance(arguments, str):
                    raise InvalidRequestError(f"{where}: 'arguments' must be a string")
            else:  # a freeform call, as the engine wrote it (json.dumps, as vLLM's tool parsers do)
                arguments = json.dumps({"input": str(item.get("input", ""))}, ensure_ascii=False)
            chat_name = chat_names.get((namespace, name)) or _chat_name(name, namespace)
            self.calls.append({"id": call_id, "type": "function", "function": {"name": chat_name, "arguments": arguments}})

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(self.text) if self.text else None}
        if self.calls:
            msg["tool_calls"] = self.calls
        if self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        return msg


def translate_input(body: dict[str, Any], tool_names: dict[str, ToolName]) -> list[dict[str, Any]]:
    """`instructions` and `input` -> chat messages (a pure function: replays translate alike)."""
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    elif items is None:
        items = []
    elif not isinstance(items, list):
        raise InvalidRequestError("'input' must be a string or a list of items")
    chat_names = {(t.namespace, t.name): n for n, t in tool_names.items()}
    system: list[str] = []  # the leading instructions, sent as one system message
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        system.append(body["instructions"])
    elif body.get("instructions") not in (None, ""):
        raise InvalidRequestError("'instructions' must be a string")
    messages: list[dict[str, Any]] = []
    turn: _Assistant | None = None

    def flush() -> None:
        nonlocal turn
        if turn is not None:
            messages.append(turn.message())
            turn = None

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequestError(f"{where} must be an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        role = item.get("role") if kind == "message" else None
        if role in SYSTEM_ROLES and not messages and turn is None:
            system.append(_text_only(item.get("content"), where))
            continue
        if system and not messages:
            messages.append({"role": "system", "content": "\n\n".join(system)})
        if kind in ("reasoning", "function_call", "custom_tool_call") or role == "assistant":
            if turn is None or not turn.accepts(kind):
                flush()
                turn = _Assistant()
            turn.add(kind, item, where, chat_names)
            continue
        flush()
        if role in SYSTEM_ROLES:
            messages.append({"role": "system", "content": _text_only(item.get("content"), where)})
        elif role == "user":
            messages.append({"role": "user", "content": _chat_content(item.get("content"), where)})
        elif kind == "message":
            raise InvalidRequestError(f"{where}: unknown role {item.get('role')!r}")
        elif kind in ("function_call_output", "custom_tool_call_output"):
            if not isinstance(item.get("call_id"), str):
                raise InvalidRequestError(f"{where}: a {kind} needs 'call_id'")
            output = item.get("output")
            content = output if isinstance(output, str) else _chat_content(output, where)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
        elif kind == "item_reference":
            raise InvalidRequestError(f"{where}: item_reference needs stored responses and this proxy stores none; send the items themselves")
        else:
            raise InvalidRequestError(f"{where}: input items of type {kind!r} are not supported by this proxy")
    flush()
    if system and not messages:
        messages.append({"role": "system", "content": "\n\n".join(system)})
    return messages


def chat_tool_choice(choice: Any, tool_names: dict[str, ToolName]) -> Any:
    """The request's `tool_choice` for the engine (a named tool by its chat function name), or None."""
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom") and choice.get("name"):
        wanted = (choice.get("namespace"), choice["name"])
        name = next((n for n, t in tool_names.items() if (t.namespace, t.name) == wanted), choice["name"])
        return {"type": "function", "function": {"name": name}}
    return choice if choice in ("auto", "none", "required") else None


def chat_response_format(text: Any) -> dict[str, Any] | None:
    """The request's `text.format` (a JSON schema or JSON object) as a chat `response_format`, or None."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    return None
