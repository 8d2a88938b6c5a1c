"""A local rollout's resource limits: the values, and how a command's child process applies
them before it runs (joining the rollout's cgroup, rlimits). The cgroup itself (memory, processes,
CPU) is cgroups.py's; the disk limit is the size of the rollout's tmpfs (host.py)."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from typing import Any

from harness_env.core.sandbox.cgroups import ResourceLimits


@dataclass(frozen=True)
class Limits:
    open_files: int = 16_384
    processes: int = 4_096  # RLIMIT_NPROC where commands run as the server's (non-root) user
    file_size_bytes: int = 2 * 1024**3
    collect_max_files: int = 200
    collect_max_file_bytes: int = 256 * 1024
    collect_max_total_bytes: int = 4 * 1024 * 1024
    # Per rollout, where the machine supports them (cgroups; a tmpfs needs root).
    memory_bytes: int | None = 4096 * 1024**2
    pids: int | None = 1024
    cpu_cores: float | None = None
    disk_bytes: int | None = 4096 * 1024**2
    # Not a limit: the task's image (images.py), carried here because the engine hands every
    # sandbox factory exactly this per rollout. None: the host's own system directories.
    image: str | None = None
    task_image: Any = None  # images.TaskImage: `image` pulled already (the factory's prepare, before a start place is taken)
    setup_layer: Any = None  # setuplayers.SetupLayer: a group's setup to start from

    def cgroup_limits(self) -> ResourceLimits:
        return ResourceLimits(memory_bytes=self.memory_bytes, pids=self.pids, cpu_cores=self.cpu_cores)


# Run by the host's /bin/sh between the fork and the command's exec: join the rollout's cgroup(s)
# (each path before "--"), set the rlimits, exec the command. A shell, not a preexec_fn: a
# preexec_fn makes Python fork (never vfork) with the GIL held, copying the page tables of a server
# of a few hundred MB (about 30 ms a command, during which no other rollout's I/O moved); without
# one, Popen vforks (about 1.5 ms). The rlimits are soft=hard; one the OS refuses is left as it is.
SHELL = "/bin/sh"
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || { echo "harness-env: could not join the rollout\'s cgroup $1" >&2; exit 126; }; shift; done; shift;'
# dash's (and POSIX sh's) ulimit flags; -f counts 512-byte blocks.
_ULIMIT_FLAGS = {resource.RLIMIT_NOFILE: ("-n", 1), resource.RLIMIT_FSIZE: ("-f", 512), resource.RLIMIT_CORE: ("-c", 512), resource.RLIMIT_NPROC: ("-p", 1)}


def child_rlimits(limits: Limits) -> list[tuple[int, int]]:
    """The rlimits a command gets, each capped by the hard limit this process (so its child) has."""
    wanted = [(resource.RLIMIT_NOFILE, limits.open_files), (resource.RLIMIT_FSIZE, limits.file_size_bytes), (resource.RLIMIT_CORE, 0)]
    if os.geteuid() != 0:  # per real uid: shared by every rollout of an unprivileged uid, ignored for root
        wanted.append((resource.RLIMIT_NPROC, limits.processes))
    capped = []
    for res, value in wanted:
        _soft, hard = resource.getrlimit(res)
        capped.append((res, value if hard == resource.RLIM_INFINITY else min(value, hard)))
    return capped


def entry_argv(rlimits: list[tuple[int, int]], cgroup_procs: list[str], argv: list[str]) -> list[str]:
    """`argv` started through the shell that joins the cgroups (their cgroup.procs files) and sets
    `rlimits` first, so nothing the command starts escapes them."""
    ulimits = "".join(f"ulimit {_ULIMIT_FLAGS[res][0]} {value // _ULIMIT_FLAGS[res][1]} 2>/dev/null; " for res, value in rlimits)
    return [SHELL, "-c", _JOIN + " " + ulimits + 'exec "$@"', "sh", *cgroup_procs, "--", *argv]
