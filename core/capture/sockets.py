"""Capture sockets: where a process's capture proxy listens for its sandboxes, who owns one, and
the one sweep of those a killed owner left (`run`, `eval`, the app's start and a Ray replica's).

A capture socket is `<temporary directory>/harness-env-capture-<pid>-<random>.sock`, with a lease
beside it (core/sandbox/lease.py: `<socket>.lease`, written before the socket is bound, removed
after it is gone). A socket is a dead owner's, and removed, only when nobody listens on it (a
connection is refused: no process anywhere, in any namespace, serves it) AND its lease says the
owner is gone by the lease's own rule (same boot and PID namespace: pid and start time; another
namespace: the deadline). A socket without a readable lease (one of a version that wrote none) is
removed only when nobody has listened on it for a while. Anything else is left: never on doubt.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import tempfile
import time
from pathlib import Path

from harness_env.core.errors import SandboxError
from harness_env.core.sandbox.lease import LEASE_SUFFIX, is_stale, lease_path, read_lease, unreadable_is_stale

SOCKET_PREFIX = "harness-env-capture-"  # then the pid of the process serving it
SOCKET_SUFFIX = ".sock"
SOCKET_PATH_MAX = 107  # bytes of a Unix socket's path (sun_path is 108, with its terminating NUL)
UNLEASED_GRACE_S = 60.0  # a lease-less socket is bound a moment before it listens


def capture_socket_path() -> str:
    """A fresh path for the proxy's Unix socket in the temporary directory; serve_on_unix leases
    it, and removes both at exit. A temporary directory too long for a socket's path is one clear
    error (SandboxError), not the kernel's."""
    directory = tempfile.gettempdir()
    path = os.path.join(directory, f"{SOCKET_PREFIX}{os.getpid()}-{os.urandom(4).hex()}{SOCKET_SUFFIX}")
    if len(os.fsencode(path)) > SOCKET_PATH_MAX:
        raise SandboxError(
            f"the temporary directory {directory} is too long for the capture proxy's Unix socket "
            f"({len(os.fsencode(path))} bytes with the socket's name; at most {SOCKET_PATH_MAX}): "
            "set TMPDIR to a shorter directory, e.g. /tmp"
        )
    return path


def listening(path: str | os.PathLike[str]) -> bool:
    """Whether a process listens on the Unix socket at `path`. Only a refused connection (or no
    file) says no; a full backlog, a denied connect or any other answer says yes. Never blocks."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(os.fspath(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True  # EAGAIN (backlog full), EACCES...: someone may be there
    finally:
        probe.close()
    return True


def _is_capture_socket_name(name: str) -> bool:
    pid = name.removeprefix(SOCKET_PREFIX).split("-", 1)[0]
    return name.startswith(SOCKET_PREFIX) and name.endswith(SOCKET_SUFFIX) and pid.isdigit()


def _socket_is_stale(path: Path, st: os.stat_result, now: float) -> bool:
    if listening(path):
        return False  # served, whatever a lease says: a server outlives any deadline
    lease = read_lease(lease_path(path))
    if lease is not None:
        return is_stale(lease, now)
    return now - st.st_mtime > UNLEASED_GRACE_S


def _sweep_socket(path: Path, now: float) -> bool:
    """Remove one capture socket (and its lease) if its owner is gone; whether it was."""
    try:
        st = path.lstat()
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid() or not _socket_is_stale(path, st, now):
            return False
        os.unlink(path)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        os.unlink(lease_path(path))  # unlink never follows a link
    return True


def _sweep_orphan_lease(path: Path, now: float) -> None:
    """A socket lease whose socket is gone (its owner killed between the two): removed once stale."""
    socket_path = path.with_name(path.name.removesuffix(LEASE_SUFFIX))
    try:
        if os.path.lexists(socket_path):
            return
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return
        lease = read_lease(path)
        if is_stale(lease, now) if lease is not None else unreadable_is_stale(st.st_mtime, now):
            os.unlink(path)
    except OSError:
        return


def sweep_sockets(directory: str | os.PathLike[str] | None = None) -> list[str]:
    """Remove the capture sockets in `directory` (default: the temporary directory) whose owner is
    gone (see the module's docstring), and their leases. Only this user's; never raises, a missing
    directory included. Returns the sockets removed."""
    directory = Path(directory or tempfile.gettempdir())
    now = time.time()
    try:
        names = [e.name for e in os.scandir(directory) if e.name.startswith(SOCKET_PREFIX)]
    except OSError:
        return []
    removed = []
    for name in names:
        if _is_capture_socket_name(name):
            if _sweep_socket(directory / name, now):
                removed.append(str(directory / name))
        elif name.endswith(SOCKET_SUFFIX + LEASE_SUFFIX) and _is_capture_socket_name(name.removesuffix(LEASE_SUFFIX)):
            _sweep_orphan_lease(directory / name, now)
    return removed
