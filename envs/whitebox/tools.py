"""The white-box tools at work: ToolBox binds them to one rollout's sandbox and answers every call
the model makes with text.

A bad call (unknown tool, arguments that are not a JSON object, a missing or mistyped argument, a
path outside the workspace) comes back as an error message the model can act on, never as an
exception. The schema the model is shown is schema.py's; the file tools' blocking work on the
host's copy of the workspace is files.py's. Names imported from here before the split (TOOL_SPECS,
SYSTEM_PROMPT, check_arguments, ...) still are.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, TypeVar

from harness_env.core.errors import HarnessEnvError, InvalidRequestError
from harness_env.core.sandbox import safefs
from harness_env.core.sandbox.base import ExecResult
from harness_env.core.sandbox.local import LocalSandbox
from harness_env.envs.whitebox.files import (
    EDIT_MAX_BYTES,
    MAX_GLOB_DEPTH,
    MAX_LIST_ENTRIES,
    MAX_SCAN_ENTRIES,
    READ_SCAN_BYTES,
    list_dir,
    read_for_edit,
    read_page,
    write_file,
)
from harness_env.envs.whitebox.schema import SYSTEM_PROMPT, TOOL_NAMES, TOOL_SPECS, ToolError, ToolReply, check_arguments

__all__ = [
    "EDIT_MAX_BYTES",
    "FS_TIMEOUT_S",
    "MAX_GLOB_DEPTH",
    "MAX_LIST_ENTRIES",
    "MAX_SCAN_ENTRIES",
    "READ_SCAN_BYTES",
    "SYSTEM_PROMPT",
    "TOOL_NAMES",
    "TOOL_SPECS",
    "ToolBox",
    "ToolError",
    "ToolLimits",
    "ToolReply",
    "check_arguments",
]

T = TypeVar("T")

FS_TIMEOUT_S = 30.0  # a file tool's work, at most (the call's own timeout may be shorter)


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
                f"harness_config for whitebox has unknown keys {unknown}; it takes tool_timeout_s (seconds per command) and max_tool_output_bytes"
            )
        try:
            limits = cls(
                timeout_s=float(cfg.get("tool_timeout_s", cls.timeout_s)), max_output_bytes=int(cfg.get("max_tool_output_bytes", cls.max_output_bytes))
            )
        except (TypeError, ValueError) as e:
            raise InvalidRequestError(f"harness_config for whitebox: tool_timeout_s and max_tool_output_bytes must be numbers ({e})") from e
        if not (0 < limits.timeout_s <= 3600 and 256 <= limits.max_output_bytes <= 1_000_000):
            raise InvalidRequestError("harness_config for whitebox: tool_timeout_s must be in (0, 3600] and max_tool_output_bytes in [256, 1000000]")
        return limits


@dataclass
class ToolBox:
    """The tools bound to one rollout's sandbox. `deadline` (monotonic) bounds every command.

    bash and grep run inside the sandbox (where links resolve within the sandbox's own view). The
    file tools (read, write, edit, ls, glob) run in this process on the host's copy of the
    workspace, where the agent's links would point at the host: so they walk every path one
    component at a time from the workspace without following any link (core/sandbox/safefs, files.py),
    touch regular files and directories only (a FIFO or device is never opened), read a bounded
    part of a file, and run off the event loop under a time bound."""

    sandbox: LocalSandbox
    limits: ToolLimits = field(default_factory=ToolLimits)
    deadline: float | None = None

    async def call(self, name: str, arguments: str) -> ToolReply:
        """Run the tool call `name(arguments)` exactly as the model sampled it (arguments: a JSON string)."""
        if name not in TOOL_NAMES:
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
        except HarnessEnvError as e:  # a path outside the workspace, a timed-out file operation
            return ToolReply(f"error: {e}", ok=False)
        except safefs.UnsafeEntry as e:
            return ToolReply(f"error: {_unsafe_message(name, e)}", ok=False)
        except OSError as e:
            where = f" ({args['path']})" if isinstance(args.get("path"), str) else ""
            return ToolReply(f"error: {e.strerror or e}{where}", ok=False)
        except ValueError as e:  # a NUL byte in a path, say
            return ToolReply(f"error: {e}", ok=False)

    # -- helpers ------------------------------------------------------------------------------
    def _timeout(self) -> float:
        if self.deadline is None:
            return self.limits.timeout_s
        return max(0.1, min(self.limits.timeout_s, self.deadline - time.monotonic()))

    def _listing(self, names: list[str], plus: str, what: str, hint: str) -> str:
        """The first names (at most MAX_LIST_ENTRIES, within the output bound), and how many more."""
        shown, used = [], 0
        for name in names[:MAX_LIST_ENTRIES]:
            used += len(name.encode()) + 1
            if used > self.limits.max_output_bytes - 100:
                break
            shown.append(name)
        if len(names) > len(shown) or plus:
            shown.append(f"[{len(names) - len(shown)}{plus} more {what}; {hint}]")
        return "\n".join(shown)

    @property
    def _root(self) -> str:
        return self.sandbox.workspace

    def _rel(self, path: str) -> str:
        """`path` (relative to the workspace, or absolute inside it) as a clean workspace-relative
        path ('' for the workspace itself). '..' is resolved by name: no link is looked at."""
        p = PurePosixPath(path)
        if p.is_absolute():
            ws = PurePosixPath(self._root)
            if p != ws and ws not in p.parents:
                raise ToolError(f"path {path!r} is outside sandbox workspace {ws}; use a path relative to the workspace")
            p = p.relative_to(ws)
        parts: list[str] = []
        for part in p.parts:
            if part == "..":
                if not parts:
                    raise ToolError(f"path {path!r} is outside sandbox workspace {self._root}; use a path relative to the workspace")
                parts.pop()
            elif part not in ("", "."):
                parts.append(part)
        return "/".join(parts)

    async def _fs(self, fn: Callable[..., T], *args: Any) -> T:
        """Blocking file work in a worker thread, given up after the call's time bound (each
        operation is also bounded in what it reads and scans, so its thread ends soon after)."""
        timeout = min(self._timeout(), FS_TIMEOUT_S)
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn, *args), timeout)
        except TimeoutError:
            raise ToolError(f"the file operation did not finish within {timeout:.0f}s; use bash for heavy work") from None

    async def _run(self, cmd: str) -> tuple[int | None, str]:
        timeout = self._timeout()
        r = await self.sandbox.exec(cmd, timeout=timeout, max_output=self.limits.max_output_bytes)
        return r.exit_code, self._command_output(r, timeout)

    def _command_output(self, r: ExecResult, timeout: float) -> str:
        """stdout then stderr, the tail kept within max_output_bytes; the model is told the real
        number of bytes cut (the sandbox already cut each stream's head: that counts too)."""
        out, err = _uncut(r.stdout, r.stdout_dropped), _uncut(r.stderr, r.stderr_dropped)
        text = out + (("\n" if out and not out.endswith("\n") else "") + err if err else "")
        data = text.encode("utf-8", errors="replace")
        over = max(0, len(data) - self.limits.max_output_bytes)
        cut = r.stdout_dropped + r.stderr_dropped + over
        text = data[over:].decode("utf-8", errors="replace")
        if cut:
            text = f"[... {cut} bytes cut ...]\n" + text
        if r.timed_out:
            text += f"\n[timed out after {timeout:.0f}s; the command was killed]"
        return text

    # -- the tools ----------------------------------------------------------------------------
    async def _bash(self, command: str) -> ToolReply:
        code, out = await self._run(command)
        out = out.rstrip("\n")
        return ToolReply(f"{out}\n[exit code {code}]" if out else f"[exit code {code}]", ok=code == 0)

    async def _read(self, path: str, offset: int = 1, limit: int = 2000) -> ToolReply:
        rel = self._rel(path)
        page = await self._fs(read_page, self._root, rel, max(1, offset), max(1, limit), self.limits.max_output_bytes)
        return page.reply(path)

    async def _write(self, path: str, content: str) -> ToolReply:
        data = content.encode()
        await self._fs(write_file, self._root, self._rel(path), data, True)
        return ToolReply(f"wrote {len(data)} bytes to {path}")

    async def _edit(self, path: str, old_string: str, new_string: str, replace_all: bool = False) -> ToolReply:
        rel = self._rel(path)
        data = await self._fs(read_for_edit, self._root, rel, path)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return ToolReply(f"error: {path} is not UTF-8 text; edit changes text files only (use bash for others)", ok=False)
        count = text.count(old_string) if old_string else 0
        if count == 0:
            return ToolReply(f"error: old_string was not found in {path}; read the file and copy the text exactly", ok=False)
        if count > 1 and not replace_all:
            return ToolReply(f"error: old_string occurs {count} times in {path}; give more context or set replace_all", ok=False)
        new = text.replace(old_string, new_string).encode()
        await self._fs(write_file, self._root, rel, new, False)
        return ToolReply(f"replaced {count if replace_all else 1} occurrence(s) in {path}")

    async def _ls(self, path: str = ".") -> ToolReply:
        rel = self._rel(path)
        listing = await self._fs(list_dir, self._root, rel)
        entries, more = listing
        if not entries:
            return ToolReply(f"{path} is empty")
        return ToolReply(self._listing(entries, "+" if more else "", "entries", "use bash (ls | head, find) to page through them"))

    async def _grep(self, pattern: str, path: str = ".", include: str = "") -> ToolReply:
        where = self._rel(path) or "."  # refuses paths outside the workspace before running anything
        inc = f" --include={shlex.quote(include)}" if include else ""
        # -D skip: FIFOs and devices are not read (grep runs in the sandbox, under the timeout)
        code, out = await self._run(f"grep -rnIE -D skip{inc} -e {shlex.quote(pattern)} -- {shlex.quote(where)}")
        if code == 1 and not out.strip():
            return ToolReply("no matches")
        return ToolReply(out.rstrip("\n"), ok=code == 0)

    async def _glob(self, pattern: str) -> ToolReply:
        parts = PurePosixPath(pattern).parts
        if pattern.startswith("/") or ".." in parts:
            return ToolReply("error: the pattern must be relative to the workspace, without ..", ok=False)
        timeout = min(self._timeout(), FS_TIMEOUT_S)
        found = await self._fs(
            lambda: safefs.glob(self._root, pattern, max_entries=MAX_SCAN_ENTRIES, max_depth=MAX_GLOB_DEPTH, deadline=time.monotonic() + timeout * 0.8)
        )
        body = self._listing(found.matches, "", "matches", "narrow the pattern") if found.matches else ""
        if found.stopped:
            why = {
                "entries": f"after looking at {MAX_SCAN_ENTRIES} entries",
                "time": "when its time was up",
                "depth": f"at depth {MAX_GLOB_DEPTH}",
                "matches": "after too many matches",
            }[found.stopped]
            body += f"\n[the search stopped {why}; the list may be incomplete: narrow the pattern or use bash (find)]"
        return ToolReply(body.strip("\n") or "no files match")

    async def _submit(self, answer: str) -> ToolReply:
        return ToolReply("submitted", submitted=answer)


def _uncut(text: str, dropped: int) -> str:
    """A stream's text without the sandbox's own '[... N bytes cut ...]' line (counted separately)."""
    marker = f"[... {dropped} bytes cut ...]\n"
    return text[len(marker) :] if dropped and text.startswith(marker) else text


def _unsafe_message(tool: str, e: safefs.UnsafeEntry) -> str:
    q = shlex.quote(e.rel)
    if e.kind == "a symbolic link":
        return f"{e.rel} is a symbolic link; the file tools do not follow links (look at it with bash, e.g. ls -l {q})"
    if e.kind == "a directory":
        return f"{e.rel} is a directory; use ls" + (" (or write to a file inside it)" if tool in ("write", "edit") else "")
    if e.wanted == "a directory":
        return f"{e.rel} is {e.kind}, not a directory" + ("; use read" if e.kind == "a regular file" and tool == "ls" else "")
    return f"{e.rel} is not a regular file ({e.kind[2:] if e.kind.startswith('a ') else e.kind}); tools read and write regular files only"
