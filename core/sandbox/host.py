"""What this host offers a local sandbox: a working bubblewrap, an unprivileged uid to run as,
the directory rollouts live in, the /etc files to hide, the top-level directories to show, and
size-limited tmpfs mounts. Each is looked up here once, so the sandbox itself only decides.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from harness_env.core.sandbox.bwrap import ALLOWED_TOP, RootEntry


@functools.cache
def bwrap_available() -> str | None:
    """Path of a working bwrap, or None. Checked by running it once (it can exist but be denied)."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    try:
        proc = subprocess.run([path, "--ro-bind", "/", "/", "--unshare-pid", "--proc", "/proc", "--dev", "/dev", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return path if proc.returncode == 0 else None


def sandboxes_root() -> Path:
    return Path(os.environ.get("HARNESS_ENV_SANDBOX_DIR") or Path(tempfile.gettempdir()) / "harness-env")


def sandbox_user() -> tuple[int, int] | None:
    """(uid, gid) commands run as under bubblewrap: an unprivileged user when the server is root
    and can switch (setpriv), else None (a non-root server's bwrap is unprivileged already)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return None
    uid = int(os.environ.get("HARNESS_ENV_SANDBOX_UID") or 65534)
    return (uid, int(os.environ.get("HARNESS_ENV_SANDBOX_GID") or uid))


@functools.cache
def etc_secrets() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(files, dirs) under /etc that others may not read (shadow, private keys): hidden in the
    sandbox even where it runs as root."""
    files, dirs = [], []
    for dirpath, dirnames, filenames in os.walk("/etc"):
        if dirpath.count("/") > 4:
            dirnames[:] = []
            continue
        for name in [*dirnames, *filenames]:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if st.st_mode & 0o004:
                continue
            if stat.S_ISDIR(st.st_mode):
                dirs.append(p)
                dirnames.remove(name)  # hidden whole: no need to look inside
            elif stat.S_ISREG(st.st_mode):
                files.append(p)
    return tuple(sorted(files)), tuple(sorted(dirs))


def root_entries() -> list[RootEntry]:
    """The allowed top-level directories of this host (and their merged-/usr links), as bubblewrap
    shows them read-only."""
    entries = []
    for name in sorted(os.listdir("/")):
        p = Path("/") / name
        if name not in ALLOWED_TOP:
            continue
        if p.is_symlink():
            entries.append(RootEntry(name, symlink_target=os.readlink(p)))
        else:
            entries.append(RootEntry(name, is_dir=p.is_dir()))
    return entries


_libc = ctypes.CDLL(None, use_errno=True)
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2


def mount_tmpfs(path: Path, size_bytes: int, mode: int = 0o755) -> bool:
    """A size-limited tmpfs at `path` (a rollout directory: its disk limit, and removal by
    unmounting whatever tree the agent made; the setup layers' cache: in memory). False where
    mounting is not allowed."""
    if os.geteuid() != 0:
        return False
    opts = f"size={size_bytes},mode={mode:04o}".encode()
    return _libc.mount(b"tmpfs", str(path).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts) == 0


def mount_overlay(lower: str | list[str], upper: Path, work: Path, target: Path) -> str | None:
    """An overlay at `target`: `lower` read-only (a list: stacked, the first on top), every write
    going to `upper` (a task image's root with the rollout's own layer, over a group's saved one; a
    group member's directory on the saved setup); what went wrong, in words, or None. Needs root."""
    lowers = [lower] if isinstance(lower, str) else lower
    for ch in (",", ":", "\\"):
        if any(ch in str(p) for p in (*lowers, upper, work)):
            return f"an overlay cannot take the path {':'.join(lowers)!r} or {str(upper)!r}: it holds {ch!r}"
    opts = f"lowerdir={':'.join(lowers)},upperdir={upper},workdir={work}".encode()
    if _libc.mount(b"overlay", str(target).encode(), b"overlay", _MS_NOSUID | _MS_NODEV, opts) == 0:
        return None
    return f"could not mount an overlay at {target}: {os.strerror(ctypes.get_errno())}"


def unmount(path: Path) -> str | None:
    """Detach the mount at `path`; what went wrong, in words, or None."""
    if _libc.umount2(str(path).encode(), _MNT_DETACH) == 0:
        return None
    return f"could not unmount the rollout's tmpfs at {path}: {os.strerror(ctypes.get_errno())}"


def unescape_mount_path(field: str) -> str:
    """/proc/self/mounts writes space, tab, newline and backslash in a path as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_table() -> list[list[str]]:
    """/proc/self/mounts, a list of fields per mount (device, mount point, type, options, ...; the
    paths still escaped: unescape_mount_path); empty where it cannot be read."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as f:
            return [line.split() for line in f.read().splitlines()]
    except OSError:
        return []


def entries_below_overlays(root: Path) -> set[str]:
    """Names of `root`'s entries that a live overlay on this machine has a lower layer in (the
    task image cache's and the setup layers': such an entry is never evicted)."""
    prefixes = {f"{root}/", f"{os.path.realpath(root)}/"}  # the mount table names real paths
    options = [f[3] for f in mount_table() if len(f) > 3 and f[2] == "overlay"]
    lowers = [opt.removeprefix("lowerdir=") for opts in options for opt in opts.split(",") if opt.startswith("lowerdir=")]
    paths = [unescape_mount_path(p) for lower in lowers for p in lower.split(":")]
    return {p.removeprefix(prefix).split("/")[0] for p in paths for prefix in prefixes if p.startswith(prefix)}


def mounts_at_or_below(path: Path) -> list[str]:
    """Mount points at `path` or below it, deepest first. /proc/self/mounts names real paths, so
    the parent is resolved, never `path` itself: a link there must not lead to another tree."""
    top = os.path.join(os.path.realpath(os.path.dirname(os.path.normpath(str(path)))), os.path.basename(os.path.normpath(str(path))))
    found = {unescape_mount_path(fields[1]) for fields in mount_table() if len(fields) > 1}
    below = [m for m in found if m == top or m.startswith(top + "/")]
    return sorted(below, key=lambda m: m.count("/"), reverse=True)


def unmount_tree(path: Path) -> str | None:
    """Detach every mount at or below `path`, deepest first (lazily: a busy one is detached at
    once and freed when its last user goes), e.g. the rollout's tmpfs and whatever a root agent
    mounted inside it, so removing the directory afterwards cannot reach into another filesystem.
    What is still mounted afterwards, in words, or None."""
    for mount in mounts_at_or_below(path):
        _libc.umount2(mount.encode(errors="surrogateescape"), _MNT_DETACH)
    left = mounts_at_or_below(path)
    return f"could not unmount {', '.join(left[:5])}" if left else None


# A plain (bubblewrap-less) command runs as the init of a PID namespace of its own: when that init
# exits or is killed, the kernel kills every process in the namespace, and no process can leave a
# PID namespace (setns only ever moves children into a descendant one). So nothing a command
# started survives it, even a root agent's `setsid env -i` child that moved itself into the root
# cgroup. The init is a shell that reaps orphans while it waits (the command itself may not).
_PIDNS_INIT = ["/bin/sh", "-c", '"$@" & wait $!', "harness-env-init"]
# --mount-proc: the namespace gets a /proc of its own. Under the host's /proc, procps finds no
# process of its own pid there (getpid() counts inside the namespace) and `ps` dies with "fatal
# library error, lookup self" whenever that pid is free on the host; and the host's processes
# stayed in view.
_PIDNS_CANDIDATES = (
    ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"],  # root
    # not root: where user namespaces are allowed (same uid inside)
    ["unshare", "--user", "--map-current-user", "--pid", "--fork", "--kill-child", "--mount-proc"],
)


@functools.cache
def pid_namespace_argv() -> list[str] | None:
    """The prefix that starts a plain command in a PID namespace of its own, or None where this
    host allows none (checked by running it once)."""
    if shutil.which("unshare") is None:
        return None
    for prefix in _PIDNS_CANDIDATES:
        try:
            proc = subprocess.run([*prefix, *_PIDNS_INIT, "true"], capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if proc.returncode == 0:
            return [*prefix, *_PIDNS_INIT]
    return None
