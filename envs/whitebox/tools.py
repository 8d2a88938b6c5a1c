"""The white-box tool set: its schema (what the model is shown) and its implementation (what runs
in the rollout's sandbox).

The schema is data, written out once here; the loop (loop.py) sends it, and the TRL environment
(trl_env.py) exposes the same tools as methods whose docstrings give the same schema. Every tool
returns text for the model: a bad call (unknown tool, arguments that are not a JSON object, a
missing or mistyped argument, a path outside the workspace) comes back as an error message the model
can act on, never as an exception.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness_env.core.errors import HarnessEnvError, InvalidRequestError
from harness_env.core.sandbox.base import TailBuffer
from harness_env.core.sandbox.local import LocalSandbox

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
    _fn("bash", "Run a shell command (bash -c) in the workspace and return its output and exit code.",
        {"command": _s("The command line to run.")}, ["command"]),
    _fn("read", "Read a text file, with line numbers.",
        {"path": _s("The file to read."),
         "offset": _i("The first line to return (1-based)."),
         "limit": _i("How many lines to return at most.")}, ["path"]),
    _fn("write", "Create or overwrite a file with the given content (parent directories are created).",
        {"path": _s("The file to write."), "content": _s("The whole new content of the file.")}, ["path", "content"]),
    _fn("edit", "Replace an exact piece of text in a file. old_string must occur exactly once unless replace_all is true.",
        {"path": _s("The file to edit."),
         "old_string": _s("The exact text to replace."),
         "new_string": _s("The text to put in its place."),
         "replace_all": {"type": "boolean", "description": "Replace every occurrence instead of exactly one."}},
        ["path", "old_string", "new_string"]),
    _fn("ls", "List a directory (directories end in /).", {"path": _s("The directory to list.")}, []),
    _fn("grep", "Search file contents for a regular expression (extended syntax); returns file:line:text matches.",
        {"pattern": _s("The regular expression to search for."),
         "path": _s("The file or directory to search."),
         "include": _s("Only search files whose name matches this glob, e.g. *.py.")}, ["pattern"]),
    _fn("glob", "List the files whose paths match a glob pattern, e.g. **/*.py.",
        {"pattern": _s("The glob pattern, relative to the workspace.")}, ["pattern"]),
    _fn("submit", "Finish the task and hand in the answer. Call it once, when the work is done.",
        {"answer": _s("A short summary of what was done, or the answer the task asks for.")}, ["answer"]),
]
TOOL_NAMES = tuple(spec["function"]["name"] for spec in TOOL_SPECS)
_PARAMS = {spec["function"]["name"]: spec["function"]["parameters"] for spec in TOOL_SPECS}
_JSON_TYPES: dict[str, type | tuple[type, ...]] = {"string": str, "integer": int, "boolean": bool}

MAX_LIST_ENTRIES = 500


@dataclass(frozen=True)
class ToolLimits:
    timeout_s: float = 60.0  # per bash/grep call
    max_output_bytes: int = 16 * 1024  # the tail is kept; the model is told how much was cut

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ToolLimits:
        """Read the white-box keys of a request's `harness_config`; anything else is an error."""
        unknown = sorted(set(cfg) - {"tool_timeout_s", "max_tool_output_bytes"})
        if unknown:
            raise InvalidRequestError(
                f"harness_config for whitebox has unknown keys {unknown}; it takes tool_timeout_s (seconds per "
                "command) and max_tool_output_bytes"
            )
        try:
            limits = cls(timeout_s=float(cfg.get("tool_timeout_s", cls.timeout_s)),
                         max_output_bytes=int(cfg.get("max_tool_output_bytes", cls.max_output_bytes)))
        except (TypeError, ValueError) as e:
            raise InvalidRequestError(f"harness_config for whitebox: tool_timeout_s and max_tool_output_bytes must be numbers ({e})") from e
        if not (0 < limits.timeout_s <= 3600 and 256 <= limits.max_output_bytes <= 1_000_000):
            raise InvalidRequestError("harness_config for whitebox: tool_timeout_s must be in (0, 3600] and max_tool_output_bytes in [256, 1000000]")
        return limits


@dataclass
class ToolReply:
    content: str
    ok: bool = True
    submitted: str | None = None  # the answer, when this was submit


