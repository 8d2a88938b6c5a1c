"""Reading back and removing what a sandbox wrote, treating every name in it as hostile.

The agent controls the tree: a file can be a symlink to a host file, a FIFO that blocks any
`open()`, a 2 GB file, or the bottom of a directory chain 5,000 levels deep. So every path is
walked one component at a time from a directory descriptor the caller trusts, with O_NOFOLLOW
(a link is never followed), files are opened O_NONBLOCK and kept only when fstat says they are
regular files, reads are bounded, and removal is iterative (no recursion limit, no PATH_MAX).
These are blocking calls: run them off the event loop (asyncio.to_thread).
"""

from __future__ import annotations

import errno
import fnmatch
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)


def _parts(rel: str | Path) -> list[str]:
    parts = [p for p in Path(rel).parts if p not in ("", ".", "/")]
    if any(p == ".." for p in parts):
        raise ValueError(f"path {str(rel)!r} goes up with '..'")
    return parts


def open_dir(root: str | Path, rel: str | Path = "") -> int:
    """A descriptor of directory `root/rel`, no link followed below `root` (OSError otherwise)."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in _parts(rel):
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


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
        parts = _parts(rel)
        if not parts:
            return None
        dfd = open_dir(root, Path(*parts[:-1]) if len(parts) > 1 else "")
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=dfd)
        finally:
            os.close(dfd)
        try:
            return _read_fd(fd, max_bytes, tail)
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None


def file_size(root: str | Path, rel: str | Path) -> int | None:
    """Size of regular file `root/rel` (lstat, no link followed), None otherwise."""
    try:
        parts = _parts(rel)
        if not parts:
            return None
        dfd = open_dir(root, Path(*parts[:-1]) if len(parts) > 1 else "")
        try:
            st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
        finally:
            os.close(dfd)
    except (OSError, ValueError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


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
    stack: list[tuple[int, str, Iterator[str]]] = [(top, "", iter(_sorted_names(top)))]
    seen = files = 0
    try:
        while stack:
            dfd, prefix, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(dfd)
                stack.pop()
                continue
            seen += 1
            if seen > max_entries or files >= max_files:
                return
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                continue
            rel = prefix + name
            if stat.S_ISDIR(st.st_mode):
                if name in skip_dirs or len(stack) >= max_depth:
                    continue
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
                except OSError:
                    continue
                stack.append((sub, rel + "/", iter(_sorted_names(sub))))
            elif stat.S_ISREG(st.st_mode):
                try:
                    fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
                except OSError:
                    continue
                try:
                    data = _read_fd(fd, max_bytes + 1, tail=False)
                finally:
                    os.close(fd)
                if data is not None:
                    files += 1
                    yield FoundFile(rel, data, st.st_size)
    finally:
        for dfd, _, _ in stack:
            os.close(dfd)


def _sorted_names(dfd: int, limit: int = 100_000) -> list[str]:
    names = []
    try:
        with os.scandir(dfd) as it:
            for entry in it:
                names.append(entry.name)
                if len(names) >= limit:
                    break
    except OSError:
        return []
    return sorted(names)


def remove_tree(path: str | Path) -> str | None:
    """Remove `path` and everything below it, whatever the agent made of it (any depth, links,
    FIFOs, read-only or immutable-looking modes). Never raises: returns what could not be removed,
    in words, or None. A link at `path` itself is removed, never followed."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"could not remove {path}: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        try:
            os.unlink(path)
            return None
        except OSError as e:
            return f"could not remove {path}: {e.strerror}"
    problem = _remove_dir(path)
    if problem and os.path.lexists(path) and shutil.which("chattr"):
        # chattr +i/+a (possible without bubblewrap, as root): clear the flags, then try again
        subprocess.run(["chattr", "-R", "-f", "-i", "-a", str(path)], capture_output=True, timeout=120)
        problem = _remove_dir(path)
    return problem


