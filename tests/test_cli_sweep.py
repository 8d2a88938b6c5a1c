"""`harness-env run` killed with SIGKILL mid-agent cannot clean up: its rollout directory, tmpfs,
cgroup, capture socket (and, in plain mode, the agent's processes) stay. The next `run` sweeps
them all, and a live run's rollout sharing the directory is left alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness_env.core.procs import is_running
from harness_env.core.sandbox.cgroups.layout import detect
from harness_env.core.sandbox.host import mounts_at_or_below
from harness_env.core.sandbox.processes import marked_pids

CLI = [sys.executable, "-m", "harness_env.cli"]
pytestmark = pytest.mark.e2e


def _whitebox_run(policy_server, model: str, *flags: str) -> list[str]:
    """`harness-env run` of task.json with the white-box harness against the scripted policy."""
    return [*CLI, "run", "--harness", "whitebox", "--task", "task.json", "--base-url", policy_server.base_url, "--model", model, *flags]


def _start_run(tmp_path: Path, policy_server, model: str, sandbox: str, env: dict[str, str]) -> subprocess.Popen:
    argv = _whitebox_run(policy_server, model, "--sandbox", sandbox, "--agent-timeout-s", "300")
    return subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish_run(tmp_path: Path, argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _alive(name: str, within_s: float = 5.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (pids := [p for p in marked_pids(name) if is_running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


def _cgroups_of(pid: int) -> list[str]:
    layout, _ = detect()
    found = []
    for parent in layout.dirs if layout else []:
        found += [str(parent / n) for n in (os.listdir(parent) if parent.is_dir() else []) if n.startswith(f"server-{pid}-")]
    return found


@pytest.mark.parametrize("sandbox", ["bwrap", "plain"])
def test_a_run_killed_mid_agent_is_swept_by_the_next_run(short_tmp, policy_server, sandbox):
    policy_server.policy.scripts["slow"] = [{"bash": "sleep 300"}, {"text": "done"}]
    policy_server.policy.scripts["quick"] = [{"text": "done"}]
    (short_tmp / "task.json").write_text(json.dumps({"instruction": "wait", "verify": ["true"]}))
    sandboxes = short_tmp / "sandboxes"
    sandboxes.mkdir()
    env = {**os.environ, "HARNESS_ENV_SANDBOX_DIR": str(sandboxes), "TMPDIR": str(short_tmp)}

    killed = _start_run(short_tmp, policy_server, "slow", sandbox, env)
    live = _start_run(short_tmp, policy_server, "slow", sandbox, env)  # another run sharing the directory
    try:
        names: set[str] = set()
        deadline = time.monotonic() + 60
        while len(names) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
            names = {n for n in os.listdir(sandboxes) if not n.endswith(".lease")}
        by_owner = {int(_owner(sandboxes, n)): n for n in names}
        killed_name, live_name = by_owner[killed.pid], by_owner[live.pid]
        _wait_for_agent_of(killed_name)
        _wait_for_agent_of(live_name)
        killed.send_signal(signal.SIGKILL)
        killed.communicate(timeout=30)

        # What the kill left: the directory and its lease, its tmpfs, its cgroup, the capture socket.
        assert {killed_name, killed_name + ".lease"} <= set(os.listdir(sandboxes))
        if os.geteuid() == 0:
            assert mounts_at_or_below((sandboxes / killed_name).resolve()) != []
        assert _cgroups_of(killed.pid) != [] or detect()[0] is None
        assert any(n.startswith(f"harness-env-capture-{killed.pid}-") for n in os.listdir(short_tmp))

        # A command line with a mistake is refused in its one line: nothing is swept before the input is good.
        bad = _finish_run(short_tmp, _whitebox_run(policy_server, "quick", "--max-turns", "0"), env, timeout=120)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "max_turns" in bad.stderr, bad.stderr
        assert {killed_name, killed_name + ".lease"} <= set(os.listdir(sandboxes))

        after = _finish_run(short_tmp, _whitebox_run(policy_server, "quick", "--sandbox", sandbox), env, timeout=240)
        assert after.returncode == 0, after.stderr
        assert f"removed rollout {killed_name} of a dead owner" in after.stderr
        assert json.loads(after.stdout)["reward"] == 1.0

        assert set(os.listdir(sandboxes)) == {live_name, live_name + ".lease"}  # the live run's is untouched
        assert mounts_at_or_below((sandboxes / killed_name).resolve()) == []
        assert _alive(killed_name) == [] and _cgroups_of(killed.pid) == []
        assert not any(n.startswith(f"harness-env-capture-{killed.pid}-") for n in os.listdir(short_tmp))
        assert _alive(live_name, 0) != []  # its agent still runs
    finally:
        for p in (killed, live):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.communicate(timeout=60)
    assert os.listdir(sandboxes) == [] and mounts_at_or_below(sandboxes.resolve()) == []
    assert [n for n in os.listdir(short_tmp) if n.startswith("harness-env")] == []


def _owner(sandboxes: Path, name: str) -> int:
    return json.loads((sandboxes / f"{name}.lease").read_text())["pid"]


def _wait_for_agent_of(name: str) -> None:
    deadline = time.monotonic() + 60
    while not any(_cmdline(pid).startswith(b"sleep\0") for pid in marked_pids(name)):
        assert time.monotonic() < deadline, f"the agent of {name} never started its command"
        time.sleep(0.1)
