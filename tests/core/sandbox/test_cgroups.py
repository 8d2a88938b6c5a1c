"""Per-rollout cgroups, for real: OOM kill, pids limit, kill of escaped daemons, removal, sweep.

These need root and writable cgroups (v1 memory+pids, or v2 with those controllers delegated); where
they are missing the tests fail with what is missing, they do not skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness_env.core.errors import SandboxError
from harness_env.core.procs import stat_starttime
from harness_env.core.sandbox.cgroups import (
    CgroupUsage,
    MiB,
    ResourceLimits,
    RolloutCgroup,
    cgroup_support,
    cgroup_unsupported_reason,
    cpu_max_value,
    cpu_quota_us,
    limit_notes_for,
    max_value,
    parse_keyed,
    parse_v1_mounts,
    parse_v2_mount,
    parse_v2_own_path,
    sweep_stale,
)
from harness_env.core.sandbox.cgroups import layout as cgroup_layout
from harness_env.core.sandbox.cgroups.layout import SANDBOXES_CPU_WEIGHT
from harness_env.core.sandbox.limits import entry_argv

NO_LIMITS = ResourceLimits(None, None, None)


def joined(cg: RolloutCgroup, argv: list[str]) -> list[str]:
    """`argv` started as a sandbox command is: through the entry shell that joins the cgroup."""
    return entry_argv([], cg.procs_files, argv)


# -- pure helpers (no root needed) -----------------------------------------------------------------
def test_cpu_values():
    assert cpu_max_value(None) == "max 100000"
    assert cpu_max_value(1.5) == "150000 100000"
    assert cpu_max_value(0.0001) == "1000 100000"  # the kernel's 1 ms minimum
    assert cpu_quota_us(None) is None and cpu_quota_us(2) == 200_000
    assert max_value(None) == "max" and max_value(64) == "64"


def test_limits_are_validated():
    for bad in (dict(memory_bytes=10), dict(pids=0), dict(cpu_cores=float("nan")), dict(cpu_cores=0)):
        with pytest.raises(ValueError):
            ResourceLimits(**{"memory_bytes": None, "pids": None, "cpu_cores": None, **bad})


def test_parsers():
    oom_control = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"
    assert parse_keyed(oom_control) == {"oom_kill_disable": 0, "under_oom": 0, "oom_kill": 3}
    assert parse_keyed("max 7\nbad line here\n") == {"max": 7}
    mounts = (
        "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n"
        "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nsdelegate 0 0\n"
    )
    assert parse_v1_mounts(mounts) == {"cpu": Path("/sys/fs/cgroup/cpu,cpuacct"), "memory": Path("/sys/fs/cgroup/memory")}
    assert parse_v2_mount(mounts) == Path("/sys/fs/cgroup/unified")
    assert parse_v2_own_path("4:memory:/x\n0::/user.slice/a\n") == "/user.slice/a"
    assert stat_starttime("42 (a b) c) S " + " ".join(str(i) for i in range(4, 30))) == "22"


def test_limit_notes_wording():
    limits = ResourceLimits(2048 * MiB, 50, None)
    assert limit_notes_for(limits, CgroupUsage(None, 0, True, False, 0)) == []  # reclaim alone: no note
    notes = limit_notes_for(limits, CgroupUsage(2048 * MiB, 2, True, True, 1))
    assert notes == ["memory limit of 2048 MiB was hit (2 OOM kills)", "process limit of 50 was hit (1 failed fork)"]


# -- for real ---------------------------------------------------------------------------------------
def _require_cgroups() -> str:
    version = cgroup_support()
    if version is None:
        pytest.fail(
            "cgroups are not usable here: " + cgroup_unsupported_reason() + ". These tests need root and "
            "writable cgroups: v1 memory and pids controllers mounted under /sys/fs/cgroup, or v2 with "
            "memory and pids delegated to this process's cgroup"
        )
    return version


def _own_dirs() -> list[Path]:
    """This process's per-server directories (where every cgroup it makes lives)."""
    layout, _ = cgroup_layout.detect()
    assert layout is not None
    return [p / cgroup_layout.owner_name() for p in layout.dirs]


@pytest.fixture(scope="module", autouse=True)
def _nothing_left_behind() -> Iterator[None]:
    yield
    if cgroup_support() is not None:
        left = [d for d in _own_dirs() if d.exists()]
        assert left == [], f"cgroup directories left behind: {left}"


@pytest.fixture
def make() -> Iterator[Callable[..., RolloutCgroup]]:
    """Create cgroups that are removed (and checked gone) at the end of the test."""
    _require_cgroups()
    made: list[RolloutCgroup] = []

    def create(limits: ResourceLimits = NO_LIMITS, name: str | None = None) -> RolloutCgroup:
        cg = RolloutCgroup.create(name or f"rollout-t{uuid.uuid4().hex[:12]}", limits)
        assert cg is not None
        made.append(cg)
        return cg

    yield create
    for cg in made:
        cg.remove()
        assert cg.notes == [] and cg.pids() == []
        assert not any(d.exists() for d in cg.dirs)


