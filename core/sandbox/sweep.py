"""What a killed owner left: every `run`, `eval` and `serve` sweeps at start what dead owners left.

A process killed with SIGKILL cannot clean up after itself: its rollouts' tmpfs mounts, directories,
cgroups and its capture socket stay. At start, for every rollout lease (lease.py) in the sandbox
directory that is stale, the rollout's processes are killed (those carrying its marker variable;
cgroups of dead servers are killed and removed by cgroups.sweep_stale), every mount at or below its
directory is detached, the directory is removed without following a link, then the lease. A live
owner's rollouts (another server or run sharing the directory) are never touched, and nothing
outside the sandbox directory is: entries are matched by name, a link is removed, not followed,
and a directory is removed only once nothing is mounted below it.
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
from pathlib import Path

from harness_env.core.procs import kill_process, process_starttime
from harness_env.core.sandbox import safefs
from harness_env.core.sandbox.cgroups import sweep_stale
from harness_env.core.sandbox.host import sandboxes_root, unmount_tree
from harness_env.core.sandbox.lease import LEASE_SUFFIX, ROLLOUT_NAME_RE, is_stale, read_lease
from harness_env.core.sandbox.processes import marked_pids

UNREADABLE_LEASE_GRACE_S = 60.0  # a lease being written is briefly empty; one older than this is junk
SOCKET_PREFIX = "harness-env-capture-"  # core/capture/serve.py's capture_socket_path: then the owner's pid


def _stale_rollouts(root: Path, now: float) -> list[str]:
    """Names of the rollouts in `root` whose lease is stale (or junk for over a minute)."""
    names = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for entry in entries:
        name = entry.name.removesuffix(LEASE_SUFFIX)
        if not entry.name.endswith(LEASE_SUFFIX) or not ROLLOUT_NAME_RE.fullmatch(name):
            continue
        lease = read_lease(Path(entry.path))
        if lease is None:
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime < UNREADABLE_LEASE_GRACE_S:
                    continue
            except OSError:
                continue
        elif not is_stale(lease, now):
            continue
        names.append(name)
    return names


def _kill_marked(name: str, rounds: int = 50) -> int:
    """SIGKILL every process carrying rollout `name`'s marker until none is left; how many."""
    killed = 0
    for _ in range(rounds):
        pids = marked_pids(name)
        if not pids:
            break
        for pid in pids:
            kill_process(pid)
        killed += len(pids)
        time.sleep(0.05)
    return killed


def sweep_rollout(root: Path, name: str) -> str:
    """Kill, unmount and remove what rollout `name` left in `root`, then its lease. One sentence
    saying what was done or what is left (the lease stays then, for the next sweep)."""
    rollout = Path(os.path.realpath(root)) / name  # /proc/self/mounts names real paths
    killed = _kill_marked(name)
    problem = unmount_tree(rollout) or safefs.remove_tree(rollout)
    if problem:
        return f"rollout {name} of a dead owner: {problem}; left for the next start"
    try:
        os.unlink(root / (name + LEASE_SUFFIX))
    except FileNotFoundError:
        pass  # another start swept it at the same time
    except OSError as e:
        return f"rollout {name}: could not remove its lease: {e.strerror}"
    return f"removed rollout {name} of a dead owner ({killed} process(es) killed)"


def sweep_sandboxes(root: Path | None = None) -> list[str]:
    """Sweep every rollout of `root` (default: the sandbox directory) whose owner is dead or whose
    lease expired. Never raises; one sentence per rollout."""
    root = root or sandboxes_root()
    return [sweep_rollout(root, name) for name in _stale_rollouts(root, time.time())]


def _boot_time() -> float | None:
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def _socket_owner_gone(pid: int, made_at: float) -> bool:
    """Whether the process that made a socket at `made_at` is gone: no such pid, or the pid now
    names a process that started after the socket was made (reused)."""
    start = process_starttime(pid)
    if start is None:
        return True
    boot = _boot_time()
    if boot is None or not start.isdigit():
        return False
    started_at = boot + int(start) / os.sysconf("SC_CLK_TCK")
    return started_at > made_at + 2.0  # btime is whole seconds: a margin, so a live owner is never taken


def sweep_sockets(directory: str | None = None) -> list[str]:
    """Remove the capture sockets in `directory` (default: the temporary directory) whose owner is
    gone. Only this user's sockets with the capture prefix; never raises; what was removed."""
    directory = directory or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    for entry in entries:
        pid = entry.name.removeprefix(SOCKET_PREFIX).split("-", 1)[0]
        if not (entry.name.startswith(SOCKET_PREFIX) and entry.name.endswith(".sock") and pid.isdigit()):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid() or not _socket_owner_gone(int(pid), st.st_mtime):
                continue
            os.unlink(entry.path)
            removed.append(entry.path)
        except OSError:
            continue
    return removed


def sweep_at_start() -> list[str]:
    """What every `run`, `eval` and `serve` does first: the cgroups of dead servers, the rollouts
    of dead owners in the sandbox directory, and dead owners' capture sockets. Never raises."""
    notes = list(sweep_stale())
    notes += sweep_sandboxes()
    notes += [f"removed the capture socket {path} of a dead process" for path in sweep_sockets()]
    return notes
