"""SmolLM2's chat template with tools, the messages prepared for it, and the tool calls read back.

The GGUF carries SmolLM2's plain ChatML template, which knows nothing of tools (and fails on an
assistant message whose content is null). The server renders with `CHAT_TEMPLATE` instead: the
same ChatML, byte for byte the GGUF template's output for a conversation without tools, plus
Qwen2.5-style tool rendering (tools in the system message, assistant tool calls as `<tool_call>`
blocks, tool results as `<tool_response>` in a user turn). Messages are prepared as vLLM does
before rendering (`prepare_messages`: content parts joined with newlines, null content as "",
tool-call argument strings parsed to objects); answers are read back as vLLM's `hermes` tool
parser does (`parse_tool_calls`).
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from typing import Any

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# SmolLM2's ChatML (as in the GGUF) plus tools, Qwen2.5 style. Without tools it renders exactly
# what the GGUF's template renders (a test checks this).
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- '" + DEFAULT_SYSTEM + "' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif not messages or messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] == 'system' and tools %}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
    "{%- for tool_call in message['tool_calls'] %}"
    "{%- if tool_call.get('function') is not none %}{%- set tool_call = tool_call['function'] %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call['name'] + '\", \"arguments\": ' }}"
    "{{- tool_call['arguments'] | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


class RequestError(ValueError):
    """A request the server refuses (answered 400, as vLLM would)."""


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):  # content parts, joined as vLLM's "string" content format does
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    return str(content)


def prepare_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What vLLM hands the chat template: string content, tool-call arguments as objects."""
    out = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise RequestError(f"each message needs a role: {str(m)[:200]}")
        msg = copy.deepcopy(m)
        msg["content"] = _text_of(m.get("content"))
        if msg["role"] == "assistant" and "tool_calls" in msg:
            calls = msg.get("tool_calls")
            if isinstance(calls, list) and not calls:
                msg.pop("tool_calls")
            for call in calls or []:
                fn = call.get("function") or {}
                args = fn.get("arguments")
                if not args:
                    fn["arguments"] = {}
                elif not isinstance(args, (dict, list)):
                    try:
                        fn["arguments"] = json.loads(args)
                    except ValueError as e:
                        raise RequestError(f"tool call arguments are not JSON: {e}") from e
        out.append(msg)
    return out


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """vLLM's hermes parser: (content before the first <tool_call>, calls), or (text, []) when
    there is no call or one does not parse."""
    if TOOL_CALL_START not in text:
        return text, []
    try:
        calls = []
        for closed, open_ in TOOL_CALL_RE.findall(text):
            obj = json.loads(closed or open_)
            calls.append(
                {
                    "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
                    "type": "function",
                    "function": {"name": obj["name"], "arguments": json.dumps(obj["arguments"], ensure_ascii=False)},
                }
            )
    except (ValueError, KeyError, TypeError):
        return text, []
    content = text[: text.find(TOOL_CALL_START)]
    return (content or None), calls


def held_back(text: str) -> int:
    """How many trailing characters could start a <tool_call> tag (kept back while streaming)."""
    for k in range(min(len(TOOL_CALL_START) - 1, len(text)), 0, -1):
        if TOOL_CALL_START.startswith(text[-k:]):
            return k
    return 0
