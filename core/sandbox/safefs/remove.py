"""Removing whatever the agent made of a tree (any depth, links, FIFOs, unreadable or read-only
modes): iterative, one open directory at a time, never following a link."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
from pathlib import Path

from harness_env.core.sandbox.safefs.descend import DIR_FLAGS


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
        fd = os.open(path, DIR_FLAGS)
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
            parent = os.open("..", DIR_FLAGS, dir_fd=fd)
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
        return os.open(name, DIR_FLAGS, dir_fd=fd)
    except PermissionError:  # a directory made unreadable (we may not be root): make it ours again
        os.chmod(name, 0o700, dir_fd=fd, follow_symlinks=False)
        return os.open(name, DIR_FLAGS, dir_fd=fd)


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


def remove_at(dfd: int, name: str) -> None:
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