def _remove_dir(path: Path) -> str | None:
    """Iterative bottom-up removal with one open directory at a time; going up re-opens '..' and
    checks it is the directory we came from (the agent's processes are dead by now, but a
    renamed parent must not send us elsewhere)."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as e:
        return f"could not open {path} to remove it: {e.strerror}"
    trail: list[tuple[int, int]] = []  # (dev, ino) of each parent on the way down
    failures = 0
    skipped: set[tuple[int, int, str]] = set()  # entries that would not go: do not loop on them
    try:
        while True:
            name = _next_entry(fd, skipped)
            if name is not None:
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                except OSError:
                    failures += 1
                    skipped.add((*_ident(fd), name))
                    continue
                if stat.S_ISDIR(st.st_mode):
                    try:
                        sub = _open_sub(fd, name)
                    except OSError:
                        failures += 1
                        skipped.add((*_ident(fd), name))
                        continue
                    trail.append(_ident(fd))
                    os.close(fd)
                    fd = sub
                else:
                    try:
                        _unlink(fd, name)
                    except OSError:
                        failures += 1
                        skipped.add((*_ident(fd), name))
                continue
            # this directory is empty (of what we could remove): go up and remove it
            if not trail:
                break
            here = _ident(fd)
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            if _ident(fd) != trail.pop():
                return f"could not remove {path}: a directory was moved while it was being removed"
            name = _name_of(fd, here)
            if name is None:
                continue
            try:
                _unlink(fd, name, is_dir=True)
            except OSError:
                failures += 1
                skipped.add((*_ident(fd), name))
    finally:
        os.close(fd)
    try:
        os.rmdir(path)
    except OSError as e:
        if os.path.lexists(path):
            return f"could not remove {path}: {failures} entries would not go ({e.strerror})"
    return None


def _ident(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _next_entry(fd: int, skipped: set[tuple[int, int, str]]) -> str | None:
    ident = _ident(fd)
    try:
        with os.scandir(fd) as it:
            for entry in it:
                if (*ident, entry.name) not in skipped:
                    return entry.name
    except OSError:
        return None
    return None


def _name_of(parent_fd: int, child: tuple[int, int]) -> str | None:
    try:
        with os.scandir(parent_fd) as it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) == child:
                    return entry.name
    except OSError:
        return None
    return None


def _open_sub(fd: int, name: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except PermissionError:  # a directory made unreadable (we may not be root): make it ours again
        os.chmod(name, 0o700, dir_fd=fd, follow_symlinks=False)
        return os.open(name, _DIR_FLAGS, dir_fd=fd)


def _unlink(fd: int, name: str, *, is_dir: bool = False) -> None:
    def once() -> None:
        if is_dir:
            os.rmdir(name, dir_fd=fd)
        else:
            os.unlink(name, dir_fd=fd)

    try:
        once()
    except PermissionError:
        os.chmod(fd, 0o700)  # a read-only parent (not root): make it writable, retry
        once()
    except OSError as e:
        if e.errno != errno.ENOENT:
            raise


# -- link-safe file tools (the white-box harness's read/write/edit/ls/glob run these) -----------

_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


_KINDS = (
    (stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def kind_of(mode: int) -> str:
    """What a file mode is, in words ('a FIFO', 'a symbolic link', ...)."""
    return next((name for test, name in _KINDS if test(mode)), "a special file")


class UnsafeEntry(OSError):
    """An entry the caller needs as a regular file or a directory is something else: a link (never
    followed), a FIFO, a device, a socket, or a file where a directory should be."""

    def __init__(self, rel: str, kind: str, wanted: str) -> None:
        super().__init__(f"{rel} is {kind}, not {wanted}")
        self.rel, self.kind, self.wanted = rel, kind, wanted


def _missing(rel: str) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, "No such file or directory", rel)


def _walk_dirs(root: str | Path, parts: list[str], *, create: bool = False, owner: tuple[int, int] | None = None) -> int:
    """A descriptor of directory root/parts..., walked one component at a time without following a
    link; with `create`, missing directories are made (given to `owner`, a (uid, gid), if set).
    Raises UnsafeEntry for a component that is not a directory, FileNotFoundError (named relative
    to root) for a missing one."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for i, part in enumerate(parts):
            rel = "/".join(parts[: i + 1])
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise _missing(rel) from None
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                nxt = _open_existing_dir(fd, part, rel)
                if owner is not None:
                    os.fchown(nxt, *owner)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                nxt = _open_existing_dir(fd, part, rel)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_existing_dir(fd: int, part: str, rel: str) -> int:
    try:
        return os.open(part, _DIR_FLAGS, dir_fd=fd)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        try:
            st = os.stat(part, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            raise _missing(rel) from None
        raise UnsafeEntry(rel, kind_of(st.st_mode), "a directory") from None


def _split(rel: str | Path) -> tuple[list[str], str]:
    parts = _parts(rel)
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "Is a directory", ".")
    return parts[:-1], parts[-1]


