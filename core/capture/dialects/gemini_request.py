"""Gemini API requests translated to chat completions (the pure half of dialects/gemini.py:
its module docstring says what is translated and how).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness_env.core.capture.dialects.base import ChatRequest
from harness_env.core.capture.dialects.chunks import user_turn
from harness_env.core.capture.dialects.responses_request import decode_reasoning
from harness_env.core.capture.dialects.sampled import SampledArguments
from harness_env.core.errors import InvalidRequestError

if TYPE_CHECKING:
    pass


@dataclass(slots=True)
class GeminiChatRequest(ChatRequest):
    count_only: bool = False  # countTokens: the engine is asked for the prompt's length only
    sse: bool = True  # streamGenerateContent with alt=sse; else the stream is one JSON array


def _call_id(call: dict[str, Any], seen: dict[str, int]) -> str:
    """The engine's id of a call or response: Gemini CLI's `<name>__` prefix taken off; without an
    id, one from the tool's name and how many calls (or responses) of it came before."""
    name = str(call.get("name") or "")
    given = call.get("id")
    if isinstance(given, str) and given:
        return given.removeprefix(f"{name}__")
    seen[name] = seen.get(name, 0) + 1
    return f"{name}_{seen[name]}"


def _response_text(response: Any) -> str:
    if isinstance(response, dict) and set(response) == {"output"} and isinstance(response["output"], str):
        return response["output"]
    return json.dumps(response, ensure_ascii=False)


def _media(data: dict[str, Any], where: str, url: str) -> dict[str, Any]:
    if not str(data.get("mimeType", "")).startswith("image/"):
        raise InvalidRequestError(f"{where}: only images are supported as inline or file data, not {data.get('mimeType')!r}")
    return {"type": "image_url", "image_url": {"url": url}}


def _user_part(part: dict[str, Any], where: str) -> dict[str, Any] | None:
    """A user-side part -> a chat content part (None: nothing for the model)."""
    if isinstance(part.get("text"), str):
        return None if part.get("thought") else {"type": "text", "text": part["text"]}
    if isinstance(part.get("inlineData"), dict):
        data = part["inlineData"]
        return _media(data, where, f"data:{data.get('mimeType')};base64,{data.get('data', '')}")
    if isinstance(part.get("fileData"), dict):
        return _media(part["fileData"], where, str(part["fileData"].get("fileUri", "")))
    kinds = [k for k in part if k not in ("thoughtSignature", "thought")]
    raise InvalidRequestError(f"{where}: parts of kind {', '.join(kinds) or 'empty'} are not supported by this proxy")


def _model(parts: list[dict[str, Any]], where: str, seen: dict[str, int], sampled: SampledArguments) -> dict[str, Any]:
    """A model content -> one chat assistant message, as the engine produced it (a call's args as
    the engine's own text when they are the object Gemini CLI was handed)."""
    text: list[str] = []
    thoughts: list[str] = []
    signed = ""  # the reasoning one of our thought signatures carries
    calls: list[dict[str, Any]] = []
    for j, part in enumerate(parts):
        if isinstance(part.get("thoughtSignature"), str) and not signed:
            signed = decode_reasoning({"encrypted_content": part["thoughtSignature"]})
        if isinstance(part.get("functionCall"), dict):
            call = part["functionCall"]
            if not isinstance(call.get("name"), str):
                raise InvalidRequestError(f"{where}.parts[{j}]: a functionCall needs 'name'")
            call_id = _call_id(call, seen)
            calls.append({"id": call_id, "type": "function", "function": {"name": call["name"], "arguments": sampled.text(call_id, call.get("args"))}})
        elif isinstance(part.get("text"), str):
            (thoughts if part.get("thought") else text).append(part["text"])
        elif set(part) - {"thoughtSignature"}:
            raise InvalidRequestError(f"{where}.parts[{j}]: model parts of kind {', '.join(part)} are not supported by this proxy")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text else None}
    if calls:
        msg["tool_calls"] = calls
    reasoning = "".join(thoughts) or signed
    if reasoning:
        msg["reasoning_content"] = reasoning
    return msg


