"""The white-box tool set as the model sees it: the system prompt, the tools' schema, what a call's
arguments must be, and what a call gives back.

The schema is data, written out once here; the loop (loop.py) sends it, and the TRL environment
(trl_env.py) exposes the same tools as methods whose docstrings give the same schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness_env.core.errors import HarnessEnvError

SYSTEM_PROMPT = """You are a coding agent working in a sandboxed Linux workspace (your current directory).
Use the tools to inspect and change files and to run commands. Paths are relative to the workspace.
Work step by step: look before you change, run the tests or checks you have, then fix what fails.
When the task is done, call submit with a short summary of what you did (or the answer, if the task asks a question).
"""


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, **({"required": required} if required else {})},
        },
    }


def _s(description: str) -> dict[str, str]:
    return {"type": "string", "description": description}


def _i(description: str) -> dict[str, str]:
    return {"type": "integer", "description": description}


TOOL_SPECS: list[dict[str, Any]] = [
    _fn(
        "bash", "Run a shell command (bash -c) in the workspace and return its output and exit code.", {"command": _s("The command line to run.")}, ["command"]
    ),
    _fn(
        "read",
        "Read a text file, with line numbers.",
        {"path": _s("The file to read."), "offset": _i("The first line to return (1-based)."), "limit": _i("How many lines to return at most.")},
        ["path"],
    ),
    _fn(
        "write",
        "Create or overwrite a file with the given content (parent directories are created).",
        {"path": _s("The file to write."), "content": _s("The whole new content of the file.")},
        ["path", "content"],
    ),
    _fn(
        "edit",
        "Replace an exact piece of text in a file. old_string must occur exactly once unless replace_all is true.",
        {
            "path": _s("The file to edit."),
            "old_string": _s("The exact text to replace."),
            "new_string": _s("The text to put in its place."),
            "replace_all": {"type": "boolean", "description": "Replace every occurrence instead of exactly one."},
        },
        ["path", "old_string", "new_string"],
    ),
    _fn("ls", "List a directory (directories end in /).", {"path": _s("The directory to list.")}, []),
    _fn(
        "grep",
        "Search file contents for a regular expression (extended syntax); returns file:line:text matches.",
        {
            "pattern": _s("The regular expression to search for."),
            "path": _s("The file or directory to search."),
            "include": _s("Only search files whose name matches this glob, e.g. *.py."),
        },
        ["pattern"],
    ),
    _fn("glob", "List the files whose paths match a glob pattern, e.g. **/*.py.", {"pattern": _s("The glob pattern, relative to the workspace.")}, ["pattern"]),
    _fn(
        "submit",
        "Finish the task and hand in the answer. Call it once, when the work is done.",
        {"answer": _s("A short summary of what was done, or the answer the task asks for.")},
        ["answer"],
    ),
]
TOOL_NAMES = tuple(spec["function"]["name"] for spec in TOOL_SPECS)
_PARAMS = {spec["function"]["name"]: spec["function"]["parameters"] for spec in TOOL_SPECS}
_JSON_TYPES: dict[str, type | tuple[type, ...]] = {"string": str, "integer": int, "boolean": bool}


class ToolError(HarnessEnvError):
    """A tool call the model can correct: the message says what was wrong and what to do."""


@dataclass
class ToolReply:
    content: str
    ok: bool = True
    submitted: str | None = None  # the answer, when this was submit


def check_arguments(name: str, args: Any) -> str | None:
    """What is wrong with `args` for tool `name`, in words for the model; None when they are fine."""
    params = _PARAMS[name]
    if not isinstance(args, dict):
        return f"the arguments of {name} must be a JSON object, got {type(args).__name__}"
    props = params["properties"]
    missing = [p for p in params.get("required", []) if p not in args]
    if missing:
        return f"{name} needs the argument(s) {', '.join(missing)}"
    unknown = sorted(set(args) - set(props))
    if unknown:
        return f"{name} has no argument(s) {', '.join(unknown)}; it takes {', '.join(props)}"
    for key, value in args.items():
        want = _JSON_TYPES[props[key]["type"]]
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            return f"argument {key} of {name} must be a {props[key]['type']}, got {type(value).__name__}"
        if isinstance(value, str):
            try:
                value.encode()
            except UnicodeEncodeError as e:
                return f"argument {key} of {name} has a lone surrogate ({value[e.start]!a}) at position {e.start}; send valid Unicode text"
        if key == "path" and "\0" in value:
            return f"argument path of {name} has a NUL character; send the file's name as it is"
    return None
