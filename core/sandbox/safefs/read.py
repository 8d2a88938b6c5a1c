"""Reading what a sandbox wrote: bounded reads of regular files, sizes, stats, descriptors, and a
bounded walk over a tree; a link is never followed, a FIFO or device never opened blocking."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness_env.core.sandbox.safefs.descend import DIR_FLAGS, FILE_FLAGS, DirStack, UnsafeEntry, kind_of, not_found, open_dir, parent_dir, path_parts


def _read_fd(fd: int, max_bytes: int, tail: bool) -> bytes | None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        return None
    if tail and st.st_size > max_bytes:
        os.lseek(fd, st.st_size - max_bytes, os.SEEK_SET)
    chunks, left = [], max_bytes
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_regular(root: str | Path, rel: str | Path, max_bytes: int, *, tail: bool = False) -> bytes | None:
    """The first (or, with `tail`, last) `max_bytes` of regular file `root/rel`; None when it is
    missing, a link anywhere below `root`, a FIFO, a device, a directory or unreadable."""
    try:
        with parent_dir(root, rel) as (dfd, name, _):
            fd = os.open(name, FILE_FLAGS, dir_fd=dfd)
        try:
            return _read_fd(fd, max_bytes, tail)
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None


def file_size(root: str | Path, rel: str | Path) -> int | None:
    """Size of regular file `root/rel` (lstat, no link followed), None otherwise."""
    try:
        with parent_dir(root, rel) as (dfd, name, _):
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except (OSError, ValueError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def stat_entry(root: str | Path, rel: str | Path) -> os.stat_result:
    """lstat of root/rel: the directories on the way are walked without following a link, and the
    entry itself is not followed either (a link's own stat). Raises UnsafeEntry, FileNotFoundError."""
    if not path_parts(rel):
        fd = os.open(root, DIR_FLAGS)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)
    with parent_dir(root, rel) as (dfd, name, full):
        try:
            return os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            raise not_found(full) from None


def open_regular(root: str | Path, rel: str | Path) -> int:
    """A read-only, non-blocking descriptor of regular file root/rel; no link is followed anywhere
    below root, and a FIFO, device, socket or directory raises UnsafeEntry without blocking."""
    with parent_dir(root, rel) as (dfd, name, full):
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):  # do not even open a device: opening can have effects
                raise UnsafeEntry(full, kind_of(st.st_mode), "a regular file")
            fd = os.open(name, FILE_FLAGS, dir_fd=dfd)
        except FileNotFoundError:
            raise not_found(full) from None
        except OSError as e:
            if e.errno != errno.ELOOP or isinstance(e, UnsafeEntry):
                raise
            raise UnsafeEntry(full, "a symbolic link", "a regular file") from None  # swapped in meanwhile
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeEntry(full, kind_of(st.st_mode), "a regular file")
    return fd


@dataclass(frozen=True)
class FoundFile:
    rel: str  # path relative to the walked root, '/'-separated
    data: bytes  # at most the walk's max_bytes + 1 (so a caller can tell it was cut)
    size: int


def walk_files(
    root: str | Path,
    *,
    skip_dirs: frozenset[str] = frozenset(),
    max_depth: int = 32,
    max_files: int = 1000,
    max_entries: int = 100_000,
    max_bytes: int = 256 * 1024,
) -> Iterator[FoundFile]:
    """Regular files under `root` in sorted, depth-first order, read up to `max_bytes` + 1 each.
    Links, special files, directories deeper than `max_depth` and anything past `max_entries`
    directory entries are skipped; no link is followed."""
    try:
        top = open_dir(root)
    except OSError:
        return
    seen = files = 0
    with DirStack(top, None) as walk:
        for dfd, prefix, name, _ in walk.entries():
            seen += 1
            if seen > max_entries or files >= max_files:
                return
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                continue
            rel = prefix + name
            if stat.S_ISDIR(st.st_mode):
                if name in skip_dirs or walk.depth >= max_depth:
                    continue
                try:
                    sub = os.open(name, DIR_FLAGS, dir_fd=dfd)
                except OSError:
                    continue
                walk.push(sub, rel + "/", None)
            elif stat.S_ISREG(st.st_mode):
                try:
                    fd = os.open(name, FILE_FLAGS, dir_fd=dfd)
                except OSError:
                    continue
                try:
                    data = _read_fd(fd, max_bytes + 1, tail=False)
                finally:
                    os.close(fd)
                if data is not None:
                    files += 1
                    yield FoundFile(rel, data, st.st_size)