def _user(parts: list[dict[str, Any]], where: str, seen: dict[str, int]) -> list[dict[str, Any]]:
    pieces = []
    for j, part in enumerate(parts):
        at = f"{where}.parts[{j}]"
        if isinstance(part.get("functionResponse"), dict):
            resp = part["functionResponse"]
            pieces.append({"role": "tool", "tool_call_id": _call_id(resp, seen), "content": _response_text(resp.get("response"))})
        else:
            piece = _user_part(part, at)
            if piece is not None:
                pieces.append(piece)
    return user_turn(pieces)


def _parts(content: Any, where: str) -> list[dict[str, Any]]:
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        raise InvalidRequestError(f"{where}: 'parts' must be a list of objects")
    return parts


def system_text(instruction: Any) -> str:
    if instruction is None:
        return ""
    if isinstance(instruction, str):
        return instruction
    return "\n".join(str(p.get("text", "")) for p in _parts(instruction, "systemInstruction") if isinstance(p.get("text"), str))


def translate_contents(body: dict[str, Any], sampled: SampledArguments) -> list[dict[str, Any]]:
    """`systemInstruction` and `contents` -> chat messages (a pure function of them and the
    session's sampled arguments: replays translate alike)."""
    contents = body.get("contents")
    if isinstance(contents, dict):
        contents = [contents]
    if not isinstance(contents, list):
        raise InvalidRequestError("'contents' must be a list of contents")
    out: list[dict[str, Any]] = []
    system = system_text(body.get("systemInstruction") or body.get("system_instruction"))
    if system:
        out.append({"role": "system", "content": system})
    calls_seen: dict[str, int] = {}
    responses_seen: dict[str, int] = {}
    for i, content in enumerate(contents):
        where = f"contents[{i}]"
        parts = _parts(content, where)
        role = content.get("role") or "user"
        if role == "model":
            out.append(_model(parts, where, calls_seen, sampled))
        elif role in ("user", "function"):
            out.extend(_user(parts, where, responses_seen))
        else:
            raise InvalidRequestError(f"{where}: unknown role {role!r}")
    return out


def json_schema(schema: Any) -> Any:
    """Gemini's schema (upper-case `type`s: "OBJECT", "STRING", ...) written as JSON Schema's."""
    if isinstance(schema, dict):
        return {k: (v.lower() if k == "type" and isinstance(v, str) else json_schema(v)) for k, v in schema.items()}
    if isinstance(schema, list):
        return [json_schema(v) for v in schema]
    return schema


def translate_tools(tools: Any) -> list[dict[str, Any]]:
    """Function declarations -> chat tools. Google's own tools (search, code execution, URL
    context, ...) have no chat form and are left out."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequestError("'tools' must be a list")
    out = []
    for tool in tools:
        declarations = tool.get("functionDeclarations") or tool.get("function_declarations") if isinstance(tool, dict) else None
        for decl in declarations or ():
            if not isinstance(decl, dict) or not isinstance(decl.get("name"), str):
                raise InvalidRequestError("each function declaration needs a 'name'")
            fn: dict[str, Any] = {"name": decl["name"]}
            if decl.get("description"):
                fn["description"] = decl["description"]
            params = decl.get("parametersJsonSchema") or json_schema(decl.get("parameters"))
            fn["parameters"] = params or {"type": "object", "properties": {}}
            out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(config: Any) -> Any:
    calling = config.get("functionCallingConfig") if isinstance(config, dict) else None
    if not isinstance(calling, dict):
        return None
    mode, allowed = str(calling.get("mode", "")).upper(), calling.get("allowedFunctionNames")
    if mode == "ANY" and isinstance(allowed, list) and len(allowed) == 1:
        return {"type": "function", "function": {"name": allowed[0]}}
    return {"AUTO": "auto", "VALIDATED": "auto", "ANY": "required", "NONE": "none"}.get(mode)


def chat_response_format(config: dict[str, Any]) -> dict[str, Any] | None:
    if config.get("responseMimeType") != "application/json":
        return None
    schema = config.get("responseJsonSchema") or json_schema(config.get("responseSchema"))
    if isinstance(schema, dict):
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    return {"type": "json_object"}