def stat_entry(root: str | Path, rel: str | Path) -> os.stat_result:
    """lstat of root/rel: the directories on the way are walked without following a link, and the
    entry itself is not followed either (a link's own stat). Raises UnsafeEntry, FileNotFoundError."""
    parts = _parts(rel)
    if not parts:
        fd = os.open(root, _DIR_FLAGS)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)
    dfd = _walk_dirs(root, parts[:-1])
    try:
        return os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        raise _missing("/".join(parts)) from None
    finally:
        os.close(dfd)


def open_regular(root: str | Path, rel: str | Path) -> int:
    """A read-only, non-blocking descriptor of regular file root/rel; no link is followed anywhere
    below root, and a FIFO, device, socket or directory raises UnsafeEntry without blocking."""
    dirs, name = _split(rel)
    full = "/".join([*dirs, name])
    dfd = _walk_dirs(root, dirs)
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):  # do not even open a device: opening can have effects
            raise UnsafeEntry(full, kind_of(st.st_mode), "a regular file")
        fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
    except FileNotFoundError:
        raise _missing(full) from None
    except OSError as e:
        if e.errno != errno.ELOOP or isinstance(e, UnsafeEntry):
            raise
        raise UnsafeEntry(full, "a symbolic link", "a regular file") from None  # swapped in meanwhile
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeEntry(full, kind_of(st.st_mode), "a regular file")
    return fd


def write_regular(
    root: str | Path, rel: str | Path, data: bytes, *, make_parents: bool = True, owner: tuple[int, int] | None = None
) -> None:
    """Put `data` at root/rel as a regular file: directories on the way are walked (and, with
    `make_parents`, made) without following a link; an existing entry that is not a regular file
    (a link, FIFO, device, directory) raises UnsafeEntry. The content goes to a fresh file in the
    same directory that is then renamed over the name: the target is never opened, so a link, a
    FIFO or a hard link swapped in meanwhile is replaced, never written through. The old file's
    permission bits (and, as root, its owner) are kept; what is created goes to `owner` (uid, gid)
    if set, so that an unprivileged sandbox user can change it afterwards."""
    dirs, name = _split(rel)
    full = "/".join([*dirs, name])
    dfd = _walk_dirs(root, dirs, create=make_parents, owner=owner)
    try:
        mode = 0o644
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISREG(st.st_mode):
                raise UnsafeEntry(full, kind_of(st.st_mode), "a regular file")
            mode = stat.S_IMODE(st.st_mode) & 0o777
            if os.geteuid() == 0:
                owner = (st.st_uid, st.st_gid)
        tmp, fd = _temp_file(dfd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view[: 1 << 20]) :]
                if owner is not None:
                    os.fchown(fd, *owner)
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
    finally:
        os.close(dfd)


def _temp_file(dfd: int) -> tuple[str, int]:
    for _ in range(100):
        tmp = f".harness-env-{os.urandom(6).hex()}.tmp"
        try:
            return tmp, os.open(tmp, _WRITE_FLAGS, 0o600, dir_fd=dfd)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "could not make a temporary file", ".")


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
    dfd = _walk_dirs(root, _parts(rel))
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
    root: str | Path,
    pattern: str,
    *,
    max_entries: int = 200_000,
    max_depth: int = 64,
    max_matches: int = 100_000,
    deadline: float | None = None,
) -> GlobResult:
    """The entries under root whose relative paths match `pattern` ('*', '?', '[...]' within one
    component, '**' for any number of components; dot files match too, as with pathlib). The walk
    opens every directory relative to its parent with O_NOFOLLOW, so a link is listed by its own
    name but never entered; it is bounded in entries, depth, matches and (monotonic) time."""
    segs = _parts(pattern)
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
    stack: list[tuple[int, str, set[int], Iterator[str]]] = [(top, "", closure({0}), iter(_sorted_names(top)))]
    try:
        while stack:
            dfd, prefix, states, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(dfd)
                stack.pop()
                continue
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
                sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)  # a link or a non-directory fails here
            except OSError:
                continue
            if len(stack) >= max_depth:
                os.close(sub)
                result.stopped = result.stopped or "depth"
                continue
            stack.append((sub, rel + "/", here, iter(_sorted_names(sub))))
    finally:
        for dfd, _, _, _ in stack:
            os.close(dfd)
    result.matches.sort()
    return result