def _wait_for(cond: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def _dead(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] in "ZX"  # a zombie has run its last instruction


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_support_is_detected():
    version = _require_cgroups()
    assert version in ("v1", "v2") and cgroup_unsupported_reason() == ""


def test_memory_limit_oom_kills_and_is_reported(make):
    cg = make(ResourceLimits(100 * MiB, None, None))
    # bytes * n touches every page, so the whole 300 MB is really charged
    proc = subprocess.run(joined(cg, [sys.executable, "-c", "b = b'x' * (300 << 20); print('allocated')"]), capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9 and "allocated" not in proc.stdout
    usage = cg.usage()
    assert usage.oom_kills >= 1 and usage.memory_limit_hit
    assert usage.memory_peak_bytes is None or usage.memory_peak_bytes <= 100 * MiB
    notes = cg.limit_notes()
    assert any("memory limit of 100 MiB was hit" in n for n in notes), notes
    cg.remove()
    assert cg.limit_notes() == notes  # read before removal, so the result can still say it


def test_pids_limit_stops_a_spawning_loop(make):
    cg = make(ResourceLimits(None, 50, None))
    # dash gives up on the first failed fork; bash would retry for 15 s first, to the same end.
    proc = subprocess.Popen(
        joined(cg, ["sh", "-c", "for i in $(seq 200); do sleep 300 & done; wait"]),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _wait_for(lambda: cg.usage().pids_limit_hit), "no fork failed under pids.max=50"
        assert 40 <= len(cg.pids()) <= 50
        assert any("process limit of 50 was hit" in n for n in cg.limit_notes())
        assert cg.kill_all() >= 40 and cg.pids() == []
    finally:
        cg.kill_all()
        _, err = proc.communicate(timeout=10)
    assert "fork" in err.lower()


def test_kill_all_stops_a_fork_bomb(make):
    cg = make(ResourceLimits(256 * MiB, 50, None))
    # bash retries failed forks, so the bomb stays at the limit, forking whenever a slot frees
    proc = subprocess.Popen(joined(cg, ["bash", "-c", "b() { b & b & wait; }; b"]), start_new_session=True, stderr=subprocess.DEVNULL)
    try:
        assert _wait_for(lambda: len(cg.pids()) >= 45)
        assert len(cg.pids()) <= 50
        assert cg.kill_all(timeout=10) >= 45
        assert cg.pids() == [] and cg.notes == []
    finally:
        cg.kill_all()
        proc.wait(timeout=10)


def test_kill_all_kills_a_setsid_double_forked_daemon(make):
    cg = make()
    # the launcher's child starts a new session and forks the daemon, then both exit: the daemon is
    # reparented, in no process group or session of ours
    subprocess.run(joined(cg, ["sh", "-c", "setsid sh -c 'sleep 300 & exit'; exit"]), start_new_session=True, timeout=10, check=True)

    def only_the_daemon() -> bool:  # the intermediate sh may still be exiting, the sleep not exec'd
        pids = cg.pids()
        return len(pids) == 1 and _cmdline(pids[0]).startswith(b"sleep")

    assert _wait_for(only_the_daemon, 5), [_cmdline(p) for p in cg.pids()]
    (daemon,) = cg.pids()
    assert os.getsid(daemon) not in (os.getsid(0), os.getpgid(0)) and not _dead(daemon)
    assert cg.kill_all() == 1
    assert cg.pids() == [] and _wait_for(lambda: _dead(daemon), 5)


def test_remove_kills_and_leaves_no_directory(make, tmp_path):
    cg = make(ResourceLimits(64 * MiB, 20, None))
    proc = subprocess.Popen(joined(cg, ["sleep", "300"]))
    assert _wait_for(lambda: cg.pids() == [proc.pid], 5)  # the entry shell joins, then execs
    owner_dirs = {d.parent for d in cg.dirs}
    cg.remove()
    assert proc.wait(timeout=5) == -9
    assert cg.notes == [] and not any(d.exists() for d in cg.dirs)
    assert not any(d.exists() for d in owner_dirs)  # the server's own directory goes with its last rollout
    cg.remove()  # idempotent
    assert cg.notes == []
    # joining a removed cgroup fails the command instead of running it unlimited
    refused = subprocess.run(joined(cg, ["touch", str(tmp_path / "ran")]), capture_output=True, text=True)
    assert refused.returncode == 126 and "could not join the rollout's cgroup" in refused.stderr
    assert not (tmp_path / "ran").exists()


def test_create_refuses_bad_and_duplicate_names(make):
    with pytest.raises(SandboxError, match="invalid cgroup name"):
        make(name="../escape")
    cg = make()
    with pytest.raises(SandboxError, match="already exists"):
        RolloutCgroup.create(cg.name, NO_LIMITS)
    assert all(d.exists() for d in cg.dirs)  # the failed duplicate took nothing of the first


def test_limit_files_are_written(make):
    version = _require_cgroups()
    cg = make(ResourceLimits(256 * MiB, 64, 1.5))
    mem, pids, cpu = (cg._dirs[c] for c in ("memory", "pids", "cpu"))
    assert (pids / "pids.max").read_text().strip() == "64"
    if version == "v1":
        assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "150000"
        assert (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
        assert (mem / "memory.limit_in_bytes").read_text().strip() == str(256 * MiB)
        if (mem / "memory.memsw.limit_in_bytes").exists():
            assert (mem / "memory.memsw.limit_in_bytes").read_text().strip() == str(256 * MiB)
        assert parse_keyed((mem / "memory.oom_control").read_text())["oom_kill_disable"] == 0
    else:
        assert (cpu / "cpu.max").read_text().strip() == "150000 100000"
        assert (mem / "memory.max").read_text().strip() == str(256 * MiB)
        if (mem / "memory.swap.max").exists():
            assert (mem / "memory.swap.max").read_text().strip() == "0"


def test_cpu_quota_throttles(make):
    cg = make(ResourceLimits(None, None, 0.1))
    # CPU time, not wall time: on a busy machine half a second of wall may hold less than the quota.
    # 0.3 s of CPU at 0.1 CPU is 3 periods' worth or more: throttled however busy the machine is.
    subprocess.run(joined(cg, [sys.executable, "-c", "import time\nwhile time.process_time() < 0.3: pass"]), timeout=60, check=True)
    stat = parse_keyed((cg._dirs["cpu"] / "cpu.stat").read_text())
    assert stat["nr_throttled"] > 0, stat


SERVER_THAT_DIES = textwrap.dedent(
    """
    import os, subprocess, sys
    from harness_env.core.sandbox.cgroups import ResourceLimits, RolloutCgroup
    from harness_env.core.sandbox.limits import entry_argv
    cg = RolloutCgroup.create(sys.argv[1], ResourceLimits(64 << 20, 20, None))
    daemon = "setsid sh -c 'sleep 300 </dev/null >/dev/null 2>&1 & exit'"
    subprocess.run(entry_argv([], cg.procs_files, ["sh", "-c", daemon]), check=True)
    print(" ".join(str(d) for d in cg.dirs), flush=True)
    os._exit(0)  # crash: no remove()
    """
)


def test_sweep_stale_removes_a_dead_servers_leftover_only(make):
    live = make()
    name = f"rollout-t{uuid.uuid4().hex[:12]}"
    out = subprocess.run([sys.executable, "-c", SERVER_THAT_DIES, name], capture_output=True, text=True, timeout=30, check=True).stdout
    dirs = [Path(p) for p in out.split()]
    try:
        assert dirs and all(d.is_dir() for d in dirs)
        daemon = int((dirs[0] / "cgroup.procs").read_text().split()[0])
        assert not _dead(daemon)
    finally:
        notes = sweep_stale()
    assert any(name in n and "1 process(es) killed" in n for n in notes), notes
    assert not any(d.exists() for d in dirs) and not any(d.parent.exists() for d in dirs)
    assert _wait_for(lambda: _dead(daemon), 5)
    assert all(d.is_dir() for d in live.dirs)  # this server's live rollout is not stale


def test_v2_membership_and_kill_paths(make, monkeypatch):
    """The v2 code on this machine's cgroup2 hierarchy (on a v1 machine: the controller-less
    'unified' mount, so membership and killing only): cgroup.kill, then the freeze path."""
    _require_cgroups()
    mounts = Path("/proc/self/mounts").read_text()
    mount = parse_v2_mount(mounts)
    if mount is None:
        pytest.fail("no cgroup2 hierarchy is mounted: mount -t cgroup2 none /sys/fs/cgroup/unified")
    layout, why = cgroup_layout.v2_layout(mount, required=())
    assert layout is not None, why
    for use_kill in (True, False):
        monkeypatch.setattr(RolloutCgroup, "use_cgroup_kill", use_kill)
        cg = RolloutCgroup.create_in(layout, f"rollout-t{uuid.uuid4().hex[:12]}", NO_LIMITS)
        try:
            proc = subprocess.Popen(joined(cg, ["sh", "-c", "setsid sh -c 'sleep 300 & sleep 300 & exit'; exec sleep 300"]))
            assert _wait_for(lambda cg=cg: [_cmdline(p)[:5] for p in cg.pids()] == [b"sleep"] * 3, 5)
            assert cg.kill_all() == 3 and cg.pids() == []
            assert proc.wait(timeout=5) == -9
        finally:
            cg.remove()
        assert cg.notes == [] and not any(d.exists() for d in cg.dirs)
        assert not (layout.dirs[0] / cgroup_layout.owner_name()).exists()


def test_every_sandbox_together_weighs_an_eighth_of_a_process_on_the_cpu(make):
    """Under CPU contention the server comes first: the shared parent of all rollout cgroups has
    an eighth of an ordinary process's CPU weight (its sandboxes still get every idle cycle)."""
    make()
    layout, _ = cgroup_layout.detect()
    assert layout is not None and "cpu" in layout.parents, "no cpu cgroup controller here: mount it (cgroup v1) or delegate it (v2)"
    name, value = SANDBOXES_CPU_WEIGHT[layout.version]
    assert (layout.parents["cpu"] / name).read_text().strip() == value
