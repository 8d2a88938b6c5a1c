"""Processes on this host: killing a process group, finding processes by an environment entry,
reading /proc/<pid>/stat. Linux only; standard library only.

One place for what the sandboxes and the task families each need: a command runs in its own
session (`start_new_session=True`), so its pid is its process-group id, and killing the group
takes every child it left behind. A process that is gone (or no longer ours to signal) is not an
error: clean-up calls these after the fact and must not fail because the work is already done.
"""

from __future__ import annotations

import os
import signal


def kill_process_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to every process of group `pgid` (a session leader's pid); a group that is gone
    or not ours to signal is ignored."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_process(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to one process; one that is gone or not ours to signal is ignored."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def pids_with_env(name: str, value: str) -> list[int]:
    """PIDs (this process excluded) whose initial environment holds `name=value`: how a sandbox
    finds what its commands started even after they left their process group."""
    needle = f"{name}={value}\0".encode()
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def stat_fields(stat: str) -> list[str]:
    """The fields of a /proc/<pid>/stat line after the command name, so index 0 is field 3 (the
    state). The command name (field 2) may hold spaces and ')': split after its last ')'."""
    return stat[stat.rfind(")") + 2 :].split()


def stat_starttime(stat: str) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in ticks): with the pid, it names one process for
    good, where a pid alone can be reused."""
    fields = stat_fields(stat)
    return fields[19] if len(fields) > 19 else None


def read_stat(pid: int) -> str | None:
    """/proc/<pid>/stat, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def process_starttime(pid: int) -> str | None:
    """The start time of `pid` (see stat_starttime), or None when it is gone."""
    stat = read_stat(pid)
    return None if stat is None else stat_starttime(stat)


def is_running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (exited, waiting to be reaped)."""
    stat = read_stat(pid)
    if stat is None:
        return False
    fields = stat_fields(stat)
    return bool(fields) and fields[0] != "Z"


PR_SET_DUMPABLE = 4  # <linux/prctl.h>


def make_undumpable() -> bool:
    """Keep processes of this process's own uid out of it: no /proc/<pid>/environ, mem or fd
    listing, no ptrace, no core dump. The server holds its token and the upstream keys in its
    environment and memory, and in the plain sandbox an agent runs as the server's own user.
    Children are dumpable again after their exec (they hold only their capture key). Returns
    whether it took (not on a platform without prctl)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
