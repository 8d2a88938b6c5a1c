"""The end-of-session check (tests/leftovers.py) sees what the suite left in the default sandbox
directory, where the issue's leftovers were, not only under pytest's temporary base; and it never
blames the suite for a live stranger's rollout or for what was there before the session."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harness_env.core.procs import process_starttime
from harness_env.core.sandbox.host import mount_tmpfs, mounts_at_or_below
from harness_env.core.sandbox.lease import lease_path, own_lease, write_lease
from tests.leftovers import Before


def _rollout(root: Path, pid: int, start: str | None) -> Path:
    rollout = root / f"rollout-{os.urandom(6).hex()}"
    write_lease(rollout, own_lease().model_copy(update={"pid": pid, "start": start or "1"}))
    rollout.mkdir()
    return rollout


@pytest.fixture
def stranger():
    """A live process other than pytest: another run sharing the machine."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_what_the_session_left_in_the_default_root_is_reported_and_swept(tmp_path, stranger):
    base, default_root = tmp_path / "base", tmp_path / "harness-env"
    base.mkdir()
    default_root.mkdir()
    earlier = _rollout(default_root, _dead_pid(), None)  # there before the session: not the suite's
    before = Before.take(base, default_root)
    left = _rollout(default_root, _dead_pid(), None)
    live = _rollout(default_root, stranger.pid, process_starttime(stranger.pid))
    assert before.left_in_default_root() == sorted([left.name, lease_path(left).name])
    assert before.left_mounted() == []
    notes = before.sweep([])
    assert any(left.name in n for n in notes) and not left.exists() and not earlier.exists()  # dead owners' both go
    assert live.exists() and before.left_in_default_root() == []
    lease_path(live).unlink()
    live.rmdir()


def test_a_rollout_mount_left_in_the_default_root_is_reported(tmp_path, stranger):
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root: run the suite as root (CI and ./dev test do)")
    base, default_root = tmp_path / "base", tmp_path / "harness-env"
    base.mkdir()
    default_root.mkdir()
    before = Before.take(base, default_root)
    left, live = _rollout(default_root, _dead_pid(), None), _rollout(default_root, stranger.pid, process_starttime(stranger.pid))
    for rollout in (left, live):
        assert mount_tmpfs(rollout, 16 * 1024**2)
    try:
        assert before.left_mounted() == [str(left.resolve())]
        before.sweep(before.left_mounted())
        assert not left.exists() and mounts_at_or_below(left.resolve()) == [] and before.left_mounted() == []
    finally:
        subprocess.run(["umount", "-l", str(live)], check=False)
        subprocess.run(["umount", "-l", str(left)], check=False)
    lease_path(live).unlink()
    live.rmdir()
