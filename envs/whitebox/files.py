"""The file tools' blocking work (read, write, edit, ls), on the host's copy of the workspace.

The agent's links would point at the host here, so every path goes through safefs: walked one
component at a time from the workspace without following a link, regular files and directories
only (a FIFO or device is never opened), and a bounded part of a file read. Run these off the
event loop (ToolBox runs them in a worker thread under a time bound).
"""

from __future__ import annotations

import os
import shlex
import stat
from dataclasses import dataclass, field

from harness_env.core.sandbox import safefs
from harness_env.envs.whitebox.schema import ToolError, ToolReply

MAX_LIST_ENTRIES = 500  # names shown by ls and glob
MAX_SCAN_ENTRIES = 100_000  # directory entries ls and glob look at
MAX_GLOB_DEPTH = 64
READ_SCAN_BYTES = 8 * 1024 * 1024  # what one read call looks at in a file, at most
EDIT_MAX_BYTES = 8 * 1024 * 1024  # the largest file edit rewrites (it holds it in memory)
_MIB = 1024 * 1024


def write_file(root: str, rel: str, data: bytes, make_parents: bool) -> None:
    """write_regular, with what it creates owned like the workspace: under bubblewrap the agent
    runs as an unprivileged user, who must be able to change the files the tools wrote."""
    owner = None
    if os.geteuid() == 0:
        st = safefs.stat_entry(root, "")
        owner = (st.st_uid, st.st_gid)
    safefs.write_regular(root, rel, data, make_parents=make_parents, owner=owner)


def list_dir(root: str, rel: str) -> tuple[list[str], bool]:
    """The names in directory root/rel (directories end in '/', links in '@'), and whether there were more."""
    st = safefs.stat_entry(root, rel)
    if stat.S_ISLNK(st.st_mode):
        raise safefs.UnsafeEntry(rel, "a symbolic link", "a directory")
    entries, more = safefs.scan_dir(root, rel, max_entries=MAX_SCAN_ENTRIES)
    return [e.name + {"dir": "/", "link": "@"}.get(e.kind, "") for e in entries], more


def read_for_edit(root: str, rel: str, shown: str) -> bytes:
    """The whole of regular file root/rel, when it is small enough for edit to rewrite (`shown`: its name for the model)."""
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
class Page:
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
            out.append(
                f"[more lines follow: {path} is {self.size} bytes, more than one read looks at "
                f"({READ_SCAN_BYTES // _MIB} MiB); read again with offset={nxt}, or use bash (head, tail, sed -n, grep -n)]"
            )
        elif self.more:
            out.append(f"[{self.more} more lines; read again with offset={nxt}]")
        return ToolReply("\n".join(out))


def read_page(root: str, rel: str, offset: int, limit: int, max_out: int) -> Page:
    """Lines offset.. of a regular file, streamed: at most READ_SCAN_BYTES are read, in 1 MiB
    chunks, and at most max_out bytes of lines are kept, so a 2 GB file (or a 2 GB line) costs
    no more memory than a small one."""
    fd = safefs.open_regular(root, rel)
    try:
        size = os.fstat(fd).st_size
        page = Page(size=size, offset=offset)
        if b"\0" in os.pread(fd, 8192, 0):
            page.binary = True
            return page
        _scan_lines(fd, page, limit, max_out)
        return page
    finally:
        os.close(fd)


def _scan_lines(fd: int, page: Page, limit: int, max_out: int) -> None:
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
