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
import os
import shlex
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, TypeVar

from harness_env.core.errors import HarnessEnvError, InvalidRequestError
from harness_env.core.sandbox import safefs
from harness_env.core.sandbox.base import ExecResult
from harness_env.core.sandbox.local import LocalSandbox

T = TypeVar("T")

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

MAX_LIST_ENTRIES = 500  # names shown by ls and glob
MAX_SCAN_ENTRIES = 100_000  # directory entries ls and glob look at
MAX_GLOB_DEPTH = 64
READ_SCAN_BYTES = 8 * 1024 * 1024  # what one read call looks at in a file, at most
EDIT_MAX_BYTES = 8 * 1024 * 1024  # the largest file edit rewrites (it holds it in memory)
FS_TIMEOUT_S = 30.0  # a file tool's work, at most (the call's own timeout may be shorter)
_MIB = 1024 * 1024


class ToolError(HarnessEnvError):
    """A tool call the model can correct: the message says what was wrong and what to do."""


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
    """The tools bound to one rollout's sandbox. `deadline` (monotonic) bounds every command.

    bash and grep run inside the sandbox (where links resolve within the sandbox's own view). The
    file tools (read, write, edit, ls, glob) run in this process on the host's copy of the
    workspace, where the agent's links would point at the host: so they walk every path one
    component at a time from the workspace without following any link (core/sandbox/safefs.py),
    touch regular files and directories only (a FIFO or device is never opened), read a bounded
    part of a file, and run off the event loop under a time bound."""

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
        page = await self._fs(_read_page, self._root, rel, max(1, offset), max(1, limit), self.limits.max_output_bytes)
        return page.reply(path)

    async def _write(self, path: str, content: str) -> ToolReply:
        data = content.encode()
        await self._fs(_write_file, self._root, self._rel(path), data, True)
        return ToolReply(f"wrote {len(data)} bytes to {path}")

    async def _edit(self, path: str, old_string: str, new_string: str, replace_all: bool = False) -> ToolReply:
        rel = self._rel(path)
        data = await self._fs(_read_for_edit, self._root, rel, path)
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
        await self._fs(_write_file, self._root, rel, new, False)
        return ToolReply(f"replaced {count if replace_all else 1} occurrence(s) in {path}")

    async def _ls(self, path: str = ".") -> ToolReply:
        rel = self._rel(path)
        listing = await self._fs(_list_dir, self._root, rel)
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
            lambda: safefs.glob(self._root, pattern, max_entries=MAX_SCAN_ENTRIES, max_depth=MAX_GLOB_DEPTH,
                                deadline=time.monotonic() + timeout * 0.8)
        )
        body = self._listing(found.matches, "", "matches", "narrow the pattern") if found.matches else ""
        if found.stopped:
            why = {"entries": f"after looking at {MAX_SCAN_ENTRIES} entries", "time": "when its time was up",
                   "depth": f"at depth {MAX_GLOB_DEPTH}", "matches": "after too many matches"}[found.stopped]
            body += f"\n[the search stopped {why}; the list may be incomplete: narrow the pattern or use bash (find)]"
        return ToolReply(body.strip("\n") or "no files match")

    async def _submit(self, answer: str) -> ToolReply:
        return ToolReply("submitted", submitted=answer)


def _uncut(text: str, dropped: int) -> str:
    """A stream's text without the sandbox's own '[... N bytes cut ...]' line (counted separately)."""
    marker = f"[... {dropped} bytes cut ...]\n"
    return text[len(marker):] if dropped and text.startswith(marker) else text


def _unsafe_message(tool: str, e: safefs.UnsafeEntry) -> str:
    q = shlex.quote(e.rel)
    if e.kind == "a symbolic link":
        return f"{e.rel} is a symbolic link; the file tools do not follow links (look at it with bash, e.g. ls -l {q})"
    if e.kind == "a directory":
        return f"{e.rel} is a directory; use ls" + (" (or write to a file inside it)" if tool in ("write", "edit") else "")
    if e.wanted == "a directory":
        return f"{e.rel} is {e.kind}, not a directory" + ("; use read" if e.kind == "a regular file" and tool == "ls" else "")
    return f"{e.rel} is not a regular file ({e.kind[2:] if e.kind.startswith('a ') else e.kind}); tools read and write regular files only"


def _write_file(root: str, rel: str, data: bytes, make_parents: bool) -> None:
    """write_regular, with what it creates owned like the workspace: under bubblewrap the agent
    runs as an unprivileged user, who must be able to change the files the tools wrote."""
    owner = None
    if os.geteuid() == 0:
        st = safefs.stat_entry(root, "")
        owner = (st.st_uid, st.st_gid)
    safefs.write_regular(root, rel, data, make_parents=make_parents, owner=owner)


def _list_dir(root: str, rel: str) -> tuple[list[str], bool]:
    st = safefs.stat_entry(root, rel)
    if stat.S_ISLNK(st.st_mode):
        raise safefs.UnsafeEntry(rel, "a symbolic link", "a directory")
    entries, more = safefs.scan_dir(root, rel, max_entries=MAX_SCAN_ENTRIES)
    return [e.name + {"dir": "/", "link": "@"}.get(e.kind, "") for e in entries], more


def _read_for_edit(root: str, rel: str, shown: str) -> bytes:
    fd = safefs.open_regular(root, rel)
    try:
        size = os.fstat(fd).st_size
        if size > EDIT_MAX_BYTES:
            raise ToolError(f"{shown} is {size} bytes; edit rewrites files up to {EDIT_MAX_BYTES // _MIB} MiB (use bash, e.g. sed -i, for bigger ones)")
        chunks, left = [], EDIT_MAX_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, _MIB))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > EDIT_MAX_BYTES:  # it grew meanwhile
        raise ToolError(f"{shown} is over {EDIT_MAX_BYTES // _MIB} MiB; edit rewrites files up to that size (use bash, e.g. sed -i)")
    return data


