"""Writing a regular file into a sandbox: the directories on the way are walked without following a
link, and the content goes in under a fresh name renamed over the old one, never written through."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

from harness_env.core.sandbox.safefs.descend import UnsafeEntry, kind_of, parent_dir
from harness_env.core.sandbox.safefs.remove import remove_at

_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_regular(root: str | Path, rel: str | Path, data: bytes, *, make_parents: bool = True, owner: tuple[int, int] | None = None) -> None:
    """Put `data` at root/rel as a regular file: directories on the way are walked (and, with
    `make_parents`, made) without following a link; an existing entry that is not a regular file
    (a link, FIFO, device, directory) raises UnsafeEntry. The content goes to a fresh file in the
    same directory that is then renamed over the name: the target is never opened, so a link, a
    FIFO or a hard link swapped in meanwhile is replaced, never written through. The old file's
    permission bits (and, as root, its owner) are kept; what is created goes to `owner` (uid, gid)
    if set, so that an unprivileged sandbox user can change it afterwards."""
    with parent_dir(root, rel, create=make_parents, owner=owner) as (dfd, name, full):
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

        def fill(fd: int) -> None:
            write_all(fd, data)
            if owner is not None:
                os.fchown(fd, *owner)
            os.fchmod(fd, mode)

        rename_over(dfd, temp_file(dfd, fill), name)


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` (os.write may write less than it is given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[: 1 << 20]) :]


def _fresh_name[T](make: Callable[[str], T]) -> tuple[str, T]:
    """make(name) with a fresh temporary name until one is not taken yet: (name, what make gave)."""
    for _ in range(100):
        tmp = f".harness-env-{os.urandom(6).hex()}.tmp"
        try:
            return tmp, make(tmp)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "could not make a temporary entry", ".")


def temp_file(dfd: int, fill: Callable[[int], None]) -> str:
    """The name of a fresh, private file in directory `dfd`, filled by fill(fd) and closed, to be
    renamed over a target; removed again when fill fails."""
    tmp, fd = _fresh_name(lambda name: os.open(name, _WRITE_FLAGS, 0o600, dir_fd=dfd))
    try:
        try:
            fill(fd)
        finally:
            os.close(fd)
    except BaseException:
        _unlink_quietly(dfd, tmp)
        raise
    return tmp


def temp_link(dfd: int, target: str) -> str:
    """The name of a fresh symbolic link to `target` in directory `dfd`, to be renamed over a target."""
    return _fresh_name(lambda name: os.symlink(target, name, dir_fd=dfd))[0]


def rename_over(dfd: int, tmp: str, name: str, *, replace_dir: bool = False) -> None:
    """Rename entry `tmp` over `name` in directory `dfd`: whatever stood there is replaced, never
    written through. With `replace_dir` a directory there is removed first (a rename cannot put a
    file over one). `tmp` is removed when this fails."""
    try:
        if replace_dir:
            try:
                existing = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                existing = None
            if existing is not None and stat.S_ISDIR(existing.st_mode):
                remove_at(dfd, name)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        _unlink_quietly(dfd, tmp)
        raise


def _unlink_quietly(dfd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except OSError:
        pass
