"""Descending a path from a directory the caller trusts, one component at a time, with O_NOFOLLOW:
the primitive every other safefs module is built on, and the words for what an entry is."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)


def path_parts(rel: str | Path) -> list[str]:
    """The components of a relative path ('.' and empty ones dropped); '..' is a ValueError."""
    parts = [p for p in Path(rel).parts if p not in ("", ".", "/")]
    if any(p == ".." for p in parts):
        raise ValueError(f"path {str(rel)!r} goes up with '..'")
    return parts


def split_parent(rel: str | Path) -> tuple[list[str], str]:
    """(directories, last name) of a path that names an entry, not the root itself."""
    parts = path_parts(rel)
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "Is a directory", ".")
    return parts[:-1], parts[-1]


def walk_dirs(root: str | Path, parts: list[str], *, create: bool = False, owner: tuple[int, int] | None = None) -> int:
    """A descriptor of directory root/parts..., walked one component at a time without following a
    link; with `create`, missing directories are made (given to `owner`, a (uid, gid), if set).
    Raises UnsafeEntry for a component that is not a directory, FileNotFoundError (named relative
    to root) for a missing one."""
    fd = os.open(root, DIR_FLAGS)
    try:
        for i, part in enumerate(parts):
            rel = "/".join(parts[: i + 1])
            try:
                nxt = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise not_found(rel) from None
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


def open_dir(root: str | Path, rel: str | Path = "") -> int:
    """A descriptor of directory `root/rel`, no link followed below `root` (OSError otherwise:
    UnsafeEntry for a component that is not a directory, FileNotFoundError for a missing one)."""
    return walk_dirs(root, path_parts(rel))


@contextmanager
def parent_dir(root: str | Path, rel: str | Path, *, create: bool = False, owner: tuple[int, int] | None = None) -> Iterator[tuple[int, str, str]]:
    """(descriptor of the directory that holds root/rel, the entry's name, its path relative to
    root), the directories walked as walk_dirs walks them (and made, with `create`); the
    descriptor is closed on leaving. IsADirectoryError when rel names root itself."""
    dirs, name = split_parent(rel)
    dfd = walk_dirs(root, dirs, create=create, owner=owner)
    try:
        yield dfd, name, "/".join([*dirs, name])
    finally:
        os.close(dfd)


def _open_existing_dir(fd: int, part: str, rel: str) -> int:
    try:
        return os.open(part, DIR_FLAGS, dir_fd=fd)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        try:
            st = os.stat(part, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            raise not_found(rel) from None
        raise UnsafeEntry(rel, kind_of(st.st_mode), "a directory") from None


def sorted_names(dfd: int, limit: int = 100_000) -> list[str]:
    """The first `limit` names in directory `dfd`, sorted; [] when it cannot be read."""
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


_KINDS = (
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
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


def not_found(rel: str) -> FileNotFoundError:
    """The error for a missing entry, named relative to the walked root."""
    return FileNotFoundError(errno.ENOENT, "No such file or directory", rel)


class DirStack[X]:
    """A depth-first walk over directories the caller opened without following a link: `entries()`
    gives each name, in sorted order, with the open directory it is in, its path prefix and what the
    caller keeps with that directory; `push` descends. Every descriptor is closed when its
    directory is done or the walk is (`close_data` closes what the caller kept, e.g. a second
    descriptor)."""

    def __init__(self, top: int, data: X, close_data: Callable[[X], None] | None = None) -> None:
        self._frames: list[tuple[int, str, Iterator[str], X]] = []
        self._close_data = close_data
        self.push(top, "", data)

    def push(self, dfd: int, prefix: str, data: X) -> None:
        """Walk directory `dfd` (owned from now on) next, its entries named `prefix` + name."""
        self._frames.append((dfd, prefix, iter(sorted_names(dfd)), data))

    @property
    def depth(self) -> int:
        """How many directories are open: 1 in the top one."""
        return len(self._frames)

    def entries(self) -> Iterator[tuple[int, str, str, X]]:
        """(directory descriptor, prefix, name, data) of each entry, depth-first."""
        while self._frames:
            dfd, prefix, names, data = self._frames[-1]
            name = next(names, None)
            if name is None:
                self._pop()
                continue
            yield dfd, prefix, name, data

    def _pop(self) -> None:
        dfd, _, _, data = self._frames.pop()
        os.close(dfd)
        if self._close_data is not None:
            self._close_data(data)

    def close(self) -> None:
        while self._frames:
            self._pop()

    def __enter__(self) -> DirStack[X]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
