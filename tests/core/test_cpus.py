"""The CPUs a server may use: affinity bounded by the cgroup quota (v2 cpu.max, v1 CFS quota),
read from files laid out as /sys/fs/cgroup lays them out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness_env.core import cpus
from harness_env.core.cpus import cgroup_cpu_limit, usable_cpus, v1_quota_cpus, v2_quota_cpus
from harness_env.families.svg_icon.render import render_concurrency
from harness_env.server import app as app_module


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [
        ("150000 100000\n", 1.5),
        ("200000 100000", 2.0),
        ("50000 100000", 0.5),
        ("max 100000\n", None),
        ("", None),
        ("junk", None),
        ("0 100000", None),
        ("100000 0", None),
    ],
)
def test_v2_cpu_max(cpu_max: str, expected: float | None) -> None:
    assert v2_quota_cpus(cpu_max) == expected


def test_v1_quota_minus_one_is_no_limit() -> None:
    assert v1_quota_cpus("-1\n", "100000\n") is None
    assert v1_quota_cpus("250000\n", "100000\n") == 2.5


@pytest.mark.parametrize(
    ("affinity", "quota", "expected"),
    [
        (8, 1.5, 2),  # a quota of 1.5 CPUs still runs two processes at once: rounded up
        (8, None, 8),  # no quota ("max"): the affinity mask
        (2, 6.0, 2),  # a quota above the mask: the mask
        (4, 0.1, 1),  # never below one
    ],
)
def test_usable_cpus_is_the_smallest(affinity: int, quota: float | None, expected: int) -> None:
    assert usable_cpus(affinity, quota) == expected


def test_v2_quota_of_the_process_cgroup(tmp_path: Path) -> None:
    _write(tmp_path / "kubepods/pod1/cpu.max", "150000 100000\n")
    assert cgroup_cpu_limit("0::/kubepods/pod1\n", tmp_path) == 1.5
    assert usable_cpus(16, cgroup_cpu_limit("0::/kubepods/pod1\n", tmp_path)) == 2


def test_v2_no_quota_leaves_the_affinity(tmp_path: Path) -> None:
    _write(tmp_path / "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit("0::/\n", tmp_path) is None
    assert usable_cpus(6, cgroup_cpu_limit("0::/\n", tmp_path)) == 6


def test_v2_a_parent_quota_binds_its_children(tmp_path: Path) -> None:
    _write(tmp_path / "a/cpu.max", "100000 100000\n")
    _write(tmp_path / "a/b/cpu.max", "max 100000\n")
    assert cgroup_cpu_limit("0::/a/b\n", tmp_path) == 1.0


def test_v2_container_without_the_host_path_reads_its_own_root(tmp_path: Path) -> None:
    # No cgroup namespace: /proc/self/cgroup names the host's path, absent inside the container,
    # whose own cgroup is mounted at the root.
    _write(tmp_path / "cpu.max", "300000 100000\n")
    assert cgroup_cpu_limit("0::/system.slice/docker-abc.scope\n", tmp_path) == 3.0


def test_v1_quota(tmp_path: Path) -> None:
    _write(tmp_path / "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "150000\n")
    _write(tmp_path / "cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    _write(tmp_path / "cpu,cpuacct/cpu.cfs_quota_us", "-1\n")
    _write(tmp_path / "cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    text = "12:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n"
    assert cgroup_cpu_limit(text, tmp_path) == 1.5


def test_v1_separate_cpu_mount_without_a_quota(tmp_path: Path) -> None:
    _write(tmp_path / "cpu/cpu.cfs_quota_us", "-1\n")
    _write(tmp_path / "cpu/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit("2:cpuacct:/\n1:cpu:/\n0::/\n", tmp_path) is None


def test_nothing_readable_is_no_limit(tmp_path: Path) -> None:
    assert cgroup_cpu_limit("", tmp_path) is None
    assert cgroup_cpu_limit("garbage\n0::/x\n", tmp_path / "absent") is None


def test_default_concurrency_follows_the_usable_cpus(monkeypatch) -> None:
    monkeypatch.delenv("MAX_CONCURRENT_ROLLOUTS", raising=False)
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 64)  # a big host ...
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda text, root=cpus.CGROUP_ROOT: 1.5)  # ... a 1.5-CPU container
    assert app_module.default_max_concurrent() == 4
    monkeypatch.delenv("HARNESS_ENV_RENDER_CONCURRENCY", raising=False)
    assert render_concurrency() == 2  # Chromiums grading icons at once: the usable CPUs too
    monkeypatch.setenv("MAX_CONCURRENT_ROLLOUTS", "7")
    assert app_module.default_max_concurrent() == 7


def test_this_machine() -> None:
    """On the machine running the tests: within the affinity mask, and at least one."""
    assert 1 <= cpus.available_cpus() <= len(os.sched_getaffinity(0))
