"""What the content of a model call may hold: text, and media only inline.

A content part that names a remote resource (an `image_url` of https://..., a Gemini `fileUri`, an
Anthropic `{"source": {"type": "url"}}`, an uploaded `file_id`) makes whoever answers the call
fetch it: vLLM downloads media URLs itself, and a hosted API fetches them, or reads the operator's
stored files, with the operator's key. The agent writes these requests, so a URL there would take
data out of a `proxy_only` sandbox, or make the trainer's host or the operator's account reach
anything. So:
- `checked_messages`: the engine's chat-completions messages, every content part rebuilt from an
  allow-list (text; image, audio, video or file only as a `data:` URL or base64), anything else a
  400. Every dialect converges on this body, so this one check covers every translated call.
- `remote_reference`: for a body passed through untranslated (core/capture/passthrough.py), the
  first value under a key that names a remote resource, anywhere in the body.
"""

from __future__ import annotations

from typing import Any

from harness_env.core.errors import InvalidRequestError

TEXT_PARTS = frozenset({"text", "refusal"})
URL_PARTS = frozenset({"image_url", "audio_url", "video_url"})  # {"type": T, T: {"url": ...} or "..."}
INLINE = "send the data inline: a data: URL or base64"
# Keys whose string value names something to fetch or a stored file, in any dialect's native body.
REMOTE_KEYS = frozenset(
    {"url", "uri", "image_url", "audio_url", "video_url", "file_url", "fileUri", "file_uri", "file_id", "fileId", "server_url", "mcp_servers"}
)
STORED_KEYS = frozenset({"file_id", "fileId"})  # any value names a file of the upstream's account
# Not searched: what a tool call carried or a function returned (a `fetch(url)` call in the history
# is the harness's own tool, run in the sandbox), and JSON schemas (a property may be named `url`).
OPAQUE_KEYS = frozenset(
    {
        "args",
        "response",
        "arguments",
        "input_schema",
        "parameters",
        "parametersJsonSchema",
        "parameters_json_schema",
        "responseSchema",
        "response_schema",
        "responseJsonSchema",
        "schema",
    }
)
CALL_BLOCKS = frozenset({"tool_use", "server_tool_use"})  # Anthropic blocks whose `input` is a call's arguments


def is_inline(value: Any) -> bool:
    """A `data:` URL, or a base64 payload (which holds no `:`, so names no scheme)."""
    return isinstance(value, str) and (value[:5].lower() == "data:" or ":" not in value)


def _scheme(value: Any) -> str:
    text = value if isinstance(value, str) else ""
    return text.split(":", 1)[0][:16] if ":" in text else "none"


def _refuse(where: str, what: str, hint: str) -> InvalidRequestError:
    return InvalidRequestError(f"{where}{what}; the engine is never made to fetch anything: {INLINE}{hint}")


def _media(part: dict[str, Any], kind: str, where: str, hint: str) -> dict[str, Any]:
    value = part.get(kind)
    if kind in URL_PARTS:
        spec = value if isinstance(value, dict) else {"url": value}
        if not is_inline(spec.get("url")) or not str(spec.get("url", "")).strip():
            raise _refuse(where, f"a {kind} part names a remote URL (scheme {_scheme(spec.get('url'))!r})", hint)
        kept = {"url": spec["url"]}
        if isinstance(spec.get("detail"), str):
            kept["detail"] = spec["detail"]
        return {"type": kind, kind: kept}
    spec = value if isinstance(value, dict) else {}
    if kind == "input_audio":
        if not is_inline(spec.get("data")):
            raise _refuse(where, "an input_audio part's data is not base64", hint)
        return {"type": kind, kind: {"data": spec["data"], "format": str(spec.get("format", "wav"))}}
    # kind == "file": only its bytes; a file_id is a file stored in the upstream's account
    if not is_inline(spec.get("file_data")) or "file_id" in spec:
        raise _refuse(where, "a file part must carry file_data (a file_id or URL names a stored or remote file)", hint)
    kept = {"file_data": spec["file_data"]}
    if isinstance(spec.get("filename"), str):
        kept["filename"] = spec["filename"]
    return {"type": kind, kind: kept}


def checked_part(part: Any, where: str, hint: str = "") -> dict[str, Any]:
    """One chat content part rebuilt from the allow-list, or InvalidRequestError."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in TEXT_PARTS and isinstance(part.get(kind), str):
        return {"type": kind, kind: part[kind]}
    if kind in URL_PARTS or kind in ("input_audio", "file"):
        return _media(part, kind, where, hint)
    raise InvalidRequestError(f"{where}a content part must be text, or an image, audio, video or file sent inline, not {str(kind)[:40]!r}")


def checked_messages(messages: list[Any], where: str = "", hint: str = "") -> list[Any]:
    """`messages` with every list content's parts rebuilt by `checked_part` (string content as is)."""
    out = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            message = {**message, "content": [checked_part(p, f"{where}messages[{i}].content[{j}]: ", hint) for j, p in enumerate(content)]}
        out.append(message)
    return out


def remote_reference(value: Any, path: str = "") -> str | None:
    """Where in a native body a remote resource is named (a REMOTE_KEYS key holding a string that is
    not inline data, a stored file's id, or a list or object under `mcp_servers`), or None. Iterative: bodies are deep."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, dict):
            for key, item in node.items():
                if key in OPAQUE_KEYS or key == "input" and node.get("type") in CALL_BLOCKS:
                    continue
                here = f"{at}.{key}" if at else str(key)
                if key in REMOTE_KEYS and (isinstance(item, str) and (key in STORED_KEYS or not is_inline(item)) or key == "mcp_servers" and item):
                    return here[:200]
                if isinstance(item, (dict, list)):
                    stack.append((item, here))
        elif isinstance(node, list):
            stack.extend((item, f"{at}[{i}]") for i, item in enumerate(node))
    return None