# -- bounded, link-free copies between a sandbox and the server's own directories -----------------
# (Harbor's environment downloads the agent's and the verifier's directories into Harbor's trial
# directory, whose files Harbor's own code then reads on the event loop, and uploads tests and logs
# into the sandbox.)

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
    src_top = _walk_dirs(root, _parts(rel))
    try:
        os.makedirs(dest, exist_ok=True)
        dst_top = os.open(dest, _DIR_FLAGS)
    except BaseException:
        os.close(src_top)
        raise
    report = CopyReport()
    stack: list[tuple[int, int, str, Iterator[str]]] = [(src_top, dst_top, "", iter(_sorted_names(src_top)))]
    seen = 0
    try:
        while stack:
            sfd, dfd, prefix, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(sfd)
                os.close(dfd)
                stack.pop()
                continue
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
                if len(stack) >= max_depth:
                    report.leave_out(path, f"deeper than {max_depth} directories")
                    continue
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=sfd)
                except OSError as e:
                    report.leave_out(path, e.strerror or str(e))
                    continue
                try:
                    dsub = _dir_at(dfd, name, replace=False)
                except OSError as e:
                    os.close(sub)
                    report.leave_out(path, e.strerror or str(e))
                    continue
                stack.append((sub, dsub, path + "/", iter(_sorted_names(sub))))
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
    finally:
        for sfd, dfd, _, _ in stack:
            os.close(sfd)
            os.close(dfd)
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
        dfd = os.open(dest.parent, _DIR_FLAGS)
        try:
            return _copy_fd_to(src, dfd, dest.name, max_bytes)
        finally:
            os.close(dfd)
    finally:
        os.close(src)


def _copy_regular_at(sfd: int, name: str, dfd: int, max_bytes: int) -> int:
    src = os.open(name, _FILE_FLAGS, dir_fd=sfd)
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
            view = memoryview(chunk)
            while view:
                view = view[os.write(dst, view) :]
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


def _remove_at(dfd: int, name: str) -> None:
    """Remove entry `name` of directory `dfd`, whatever it is (a tree: iteratively, never followed)."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        problem = remove_tree(f"/proc/self/fd/{dfd}/{name}")  # the magic link is our descriptor's directory
        if problem:
            raise OSError(errno.ENOTEMPTY, problem, name)
    else:
        os.unlink(name, dir_fd=dfd)


def _dir_at(dfd: int, name: str, *, replace: bool) -> int:
    """A descriptor of directory dfd/name, made when missing. Something else there (a link, a
    file, a FIFO) is removed and replaced by a fresh directory with `replace`, else an UnsafeEntry."""
    for _ in range(3):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=dfd)
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            if not replace:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                raise UnsafeEntry(name, kind_of(st.st_mode), "a directory") from None
            _remove_at(dfd, name)
        try:
            os.mkdir(name, 0o755, dir_fd=dfd)
        except FileExistsError:
            pass
    return os.open(name, _DIR_FLAGS, dir_fd=dfd)


def copy_in(source: str | Path, root: str | Path, rel: str | Path) -> None:
    """Copy `source`, a file, link or directory tree of the server's, to root/rel in a sandbox. The
    directories leading to root/rel are walked without following a link (made when missing; a link
    among them raises UnsafeEntry). At root/rel and below, whatever stands where the copy goes (a
    link, a FIFO, a file where a directory goes or the reverse) is replaced, never written through:
    files and links go in under a fresh name renamed over the old one. A directory is merged into
    what is there. Iterative: any depth."""
    dirs, name = _split(rel)
    pfd = _walk_dirs(root, dirs, create=True)
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
        target = os.readlink(source)
        for _ in range(100):
            tmp = f".harness-env-{os.urandom(6).hex()}.tmp"
            try:
                os.symlink(target, tmp, dir_fd=dfd)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(errno.EEXIST, "could not make a temporary link", name)
    elif stat.S_ISREG(st.st_mode):
        src = os.open(source, _FILE_FLAGS)
        try:
            sst = os.fstat(src)
            if not stat.S_ISREG(sst.st_mode):
                raise UnsafeEntry(str(source), kind_of(sst.st_mode), "a regular file")
            tmp, fd = _temp_file(dfd)
            try:
                while chunk := os.read(src, 1 << 20):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
                os.fchmod(fd, stat.S_IMODE(sst.st_mode) & 0o7777 & ~0o6000)
            except BaseException:
                os.close(fd)
                os.unlink(tmp, dir_fd=dfd)
                raise
            os.close(fd)
        finally:
            os.close(src)
    else:
        raise UnsafeEntry(str(source), kind_of(st.st_mode), "a regular file, link or directory")
    try:
        try:
            existing = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            existing = None
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            _remove_at(dfd, name)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise
