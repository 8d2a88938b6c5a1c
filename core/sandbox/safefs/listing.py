"""Listing a sandbox's directories for the white-box file tools (ls, glob): entries with their kind,
and a glob whose walk never enters a link and is bounded in entries, depth, matches and time."""

from __future__ import annotations

import fnmatch
import os
import time
from dataclasses import dataclass
from pathlib import Path

from harness_env.core.sandbox.safefs.descend import DIR_FLAGS, DirStack, open_dir, path_parts, walk_dirs


@dataclass(frozen=True)
class DirEntry:
    name: str
    kind: str  # 'dir', 'file', 'link' or 'other' (the entry itself, links not followed)


def _entry_kind(entry: os.DirEntry[str]) -> str:
    try:
        if entry.is_symlink():
            return "link"
        if entry.is_dir(follow_symlinks=False):
            return "dir"
        if entry.is_file(follow_symlinks=False):
            return "file"
    except OSError:
        pass
    return "other"


def scan_dir(root: str | Path, rel: str | Path = "", *, max_entries: int = 100_000) -> tuple[list[DirEntry], bool]:
    """Entries of directory root/rel (sorted by name; at most `max_entries`, and whether there were
    more), no link followed, including root/rel itself. Raises UnsafeEntry, FileNotFoundError."""
    dfd = walk_dirs(root, path_parts(rel))
    out: list[DirEntry] = []
    more = False
    try:
        with os.scandir(dfd) as it:
            for entry in it:
                if len(out) >= max_entries:
                    more = True
                    break
                out.append(DirEntry(entry.name, _entry_kind(entry)))
    finally:
        os.close(dfd)
    out.sort(key=lambda e: e.name)
    return out, more


@dataclass
class GlobResult:
    matches: list[str]  # '/'-separated paths relative to root, sorted
    scanned: int  # directory entries looked at
    stopped: str | None = None  # why the walk ended early ('entries', 'time', 'depth'), else None


def glob(
    root: str | Path, pattern: str, *, max_entries: int = 200_000, max_depth: int = 64, max_matches: int = 100_000, deadline: float | None = None
) -> GlobResult:
    """The entries under root whose relative paths match `pattern` ('*', '?', '[...]' within one
    component, '**' for any number of components; dot files match too, as with pathlib). The walk
    opens every directory relative to its parent with O_NOFOLLOW, so a link is listed by its own
    name but never entered; it is bounded in entries, depth, matches and (monotonic) time."""
    segs = path_parts(pattern)
    if not segs:
        return GlobResult([], 0)
    n = len(segs)

    def closure(states: set[int]) -> set[int]:
        out, todo = set(states), list(states)
        while todo:
            i = todo.pop()
            if i < n and segs[i] == "**" and i + 1 not in out:
                out.add(i + 1)
                todo.append(i + 1)
        return out

    def step(states: set[int], name: str) -> set[int]:
        nxt: set[int] = set()
        for i in states:
            if i >= n:
                continue
            if segs[i] == "**":
                nxt.add(i)
            elif fnmatch.fnmatchcase(name, segs[i]):
                nxt.add(i + 1)
        return closure(nxt)

    result = GlobResult([], 0)
    try:
        top = open_dir(root)
    except OSError:
        return result
    with DirStack(top, closure({0})) as walk:
        for dfd, prefix, name, states in walk.entries():
            result.scanned += 1
            if result.scanned > max_entries:
                result.stopped = "entries"
                break
            if deadline is not None and result.scanned % 256 == 0 and time.monotonic() > deadline:
                result.stopped = "time"
                break
            here = step(states, name)
            if not here:
                continue
            rel = prefix + name
            if n in here:
                result.matches.append(rel)
                if len(result.matches) >= max_matches:
                    result.stopped = "matches"
                    break
            if not any(i < n for i in here):
                continue
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=dfd)  # a link or a non-directory fails here
            except OSError:
                continue
            if walk.depth >= max_depth:
                os.close(sub)
                result.stopped = result.stopped or "depth"
                continue
            walk.push(sub, rel + "/", here)
    result.matches.sort()
    return result
