"""Leases: who owns a rollout directory, so a process that starts later can tell a dead owner's
leftovers from the live rollouts of another server or run sharing the sandbox directory.

A lease is a small file beside the rollout directory (`<sandbox dir>/rollout-<id>.lease`), written
before the directory is made and removed after it is gone, so no directory of ours is ever without
one. It names the owner for good: its pid AND that process's start time (/proc/<pid>/stat field
22), so a pid reused by another process is not mistaken for the owner; the boot and the PID
namespace it was judged in; and a deadline. A lease is stale when its owner is known dead: another
boot, or the same PID namespace and no process with that pid and start time. Where the owner's PID
namespace is another one (its pid means nothing here), or a fact is missing, only the deadline can
say, so it is long. Never swept on doubt: a lease is read tolerantly (fields another harness-env
version adds are ignored: a rolling upgrade, Ray replicas or `run` and `serve` of two versions share
the directory), and one that cannot be read at all is judged by its age against DEFAULT_LEASE_S.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from harness_env.core.procs import process_starttime
from harness_env.core.sandbox import safefs
from harness_env.core.sandbox.host import unmount_tree

LEASE_SUFFIX = ".lease"
ROLLOUT_PREFIX = "rollout"  # a local rollout's directory: rollout-<12 hex digits>
PREFIX_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")  # what a leased directory's name may start with
TEMP_DIR_PREFIX = "harness-env-tmp-"  # a leased directory under the system's temporary directory (leased_temp_dir)
DEFAULT_LEASE_S = 7 * 24 * 3600.0  # only judged for an owner in another PID namespace, or an unreadable lease
MAX_LEASE_BYTES = 4096


class Lease(BaseModel):
    """The owner of one rollout directory, as its lease file holds it."""

    # extra="ignore": a lease written by another version of harness-env, with fields this one does
    # not know, still names its owner; refusing it would sweep a live owner's rollout.
    model_config = ConfigDict(extra="ignore", frozen=True)

    pid: int
    start: str  # the owner's start time in clock ticks since boot
    boot: str  # /proc/sys/kernel/random/boot_id when it was written
    pidns: str  # the owner's PID namespace (/proc/self/ns/pid)
    deadline: float  # time.time() after which the lease is stale whoever the owner is


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def own_lease(duration_s: float = DEFAULT_LEASE_S) -> Lease:
    """A lease naming this process as the owner."""
    pid = os.getpid()
    return Lease(pid=pid, start=process_starttime(pid) or "", boot=_boot_id(), pidns=_pid_namespace(), deadline=time.time() + duration_s)


def leased_name_re(prefixes: list[str]) -> re.Pattern[str]:
    """The names `<prefix>-<12 hex digits>` of leased directories: a sweep matches only these
    (which backend or harness makes which prefix is theirs to say)."""
    for prefix in prefixes:
        if not PREFIX_RE.fullmatch(prefix):
            raise ValueError(f"a leased directory prefix must match {PREFIX_RE.pattern}, got {prefix!r}")
    return re.compile(f"({'|'.join(prefixes)})-[0-9a-f]{{12}}")


def lease_path(rollout_dir: Path) -> Path:
    return rollout_dir.with_name(rollout_dir.name + LEASE_SUFFIX)


def write_lease(rollout_dir: Path, lease: Lease | None = None) -> Path:
    """Write the lease of `rollout_dir` (which need not exist yet): a new file, never through a
    link, in one write. Raises OSError (FileExistsError when one is there)."""
    path = lease_path(rollout_dir)
    data = (lease or own_lease()).model_dump_json().encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return path


def read_lease(path: Path) -> Lease | None:
    """The lease at `path`, or None when it is missing, not a regular file or not a lease."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_LEASE_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > MAX_LEASE_BYTES:
        return None
    try:
        return Lease.model_validate(json.loads(data))
    except (ValueError, ValidationError):
        return None


def owner_alive(lease: Lease) -> bool | None:
    """True or False where this process can tell; None when it cannot: the owner ran in another
    PID namespace of this boot (its pid names another process here, or none), or the lease or this
    process lacks the boot, the namespace or the start time to judge by."""
    boot, pidns = _boot_id(), _pid_namespace()
    if not (lease.boot and boot):
        return None
    if lease.boot != boot:
        return False
    if not (lease.pidns and pidns and lease.start) or lease.pidns != pidns:
        return None
    return process_starttime(lease.pid) == lease.start


def is_stale(lease: Lease, now: float | None = None) -> bool:
    """Whether what the lease covers may be swept: its owner is dead, or (owner not visible from
    here) its deadline passed. A live owner's lease is never stale, however old."""
    alive = owner_alive(lease)
    if alive is None:
        return (now if now is not None else time.time()) > lease.deadline
    return not alive


def unreadable_is_stale(mtime: float, now: float | None = None) -> bool:
    """Whether what a lease file that cannot be read or parsed covers may be swept: only once the
    file is older than any lease it can hold (DEFAULT_LEASE_S), as an expired lease would be. A
    lease being written, or one of a version this one cannot read, is a live owner's meanwhile."""
    return (now if now is not None else time.time()) - mtime > DEFAULT_LEASE_S


def leased_temp_dir(purpose: str) -> Path:
    """A new directory under the system's temporary directory with this process's lease beside
    it: a start after this process was killed removes it (sweep.sweep_temp_dirs)."""
    path = Path(tempfile.mkdtemp(prefix=f"{TEMP_DIR_PREFIX}{purpose}-"))
    write_lease(path)
    return path


def remove_leased(path: Path) -> str | None:
    """Remove a leased directory (first unmounting what is mounted at or below it: the setup
    layers' tmpfs) and then its lease; what could not be removed, or None."""
    problem = unmount_tree(path) or safefs.remove_tree(path)
    if problem is None:
        try:
            os.unlink(lease_path(path))
        except FileNotFoundError:
            pass
        except OSError as e:
            problem = f"could not remove its lease: {e.strerror}"
    return problem
