"""Writing a regular file into a sandbox: the directories on the way are walked without following a
link, and the content goes in under a fresh name renamed over the old one, never written through."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from harness_env.core.sandbox.safefs.descend import UnsafeEntry, kind_of, split_parent, walk_dirs


_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


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
    dirs, name = split_parent(rel)
    full = "/".join([*dirs, name])
    dfd = walk_dirs(root, dirs, create=make_parents, owner=owner)
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
        tmp, fd = temp_file(dfd)
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


def temp_file(dfd: int) -> tuple[str, int]:
    """(name, descriptor) of a fresh, empty, private file in directory `dfd`, to be renamed over a target."""
    for _ in range(100):
        tmp = f".harness-env-{os.urandom(6).hex()}.tmp"
        try:
            return tmp, os.open(tmp, _WRITE_FLAGS, 0o600, dir_fd=dfd)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "could not make a temporary file", ".")
