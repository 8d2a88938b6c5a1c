"""The start-up sweep: what a dead owner left in the sandbox directory is killed, unmounted and
removed; a live owner's rollouts, and anything outside the sandbox directory, are never touched."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from harness_env.core.procs import process_starttime
from harness_env.core.sandbox.host import mount_tmpfs, mounts_at_or_below, sandboxes_root
from harness_env.core.sandbox.lease import DEFAULT_LEASE_S, Lease, lease_path, own_lease, read_lease, write_lease
from harness_env.core.sandbox.local import create_local_sandbox
from harness_env.core.sandbox.sweep import sweep_sandboxes


@pytest.fixture
def as_root() -> None:
    """These tests mount a tmpfs, as a rollout's sandbox does: that needs root. Not a skip: a
    missing capability is a failure that says what is needed."""
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root: run the suite as root (CI and ./dev test do)")


def _owner_that_exits() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"])


def _lease_of(proc: subprocess.Popen, **changes) -> Lease:
    return own_lease().model_copy(update={"pid": proc.pid, "start": process_starttime(proc.pid), **changes})


def _leftover(root: Path, lease: Lease, *, mount: bool) -> Path:
    """A rollout directory as a killed owner leaves it: its lease, its tmpfs, a workspace."""
    rollout = root / f"rollout-{os.urandom(6).hex()}"
    write_lease(rollout, lease)
    rollout.mkdir()
    if mount:
        assert mount_tmpfs(rollout, 16 * 1024**2)
    (rollout / "workspace").mkdir()
    (rollout / "workspace" / "work.txt").write_text("x")
    return rollout


def _kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def test_a_dead_owners_rollout_is_unmounted_and_removed_and_a_live_owners_kept(as_root):
    root = sandboxes_root()
    root.mkdir(parents=True, exist_ok=True)
    live, dead = _owner_that_exits(), _owner_that_exits()
    try:
        kept = _leftover(root, _lease_of(live), mount=True)
        gone = _leftover(root, _lease_of(dead), mount=True)
        _kill(dead)
        notes = sweep_sandboxes()
        assert len(notes) == 1 and gone.name in notes[0] and "dead owner" in notes[0]
        assert not gone.exists() and not lease_path(gone).exists() and mounts_at_or_below(gone.resolve()) == []
        assert (kept / "workspace" / "work.txt").read_text() == "x" and read_lease(lease_path(kept)) is not None
        assert sweep_sandboxes() == []  # nothing more: the live owner's stays
    finally:
        _kill(live)
    assert len(sweep_sandboxes()) == 1 and os.listdir(root) == []


def test_a_reused_pid_is_not_the_owner_and_another_namespace_waits_for_the_deadline():
    root = sandboxes_root()
    root.mkdir(parents=True, exist_ok=True)
    me = os.getpid()
    reused = _leftover(root, own_lease().model_copy(update={"start": "1"}), mount=False)  # this pid, another process's start
    elsewhere = _leftover(root, own_lease().model_copy(update={"pidns": "pid:[1]", "pid": me, "start": "1"}), mount=False)
    expired = _leftover(root, own_lease().model_copy(update={"pidns": "pid:[1]", "deadline": time.time() - 1}), mount=False)
    other_boot = _leftover(root, own_lease().model_copy(update={"boot": "another-boot"}), mount=False)
    mine = _leftover(root, own_lease(), mount=False)
    swept = " ".join(sweep_sandboxes())
    assert reused.name in swept and expired.name in swept and other_boot.name in swept
    assert elsewhere.exists() and mine.exists()  # another namespace before its deadline; this process's own
    for rollout in (elsewhere, mine):
        lease_path(rollout).unlink()
        subprocess.run(["rm", "-rf", str(rollout)], check=True)


def test_the_sweep_never_reaches_outside_the_sandbox_directory(as_root, tmp_path):
    """A link in place of the rollout directory is removed, not followed; a filesystem a root agent
    bound into its workspace is detached before anything is removed, so none of its files goes."""
    root = sandboxes_root()
    root.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep")
    dead = _owner_that_exits()
    lease = _lease_of(dead)
    linked = root / f"rollout-{os.urandom(6).hex()}"
    write_lease(linked, lease)
    linked.symlink_to(outside)
    bound = _leftover(root, lease, mount=True)
    (bound / "workspace" / "host").mkdir()
    subprocess.run(["mount", "--bind", str(outside), str(bound / "workspace" / "host")], check=True)
    (bound / "workspace" / "host" / "sub").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(bound / "workspace" / "host" / "sub")], check=True)
    _kill(dead)
    notes = sweep_sandboxes()
    assert len(notes) == 2, notes
    assert (outside / "precious.txt").read_text() == "keep"
    assert os.listdir(root) == [] and mounts_at_or_below(outside.resolve()) == [] and mounts_at_or_below(root.resolve()) == []


async def test_a_dead_owners_processes_are_killed():
    """A rollout whose owner died with its commands still running: the sweep kills them first."""
    sb = create_local_sandbox()
    try:
        task = asyncio.create_task(sb.exec("sleep 300", timeout=300))
        for _ in range(100):
            if sb.alive_pids():
                break
            await asyncio.sleep(0.05)
        assert sb.alive_pids()
        dead = _owner_that_exits()
        _kill(dead)
        lease_path(sb.root).unlink()
        write_lease(sb.root, _lease_of(dead).model_copy(update={"pid": dead.pid, "start": "1"}))
        notes = sweep_sandboxes()
        assert len(notes) == 1 and "process(es) killed" in notes[0] and "(0 process" not in notes[0], notes
        assert not sb.root.exists()
        result = await task
        assert result.exit_code != 0
    finally:
        await sb.close()


def _age(path: Path, seconds: float) -> None:
    os.utime(path, (time.time() - seconds,) * 2, follow_symlinks=False)


def _remove(rollout: Path) -> None:
    lease_path(rollout).unlink()
    subprocess.run(["rm", "-rf", str(rollout)], check=True)


def test_a_lease_of_another_version_is_read_and_its_live_owners_rollout_kept():
    """A rolling upgrade, Ray replicas or `run` and `serve` of two versions share the directory: a
    lease with fields this version does not know still names its live owner, however old."""
    root = sandboxes_root()
    root.mkdir(parents=True, exist_ok=True)
    rollout = root / f"rollout-{os.urandom(6).hex()}"
    lease_path(rollout).write_text(json.dumps({**own_lease().model_dump(), "cgroup": "/x", "version": 9}))
    rollout.mkdir()
    _age(lease_path(rollout), 3600)  # a rollout that started an hour ago
    assert read_lease(lease_path(rollout)) is not None
    assert sweep_sandboxes() == [] and rollout.exists()
    _remove(rollout)


def test_an_unreadable_lease_is_kept_until_older_than_any_lease():
    """A lease this version cannot parse (a field changed type, or cut short) says nothing of its
    owner: its rollout is left alone until the file is older than DEFAULT_LEASE_S."""
    root = sandboxes_root()
    root.mkdir(parents=True, exist_ok=True)
    changed = root / f"rollout-{os.urandom(6).hex()}"
    lease_path(changed).write_text(json.dumps({**own_lease().model_dump(), "start": {"ticks": 5}}))
    junk, ancient = root / f"rollout-{os.urandom(6).hex()}", root / f"rollout-{os.urandom(6).hex()}"
    for rollout in (junk, ancient):
        lease_path(rollout).write_text("{")
    for rollout in (changed, junk, ancient):
        rollout.mkdir()
        _age(lease_path(rollout), 3600)
    _age(lease_path(ancient), DEFAULT_LEASE_S + 3600)
    swept = sweep_sandboxes()
    assert len(swept) == 1 and ancient.name in swept[0] and not ancient.exists(), swept
    assert changed.exists() and junk.exists()
    for rollout in (changed, junk):
        _remove(rollout)


def test_a_lease_lacking_what_to_judge_by_waits_for_its_deadline():
    """An owner whose start time, boot or namespace could not be read is not taken for dead."""
    root = sandboxes_root()
    root.mkdir(parents=True, exist_ok=True)
    kept = [_leftover(root, own_lease().model_copy(update={field: ""}), mount=False) for field in ("start", "boot", "pidns")]
    expired = _leftover(root, own_lease().model_copy(update={"start": "", "deadline": time.time() - 1}), mount=False)
    swept = sweep_sandboxes()
    assert len(swept) == 1 and expired.name in swept[0], swept
    assert all(rollout.exists() for rollout in kept)
    for rollout in kept:
        _remove(rollout)


def test_a_dead_owners_leased_temp_dir_is_removed_and_a_live_owners_stays(tmp_path):
    """A leased temporary directory (the web UI's Gradio cache) outlives a killed server; the next
    start removes it. A live owner's stays, and so does anything that is not a leased directory."""
    from harness_env.core.sandbox.lease import TEMP_DIR_PREFIX
    from harness_env.core.sandbox.sweep import sweep_temp_dirs

    owner = _owner_that_exits()
    dead = tmp_path / f"{TEMP_DIR_PREFIX}gradio-dead"
    (dead / "sub").mkdir(parents=True)
    (dead / "sub" / "served.json").write_text("{}")
    write_lease(dead, _lease_of(owner))
    owner.kill()
    owner.wait()
    live = tmp_path / f"{TEMP_DIR_PREFIX}gradio-live"
    live.mkdir()
    write_lease(live)
    not_a_dir = tmp_path / f"{TEMP_DIR_PREFIX}sock"
    not_a_dir.write_text("")
    write_lease(not_a_dir, _lease_of(owner))
    assert sweep_temp_dirs(tmp_path) == [f"removed {dead} of a dead process"]
    assert not dead.exists() and not lease_path(dead).exists()
    assert live.is_dir() and lease_path(live).exists() and not_a_dir.exists()


def test_a_harness_s_own_directories_are_swept_by_the_prefix_it_declares():
    """A harness that makes leased directories of its own in the sandbox directory (Harbor's
    trials) declares their prefix; the local backend's sweep knows no other name."""
    import harness_env.envs  # noqa: F401 - registers the harnesses
    from harness_env.core.sandbox.sweep import local_dir_prefixes

    assert local_dir_prefixes() == ["rollout", "harbor", "trial"]
    root = sandboxes_root()
    root.mkdir(parents=True, exist_ok=True)
    dead = _owner_that_exits()
    lease = _lease_of(dead)
    _kill(dead)
    trial, other = (root / f"{prefix}-{os.urandom(6).hex()}" for prefix in ("trial", "box"))
    for rollout in (trial, other):
        write_lease(rollout, lease)
        rollout.mkdir()
    swept = sweep_sandboxes()
    assert len(swept) == 1 and trial.name in swept[0] and not trial.exists() and not lease_path(trial).exists(), swept
    assert other.exists()  # no backend or harness here names it
    _remove(other)