@dataclass
class _Page:
    """What one read call found: at most `limit` lines from `offset`, within the output bound."""

    size: int
    offset: int
    lines: list[tuple[int, bytes, int]] = field(default_factory=list)  # (number, kept bytes, full length)
    binary: bool = False
    past_end: int | None = None  # the file's line count, when offset is past it
    not_reached: int | None = None  # the last line number seen, when offset lies past the scan bound
    more: int | None = None  # lines after the page, when counted to the end
    more_unknown: bool = False  # the scan bound ended before the end of the file
    open_line: bool = False  # the last line shown goes on past the scan bound

    def reply(self, path: str) -> ToolReply:
        if self.binary:
            return ToolReply(f"error: {path} is a binary file ({self.size} bytes)", ok=False)
        if self.not_reached is not None:
            q = shlex.quote(path)
            return ToolReply(
                f"error: line {self.offset} of {path} is past the first {READ_SCAN_BYTES // _MIB} MiB that read looks at "
                f"(it got to line {self.not_reached}; the file is {self.size} bytes); use bash for big files, "
                f"e.g. sed -n '{self.offset},+99p' {q}",
                ok=False,
            )
        if self.past_end is not None:
            if self.past_end == 0:
                return ToolReply(f"{path} is empty")
            return ToolReply(f"error: {path} has {self.past_end} lines; offset={self.offset} is past its end", ok=False)
        out = []
        for n, kept, full in self.lines:
            text = kept.rstrip(b"\r").decode("utf-8", errors="replace")
            if full > len(kept):
                total = f"over {full}" if self.open_line and n == self.lines[-1][0] else str(full)
                text += f" [... line cut: {total} bytes in all; see it with bash, e.g. cut -c or fold]"
            out.append(f"{n:6d}\t{text}")
        nxt = self.lines[-1][0] + 1 if self.lines else self.offset
        if self.more_unknown:
            out.append(f"[more lines follow: {path} is {self.size} bytes, more than one read looks at "
                       f"({READ_SCAN_BYTES // _MIB} MiB); read again with offset={nxt}, or use bash (head, tail, sed -n, grep -n)]")
        elif self.more:
            out.append(f"[{self.more} more lines; read again with offset={nxt}]")
        return ToolReply("\n".join(out))


def _read_page(root: str, rel: str, offset: int, limit: int, max_out: int) -> _Page:
    """Lines offset.. of a regular file, streamed: at most READ_SCAN_BYTES are read, in 1 MiB
    chunks, and at most max_out bytes of lines are kept, so a 2 GB file (or a 2 GB line) costs
    no more memory than a small one."""
    fd = safefs.open_regular(root, rel)
    try:
        size = os.fstat(fd).st_size
        page = _Page(size=size, offset=offset)
        if b"\0" in os.pread(fd, 8192, 0):
            page.binary = True
            return page
        _scan_lines(fd, page, limit, max_out)
        return page
    finally:
        os.close(fd)


def _scan_lines(fd: int, page: _Page, limit: int, max_out: int) -> None:
    lineno, scanned = 1, 0  # the number of the line being read
    phase = "skip" if page.offset > 1 else "collect"
    cur, cur_len = bytearray(), 0  # the line being collected: its kept head and its full length
    used = 0  # bytes of the page so far
    more, pending = 0, False  # in the count phase: newlines seen, bytes after the last one
    last = b""
    while scanned < READ_SCAN_BYTES:
        chunk = os.read(fd, min(_MIB, READ_SCAN_BYTES - scanned))
        if not chunk:
            break
        scanned += len(chunk)
        last = chunk[-1:]
        pos = 0
        while pos < len(chunk):
            if phase == "skip":
                need, here = page.offset - lineno, chunk.count(b"\n", pos)
                if here < need:
                    lineno += here
                    break
                for _ in range(need):
                    pos = chunk.index(b"\n", pos) + 1
                lineno, phase = page.offset, "collect"
            elif phase == "collect":
                nl = chunk.find(b"\n", pos)
                end = len(chunk) if nl < 0 else nl
                room = max_out - len(cur)
                if room > 0:
                    cur += chunk[pos : min(end, pos + room)]
                cur_len += end - pos
                if nl < 0:
                    break
                pos = nl + 1
                if page.lines and used + len(cur) + 8 > max_out:  # it does not fit: it starts the next page
                    more, phase = 1, "count"
                    pending = False
                    continue
                page.lines.append((lineno, bytes(cur), cur_len))
                used += min(len(cur), max_out) + 8
                lineno += 1
                cur, cur_len = bytearray(), 0
                if len(page.lines) >= limit or used >= max_out:
                    phase = "count"
            else:
                rest = chunk[pos:]
                more += rest.count(b"\n")
                pending = not rest.endswith(b"\n") if rest else pending
                break
    eof = scanned < READ_SCAN_BYTES or not os.read(fd, 1)
    if phase == "skip":
        if eof:
            page.past_end = lineno - 1 + (1 if last and last != b"\n" else 0)
        else:
            page.not_reached = lineno
    elif phase == "collect":
        if cur_len and (eof or not page.lines):  # the last line (no newline), or one huge line
            page.lines.append((lineno, bytes(cur), cur_len))
            page.open_line = not eof
        if not eof:
            page.more_unknown = True
        elif not page.lines:
            page.past_end = lineno - 1
    elif eof:
        page.more = more + (1 if pending else 0)
    else:
        page.more_unknown = True


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