@dataclass
class ToolBox:
    """The tools bound to one rollout's sandbox. `deadline` (monotonic) bounds every command."""

    sandbox: LocalSandbox
    limits: ToolLimits = field(default_factory=ToolLimits)
    deadline: float | None = None

    async def call(self, name: str, arguments: str) -> ToolReply:
        """Run the tool call `name(arguments)` exactly as the model sampled it (arguments: a JSON string)."""
        if name not in _PARAMS:
            return ToolReply(f"error: there is no tool {name!r}; the tools are: {', '.join(TOOL_NAMES)}", ok=False)
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as e:
            return ToolReply(f"error: the arguments of {name} are not valid JSON ({e.msg} at position {e.pos}); send a JSON object", ok=False)
        problem = check_arguments(name, args)
        if problem:
            return ToolReply(f"error: {problem}", ok=False)
        try:
            return await getattr(self, "_" + name)(**args)
        except HarnessEnvError as e:  # a path outside the sandbox, say
            return ToolReply(f"error: {e}", ok=False)
        except OSError as e:
            where = f" ({args['path']})" if isinstance(args.get("path"), str) else ""
            return ToolReply(f"error: {e.strerror or e}{where}", ok=False)

    # -- helpers ------------------------------------------------------------------------------
    def _timeout(self) -> float:
        if self.deadline is None:
            return self.limits.timeout_s
        return max(0.1, min(self.limits.timeout_s, self.deadline - time.monotonic()))

    def _bounded(self, text: str) -> str:
        buf = TailBuffer(self.limits.max_output_bytes)
        buf.feed(text.encode())
        return buf.text()

    def _path(self, path: str) -> Path:
        return self.sandbox.resolve(path)

    async def _run(self, cmd: str) -> tuple[int | None, str]:
        timeout = self._timeout()
        r = await self.sandbox.exec(cmd, timeout=timeout, max_output=self.limits.max_output_bytes)
        out = r.stdout + (("\n" if r.stdout and not r.stdout.endswith("\n") else "") + r.stderr if r.stderr else "")
        if r.timed_out:
            out += f"\n[timed out after {timeout:.0f}s; the command was killed]"
        return r.exit_code, self._bounded(out)

    # -- the tools ----------------------------------------------------------------------------
    async def _bash(self, command: str) -> ToolReply:
        code, out = await self._run(command)
        out = out.rstrip("\n")
        return ToolReply(f"{out}\n[exit code {code}]" if out else f"[exit code {code}]", ok=code == 0)

    async def _read(self, path: str, offset: int = 1, limit: int = 2000) -> ToolReply:
        full = self._path(path)
        if full.is_dir():
            return ToolReply(f"error: {path} is a directory; use ls", ok=False)
        data = await asyncio.to_thread(full.read_bytes)
        if b"\0" in data[:8192]:
            return ToolReply(f"error: {path} is a binary file ({len(data)} bytes)", ok=False)
        lines = data.decode("utf-8", errors="replace").splitlines()
        start = max(1, offset)
        chunk = lines[start - 1 : start - 1 + max(1, limit)]
        body = "\n".join(f"{n:6d}\t{line}" for n, line in enumerate(chunk, start))
        more = len(lines) - (start - 1 + len(chunk))
        if more > 0:
            body += f"\n[{more} more lines; read again with offset={start + len(chunk)}]"
        return ToolReply(self._bounded(body) if body else f"{path} is empty")

    async def _write(self, path: str, content: str) -> ToolReply:
        self.sandbox.write_file(path, content)
        return ToolReply(f"wrote {len(content.encode())} bytes to {path}")

    async def _edit(self, path: str, old_string: str, new_string: str, replace_all: bool = False) -> ToolReply:
        full = self._path(path)
        text = (await asyncio.to_thread(full.read_bytes)).decode("utf-8", errors="replace")
        count = text.count(old_string) if old_string else 0
        if count == 0:
            return ToolReply(f"error: old_string was not found in {path}; read the file and copy the text exactly", ok=False)
        if count > 1 and not replace_all:
            return ToolReply(f"error: old_string occurs {count} times in {path}; give more context or set replace_all", ok=False)
        self.sandbox.write_file(path, text.replace(old_string, new_string))
        return ToolReply(f"replaced {count if replace_all else 1} occurrence(s) in {path}")

    async def _ls(self, path: str = ".") -> ToolReply:
        full = self._path(path)
        entries = sorted(p.name + ("/" if p.is_dir() else "") for p in full.iterdir())
        cut = len(entries) - MAX_LIST_ENTRIES
        body = "\n".join(entries[:MAX_LIST_ENTRIES]) + (f"\n[{cut} more entries]" if cut > 0 else "")
        return ToolReply(self._bounded(body) if entries else f"{path} is empty")

    async def _grep(self, pattern: str, path: str = ".", include: str = "") -> ToolReply:
        self._path(path)  # refuse paths outside the sandbox before running anything
        inc = f" --include={shlex.quote(include)}" if include else ""
        code, out = await self._run(f"grep -rnIE{inc} -e {shlex.quote(pattern)} -- {shlex.quote(path)}")
        if code == 1 and not out.strip():
            return ToolReply("no matches")
        return ToolReply(out.rstrip("\n"), ok=code == 0)

    async def _glob(self, pattern: str) -> ToolReply:
        root = Path(self.sandbox.workspace)
        if pattern.startswith("/") or ".." in Path(pattern).parts:
            return ToolReply("error: the pattern must be relative to the workspace, without ..", ok=False)
        matches = await asyncio.to_thread(lambda: sorted(str(p.relative_to(root)) for p in root.glob(pattern)))
        cut = len(matches) - MAX_LIST_ENTRIES
        body = "\n".join(matches[:MAX_LIST_ENTRIES]) + (f"\n[{cut} more matches]" if cut > 0 else "")
        return ToolReply(self._bounded(body) if matches else "no files match")

    async def _submit(self, answer: str) -> ToolReply:
        return ToolReply("submitted", submitted=answer)


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
    return None
