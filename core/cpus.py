"""How many CPUs this process may actually use.

`os.cpu_count()` counts the host's cores; inside a container (a Hugging Face Space, a Kubernetes
pod) the process may be pinned to fewer (CPU affinity) or throttled by a cgroup CPU quota, and a
concurrency sized from the host's count then oversubscribes the CPUs it really has. The usable
count is the smallest of: the CPUs in the affinity mask, and the cgroup quota (rounded up: a quota
of 1.5 CPUs still runs two processes at once, each part of the time).

The reading is split from the parsing so the parsing can be tested on files in a temporary
directory: `cgroup_cpu_limit(text of /proc/self/cgroup, cgroup mount root)`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def v2_quota_cpus(cpu_max: str) -> float | None:
    """CPUs allowed by a cgroup v2 `cpu.max` ("150000 100000" -> 1.5); None for "max" or junk."""
    parts = cpu_max.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    return _ratio(parts[0], parts[1])


def v1_quota_cpus(quota_us: str, period_us: str) -> float | None:
    """CPUs allowed by cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`; None for -1 (no quota)."""
    return _ratio(quota_us.strip(), period_us.strip())


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:  # absent (the root cgroup has no cpu.max), unreadable: no limit known there
        return None


def _own_and_ancestors(mount: Path, cgroup_path: str) -> list[Path]:
    """The directories of the process's cgroup and of each ancestor up to the mount root, those
    that exist here. Without a cgroup namespace the path is the host's (/docker/<id>) and does not
    exist inside the container, whose own cgroup is then mounted at the root: the root remains."""
    rel = Path(cgroup_path.strip().lstrip("/"))
    dirs = [mount / rel, *(mount / parent for parent in rel.parents)]
    return [d for d in dirs if d.is_dir()]


def cgroup_cpu_limit(proc_self_cgroup: str, root: Path = CGROUP_ROOT) -> float | None:
    """The tightest CPU quota over the process's cgroup and its ancestors (a parent's quota binds
    its children), from v2 `cpu.max` and v1 `cpu.cfs_quota_us`; None when nothing limits it."""
    limits: list[float] = []
    for line in proc_self_cgroup.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _hierarchy, controllers, path = fields
        if controllers == "":  # cgroup v2: one unified hierarchy mounted at the root
            for d in _own_and_ancestors(root, path):
                if (text := _read(d / "cpu.max")) is not None and (cpus := v2_quota_cpus(text)) is not None:
                    limits.append(cpus)
        elif "cpu" in controllers.split(","):  # cgroup v1: the cpu controller's own mount
            mounts = [root / name for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu", controllers)]
            mount = next((m for m in mounts if m.is_dir()), None)
            for d in _own_and_ancestors(mount, path) if mount else ():
                quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
                if quota is not None and period is not None and (cpus := v1_quota_cpus(quota, period)) is not None:
                    limits.append(cpus)
    return min(limits) if limits else None


def usable_cpus(affinity: int, quota: float | None) -> int:
    """min(affinity, ceil(quota)), at least 1."""
    count = affinity if quota is None else min(affinity, math.ceil(quota))
    return max(1, count)


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (os.cpu_count() where the platform has no mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def available_cpus() -> int:
    """The CPUs this process may use: its affinity mask, bounded by its cgroup's CPU quota."""
    return usable_cpus(affinity_cpus(), cgroup_cpu_limit(_read(PROC_SELF_CGROUP) or ""))
