"""Values and parsing for cgroups, pure (no root, no cgroupfs): the limits of a rollout and what
it used, the numbers written to the limit files, the files read back, and the sentences for a
result."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

CPU_PERIOD_US = 100_000
MIN_CPU_QUOTA_US = 1_000  # the kernel refuses quotas below 1 ms
V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
V2_CONTROLLERS = ("memory", "pids", "cpu")
MiB = 1024 * 1024


@dataclass(frozen=True)
class ResourceLimits:
    memory_bytes: int | None  # hard limit, swap included (v1 memsw, v2 swap.max=0)
    pids: int | None  # processes and threads at once
    cpu_cores: float | None  # CFS quota in cores (1.5 = one and a half CPUs' time)

    def __post_init__(self) -> None:
        if self.memory_bytes is not None and self.memory_bytes < MiB:
            raise ValueError(f"memory_bytes must be at least 1 MiB, got {self.memory_bytes}")
        if self.pids is not None and self.pids < 1:
            raise ValueError(f"pids must be at least 1, got {self.pids}")
        if self.cpu_cores is not None and not (math.isfinite(self.cpu_cores) and self.cpu_cores > 0):
            raise ValueError(f"cpu_cores must be a positive number, got {self.cpu_cores}")


@dataclass(frozen=True)
class CgroupUsage:
    memory_peak_bytes: int | None  # None where the kernel does not keep a peak (v2 before 5.19)
    oom_kills: int  # processes the OOM killer killed in this cgroup
    memory_limit_hit: bool  # usage reached the limit (reclaim or OOM); page cache alone can do this
    pids_limit_hit: bool  # a fork or clone failed on pids.max
    pids_limit_events: int = 0  # how many times


def cpu_quota_us(cores: float | None, period_us: int = CPU_PERIOD_US) -> int | None:
    """CFS quota per period for `cores`, or None for no limit."""
    if cores is None:
        return None
    return max(MIN_CPU_QUOTA_US, round(cores * period_us))


def cpu_max_value(cores: float | None, period_us: int = CPU_PERIOD_US) -> str:
    """v2 cpu.max: '<quota> <period>' or 'max <period>'."""
    quota = cpu_quota_us(cores, period_us)
    return f"{'max' if quota is None else quota} {period_us}"


def max_value(n: int | None) -> str:
    """v2 memory.max / pids.max and v1 pids.max: the number, or 'max'."""
    return "max" if n is None else str(n)


def parse_keyed(text: str) -> dict[str, int]:
    """'key value' lines (memory.events, pids.events, memory.oom_control, cgroup.events)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def parse_v1_mounts(mounts: str) -> dict[str, Path]:
    """Controller -> mount point of each v1 hierarchy, from /proc/self/mounts."""
    out: dict[str, Path] = {}
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup":
            for opt in parts[3].split(","):
                if opt in V1_CONTROLLERS:
                    out.setdefault(opt, Path(parts[1]))
    return out


def parse_v2_mount(mounts: str) -> Path | None:
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "cgroup2":
            return Path(parts[1])
    return None


def parse_v2_own_path(proc_cgroup: str) -> str | None:
    """The v2 path ('0::/a/b') in /proc/<pid>/cgroup, or None."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def limit_notes_for(limits: ResourceLimits, usage: CgroupUsage) -> list[str]:
    """Sentences for a result: which limit the rollout hit. Only OOM kills are reported for memory:
    reaching the limit alone is normal for page cache, which the kernel reclaims."""
    notes = []
    if usage.oom_kills and limits.memory_bytes is not None:
        n = usage.oom_kills
        notes.append(f"memory limit of {limits.memory_bytes // MiB} MiB was hit ({n} OOM kill{'' if n == 1 else 's'})")
    if usage.pids_limit_hit and limits.pids is not None:
        n = usage.pids_limit_events
        notes.append(f"process limit of {limits.pids} was hit ({n} failed fork{'' if n == 1 else 's'})")
    return notes
