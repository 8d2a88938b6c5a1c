"""Bounded, link-free copies between a sandbox and the server's own directories.

Harbor's environment downloads the agent's and the verifier's directories into Harbor's trial
directory, whose files Harbor's own code then reads on the event loop, and uploads tests and logs
into the sandbox.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness_env.core.sandbox.safefs.descend import DIR_FLAGS, FILE_FLAGS, DirStack, UnsafeEntry, kind_of, path_parts, split_parent, walk_dirs
from harness_env.core.sandbox.safefs.read import open_regular
from harness_env.core.sandbox.safefs.remove import remove_at
from harness_env.core.sandbox.safefs.write import rename_over, temp_file, temp_link, write_all

_MAX_NOTED = 20


@dataclass
class CopyReport:
    files: int = 0
    bytes: int = 0
    left_out: list[str] = field(default_factory=list)  # "rel: why", the first _MAX_NOTED
    left_out_count: int = 0

    def leave_out(self, rel: str, why: str) -> None:
        self.left_out_count += 1
        if len(self.left_out) < _MAX_NOTED:
            self.left_out.append(f"{rel}: {why}")


def copy_out(
    root: str | Path,
    rel: str | Path,
    dest: str | Path,
    *,
    max_file_bytes: int,
    max_total_bytes: int,
    max_files: int = 10_000,
    max_depth: int = 32,
    max_entries: int = 100_000,
    select: Callable[[str, bool], bool] | None = None,
) -> CopyReport:
    """Copy directory root/rel (walked from root without following a link) into `dest`, a
    directory of the server's (created if missing): directories and regular files only. Each file
    is opened non-blocking and copied only when it fits `max_file_bytes` (a larger one is left out,
    never cut); the copy as a whole stays within `max_total_bytes`, `max_files`, `max_depth` and
    `max_entries`. Links, FIFOs, devices and sockets are left out; what was left out is in the
    report. `select(path, is_dir)` (path relative to root/rel, '/'-separated) picks entries; a
    directory it refuses is not entered. Raises UnsafeEntry when root/rel (or a directory on the
    way) is not a directory, e.g. a link; FileNotFoundError when it is missing."""
    src_top = walk_dirs(root, path_parts(rel))
    try:
        os.makedirs(dest, exist_ok=True)
        dst_top = os.open(dest, DIR_FLAGS)
    except BaseException:
        os.close(src_top)
        raise
    report = CopyReport()
    seen = 0
    with DirStack(src_top, dst_top, close_data=os.close) as walk:
        for sfd, prefix, name, dfd in walk.entries():
            seen += 1
            path = prefix + name
            if seen > max_entries:
                report.leave_out(path, f"more than {max_entries} entries: this and the rest left out")
                break
            try:
                st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
            except OSError:
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if select is not None and not select(path, is_dir):
                continue
            if is_dir:
                if walk.depth >= max_depth:
                    report.leave_out(path, f"deeper than {max_depth} directories")
                    continue
                try:
                    sub = os.open(name, DIR_FLAGS, dir_fd=sfd)
                except OSError as e:
                    report.leave_out(path, e.strerror or str(e))
                    continue
                try:
                    dsub = _dir_at(dfd, name, replace=False)
                except OSError as e:
                    os.close(sub)
                    report.leave_out(path, e.strerror or str(e))
                    continue
                walk.push(sub, path + "/", dsub)
            elif not stat.S_ISREG(st.st_mode):
                report.leave_out(path, kind_of(st.st_mode))
            elif report.files >= max_files:
                report.leave_out(path, f"more than {max_files} files")
            elif st.st_size > max_file_bytes:
                report.leave_out(path, f"{st.st_size} bytes, over the {max_file_bytes}-byte limit per file")
            elif report.bytes + st.st_size > max_total_bytes:
                report.leave_out(path, f"over the {max_total_bytes}-byte limit of the whole copy")
            else:
                try:
                    report.bytes += _copy_regular_at(sfd, name, dfd, max_file_bytes)
                    report.files += 1
                except OSError as e:
                    report.leave_out(path, e.strerror or str(e))
    return report


def copy_file_out(root: str | Path, rel: str | Path, dest: str | Path, *, max_bytes: int) -> int:
    """Copy regular file root/rel (no link followed, opened non-blocking) to `dest`, a path of the
    server's; returns the bytes copied. Raises UnsafeEntry (a link, FIFO, device, directory),
    FileNotFoundError, or OSError(EFBIG) for a file over `max_bytes`."""
    src = open_regular(root, rel)
    try:
        size = os.fstat(src).st_size
        if size > max_bytes:
            raise OSError(errno.EFBIG, f"{size} bytes, over the {max_bytes}-byte limit", str(rel))
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dfd = os.open(dest.parent, DIR_FLAGS)
        try:
            return _copy_fd_to(src, dfd, dest.name, max_bytes)
        finally:
            os.close(dfd)
    finally:
        os.close(src)


def _copy_regular_at(sfd: int, name: str, dfd: int, max_bytes: int) -> int:
    src = os.open(name, FILE_FLAGS, dir_fd=sfd)
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):  # swapped in after the stat
            raise UnsafeEntry(name, kind_of(st.st_mode), "a regular file")
        return _copy_fd_to(src, dfd, name, max_bytes)
    finally:
        os.close(src)


def _copy_fd_to(src: int, dfd: int, name: str, max_bytes: int) -> int:
    """Stream `src` into dfd/name (replaced; a link there is not followed), at most `max_bytes`:
    a file that grew past them while being copied is removed again and refused."""
    st = os.fstat(src)
    dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    total = 0
    try:
        while True:
            chunk = os.read(src, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:
                raise OSError(errno.EFBIG, f"grew past the {max_bytes}-byte limit while being copied", name)
            write_all(dst, chunk)
        os.fchmod(dst, (stat.S_IMODE(st.st_mode) & 0o755) | 0o600)
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    except BaseException:
        os.close(dst)
        try:
            os.unlink(name, dir_fd=dfd)
        except OSError:
            pass
        raise
    os.close(dst)
    return total


def _dir_at(dfd: int, name: str, *, replace: bool) -> int:
    """A descriptor of directory dfd/name, made when missing. Something else there (a link, a
    file, a FIFO) is removed and replaced by a fresh directory with `replace`, else an UnsafeEntry."""
    for _ in range(3):
        try:
            return os.open(name, DIR_FLAGS, dir_fd=dfd)
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            if not replace:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                raise UnsafeEntry(name, kind_of(st.st_mode), "a directory") from None
            remove_at(dfd, name)
        try:
            os.mkdir(name, 0o755, dir_fd=dfd)
        except FileExistsError:
            pass
    return os.open(name, DIR_FLAGS, dir_fd=dfd)


def copy_in(source: str | Path, root: str | Path, rel: str | Path) -> None:
    """Copy `source`, a file, link or directory tree of the server's, to root/rel in a sandbox. The
    directories leading to root/rel are walked without following a link (made when missing; a link
    among them raises UnsafeEntry). At root/rel and below, whatever stands where the copy goes (a
    link, a FIFO, a file where a directory goes or the reverse) is replaced, never written through:
    files and links go in under a fresh name renamed over the old one. A directory is merged into
    what is there. Iterative: any depth."""
    dirs, name = split_parent(rel)
    pfd = walk_dirs(root, dirs, create=True)
    try:
        st = os.lstat(source)
        if not stat.S_ISDIR(st.st_mode):
            _put_entry(pfd, name, Path(source), st)
            return
        stack = [(Path(source), _dir_at(pfd, name, replace=True))]
        try:
            while stack:
                src_dir, dfd = stack.pop()
                try:
                    with os.scandir(src_dir) as it:
                        entries = sorted(it, key=lambda e: e.name)
                    for entry in entries:
                        est = entry.stat(follow_symlinks=False)
                        if stat.S_ISDIR(est.st_mode):
                            stack.append((Path(entry.path), _dir_at(dfd, entry.name, replace=True)))
                        else:
                            _put_entry(dfd, entry.name, Path(entry.path), est)
                finally:
                    os.close(dfd)
        finally:
            for _, dfd in stack:
                os.close(dfd)
    finally:
        os.close(pfd)


def _put_entry(dfd: int, name: str, source: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        tmp = temp_link(dfd, os.readlink(source))
    elif stat.S_ISREG(st.st_mode):
        src = os.open(source, FILE_FLAGS)
        try:
            sst = os.fstat(src)
            if not stat.S_ISREG(sst.st_mode):
                raise UnsafeEntry(str(source), kind_of(sst.st_mode), "a regular file")

            def fill(fd: int) -> None:
                while chunk := os.read(src, 1 << 20):
                    write_all(fd, chunk)
                os.fchmod(fd, stat.S_IMODE(sst.st_mode) & 0o7777 & ~0o6000)

            tmp = temp_file(dfd, fill)
        finally:
            os.close(src)
    else:
        raise UnsafeEntry(str(source), kind_of(st.st_mode), "a regular file, link or directory")
    rename_over(dfd, tmp, name, replace_dir=True)
