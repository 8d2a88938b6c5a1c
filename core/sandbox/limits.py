"""A local rollout's resource limits: the values, and how a command's child process applies
them before it runs (rlimits, joining the rollout's cgroup). The cgroup itself (memory, processes,
CPU) is cgroups.py's; the disk limit is the size of the rollout's tmpfs (host.py)."""

from __future__ import annotations

import os
import resource
from collections.abc import Callable
from dataclasses import dataclass

from harness_env.core.sandbox.cgroups import ResourceLimits, RolloutCgroup


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

    def cgroup_limits(self) -> ResourceLimits:
        return ResourceLimits(memory_bytes=self.memory_bytes, pids=self.pids, cpu_cores=self.cpu_cores)


def child_setup(limits: Limits, cgroup: RolloutCgroup | None) -> Callable[[], None]:
    """The preexec_fn of a command: join the cgroup (before exec, so nothing the command starts
    escapes it) and set the rlimits, each capped by what the host allows."""
    rlimits = [
        (resource.RLIMIT_NOFILE, limits.open_files),
        (resource.RLIMIT_FSIZE, limits.file_size_bytes),
        (resource.RLIMIT_CORE, 0),
    ]
    if os.geteuid() != 0:  # per real uid: shared by every rollout of an unprivileged uid, ignored for root
        rlimits.append((resource.RLIMIT_NPROC, limits.processes))

    def apply() -> None:
        if cgroup is not None:
            cgroup.join_in_child()
        for res, value in rlimits:
            try:
                soft, hard = resource.getrlimit(res)
                cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
                resource.setrlimit(res, (cap, cap))
            except (ValueError, OSError):
                pass  # the OS refuses this limit here; the others still apply

    return apply
