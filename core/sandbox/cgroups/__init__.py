"""Per-rollout resource limits with cgroups (v1 or v2), for the local sandbox.

rlimits are per process (RLIMIT_NPROC even counts per uid, so root ignores it): they cannot bound a
rollout's memory or a fork bomb. A cgroup can, and it also names every process of the rollout,
including one that left its session with setsid, so a rollout can be killed completely.

Layout: every cgroup lives under one parent named `harness-env`, then one directory per server
process (`server-<pid>-<starttime>`), then one per rollout (the sandbox id):
  v1: <mount of each controller>/harness-env/server-<pid>-<start>/<name>  (memory, pids, cpu, freezer)
  v2: <the server's own cgroup>/harness-env/server-<pid>-<start>/<name>
The per-server level lets `sweep_stale` at start-up tell a dead server's leftovers from the live
rollouts of another server (or test run) on the same machine.

Modules: values (pure: limits, usage, the files' values and parsing), layout (detecting the
hierarchy, cgroupfs access, per-server directories), rollout (RolloutCgroup: one rollout's
lifecycle), sweep (a dead server's leftovers).
"""

from harness_env.core.sandbox.cgroups.layout import cgroup_support, cgroup_unsupported_reason
from harness_env.core.sandbox.cgroups.rollout import RolloutCgroup
from harness_env.core.sandbox.cgroups.sweep import sweep_stale
from harness_env.core.sandbox.cgroups.values import (
    CgroupUsage,
    MiB,
    ResourceLimits,
    cpu_max_value,
    cpu_quota_us,
    limit_notes_for,
    max_value,
    parse_keyed,
    parse_v1_mounts,
    parse_v2_mount,
    parse_v2_own_path,
)

__all__ = [
    "CgroupUsage",
    "MiB",
    "ResourceLimits",
    "RolloutCgroup",
    "cgroup_support",
    "cgroup_unsupported_reason",
    "cpu_max_value",
    "cpu_quota_us",
    "limit_notes_for",
    "max_value",
    "parse_keyed",
    "parse_v1_mounts",
    "parse_v2_mount",
    "parse_v2_own_path",
    "sweep_stale",
]
