import asyncio
import contextlib
import os
import time
from pathlib import Path

import pytest

from harness_env.core.errors import SandboxError
from harness_env.core.procs import is_running
from harness_env.core.sandbox.host import mounts_at_or_below
from harness_env.core.sandbox.local import create_local_sandbox
from harness_env.core.sandbox.processes import marked_pids
from tests import needs

BACKENDS = [False, True]


def _need_bwrap(use_bwrap):
    if use_bwrap:
        needs.bwrap()


@pytest.mark.parametrize("use_bwrap", BACKENDS)
async def test_environment_is_scrubbed_and_private(use_bwrap, monkeypatch):
    _need_bwrap(use_bwrap)
    monkeypatch.setenv("OPENAI_API_KEY", "host-secret-value")
    monkeypatch.setenv("HF_TOKEN", "host-token-value")
    sb = create_local_sandbox(use_bwrap=use_bwrap)
    try:
        r = await sb.exec("env; echo CWD=$PWD", timeout=10)
        assert r.exit_code == 0
        assert "host-secret-value" not in r.stdout and "host-token-value" not in r.stdout
        assert "CUDA_VISIBLE_DEVICES=\n" in r.stdout
        assert f"HOME={sb.home}" in r.stdout and f"CWD={sb.workspace}" in r.stdout
        assert sb.backend == ("bwrap" if use_bwrap else "plain")
        if not use_bwrap:
            assert "bubblewrap not available" in sb.notes[0]
    finally:
        await sb.close()


@pytest.mark.parametrize("use_bwrap", BACKENDS)
async def test_timeout_kills_the_whole_group_and_close_leaves_nothing(use_bwrap):
    _need_bwrap(use_bwrap)
    sb = create_local_sandbox(use_bwrap=use_bwrap)
    root = sb.root
    # A background child, and one that escapes the process group with setsid.
    r = await sb.exec("sleep 300 & setsid sleep 301 & echo started; sleep 302", timeout=1.0)
    assert r.timed_out and r.exit_code is None and "started" in r.stdout
    await sb.exec("setsid sleep 303 >/dev/null 2>&1 < /dev/null &", timeout=5)
    await sb.close()
    assert marked_pids(sb.sandbox_id) == []
    assert not root.exists()


@pytest.mark.parametrize("use_bwrap", BACKENDS)
async def test_output_is_bounded_keeping_the_tail(use_bwrap):
    _need_bwrap(use_bwrap)
    sb = create_local_sandbox(use_bwrap=use_bwrap)
    try:
        r = await sb.exec("head -c 300000 /dev/zero | tr '\\0' a; echo END", timeout=10, max_output=1000)
        assert r.stdout.endswith("END\n") and r.stdout_dropped > 290000 and "bytes cut" in r.stdout
    finally:
        await sb.close()


async def test_bwrap_isolation():
    _need_bwrap(True)
    other = create_local_sandbox(use_bwrap=True)
    sb = create_local_sandbox(use_bwrap=True)
    try:
        other.write_file("secret.txt", "other rollout data")
        r = await sb.exec(
            f"ls {other.root} 2>&1; touch /usr/x 2>&1; touch /etc/x 2>&1; ls /root /home; {{ echo 0.5 > /logs/verifier/reward.txt; }} 2>&1; echo ok > here.txt",
            timeout=10,
        )
        assert "No such file or directory" in r.stdout  # the other rollout is invisible
        assert r.stdout.count("Read-only file system") == 3  # /usr, /etc, and the verifier outside verify
        assert sb.read_reward_file() is None
        await asyncio.to_thread(sb.clear_reward_file)  # the verify phase: now verify commands may write it
        r = await sb.exec("echo 0.5 > /logs/verifier/reward.txt; cat /root/logs/verifier/reward.txt", timeout=10, env=sb.verify_env())
        assert "0.5" in r.stdout
        assert sb.read_reward_file().strip() == "0.5"  # the Harbor/pi_env paths map to our verifier dir
        assert sb.read_file("here.txt") == b"ok\n"
    finally:
        await sb.close()
        await other.close()


async def test_files_stay_inside_the_sandbox():
    sb = create_local_sandbox(use_bwrap=False)
    try:
        with pytest.raises(SandboxError):
            sb.write_file("../../escape.txt", "x")
        with pytest.raises(SandboxError):
            sb.write_file("/etc/passwd", "x")
        sb.write_file("a/b.txt", "hello")
        sb.write_file("bin.dat", b"\0\1\2")
        assert sb.collect_files() == {"a/b.txt": "hello"}
    finally:
        await sb.close()


async def test_reward_file_cleared_before_verify():
    sb = create_local_sandbox(use_bwrap=False)
    try:
        await sb.exec(f"echo 1.0 > {sb.reward_file}", timeout=5)
        assert sb.read_reward_file() is not None
        sb.clear_reward_file()
        assert sb.read_reward_file() is None
        assert os.path.isdir(sb.verifier_dir)
    finally:
        await sb.close()


async def test_cancellation_kills_the_command():
    sb = create_local_sandbox()
    task = asyncio.create_task(sb.exec("sleep 200", timeout=100))
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await sb.close()
    assert marked_pids(sb.sandbox_id) == [] and not Path(sb.root).exists()


@pytest.mark.parametrize("use_bwrap", BACKENDS)
async def test_commands_cancelled_as_they_start_leave_no_process(use_bwrap):
    """A rollout cancelled while its command is being started (in the starting thread, or just
    after) kills that command: nothing of it outlives the cancellation, even before close()."""
    _need_bwrap(use_bwrap)
    sb = create_local_sandbox(use_bwrap=use_bwrap)
    try:
        for delay in (0, 0, 0.001, 0.005, 0.02, 0.05):
            task = asyncio.create_task(sb.exec("sleep 300", timeout=600))
            await asyncio.sleep(delay)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for _ in range(100):
            if not marked_pids(sb.sandbox_id):
                break
            await asyncio.sleep(0.05)
        assert marked_pids(sb.sandbox_id) == []
    finally:
        await sb.close()


# A root agent's escape in plain mode: a child that leaves its session (setsid), drops the marker
# variable (env -i) and moves itself into the root cgroup of every hierarchy, records where it got
# to, then keeps writing a reward for verify to find.
ESCAPE = (
    'setsid env -i /bin/sh -c \'for f in /sys/fs/cgroup/*/cgroup.procs /sys/fs/cgroup/cgroup.procs; do echo $$ > "$f" 2>/dev/null; done;'
    ' {{ cat /proc/self/cgroup; env; }} > "$1"; while :; do echo 1 > "$0" 2>/dev/null; sleep 0.05; done\' {reward} {evidence} {token}'
    " </dev/null >/dev/null 2>&1 &\n"
    # and one that asks to be born in the host's PID namespace (an ancestor's: refused)
    "nsenter --target {host_pid} --pid -- setsid env -i /bin/sh -c 'while :; do echo 1 > \"$0\" 2>/dev/null; sleep 0.05; done'"
    " {reward} {token} </dev/null >/dev/null 2>&1 &\n"
    "for i in $(seq 100); do [ -s {evidence} ] && break; sleep 0.05; done"
)


def _running_with(token: str, within_s: float = 5.0) -> list[str]:
    """Live processes whose command line holds `token` (zombies excluded), after up to `within_s`
    for a killed one to finish exiting."""
    deadline = time.monotonic() + within_s
    while True:
        found = []
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
                if token.encode() in cmdline and is_running(int(entry)):
                    found.append(f"{entry}: {cmdline[:200]!r}")
            except (OSError, ValueError):
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.mark.parametrize("use_bwrap", BACKENDS)
async def test_a_survivor_that_leaves_its_cgroup_marker_and_session_dies_with_its_command(use_bwrap, tmp_path):
    """Nothing a command started outlives it, even a root agent's `setsid env -i` child that wrote
    itself into the root cgroups (plain mode: the command is a PID namespace's init); so no process
    is left to forge the reward during verify, and none outlives close()."""
    _need_bwrap(use_bwrap)
    sb = create_local_sandbox(use_bwrap=use_bwrap)
    token = f"escapee-{os.urandom(4).hex()}"
    evidence = f"{sb.workspace}/evidence.txt"
    try:
        r = await sb.exec(ESCAPE.format(reward=sb.reward_file, evidence=evidence, token=token, host_pid=os.getpid()), timeout=30)
        assert r.exit_code == 0, r.stderr
        seen = sb.read_file("evidence.txt")
        assert seen, "the escapee never ran"
        if not use_bwrap and os.geteuid() == 0:  # it really escaped: root cgroups, no marker
            assert b"pids:/\n" in seen or b"0::/\n" in seen, seen
            assert b"HARNESS_ENV_SANDBOX" not in seen
        assert _running_with(token) == []  # gone once its command returned
        sb.clear_reward_file()
        await asyncio.sleep(0.5)  # what a survivor would need to write again
        assert sb.read_reward_file() is None
    finally:
        await sb.close()
    assert _running_with(token) == []


@pytest.mark.parametrize("use_bwrap", BACKENDS)
async def test_a_command_sees_the_processes_of_its_own_namespace_and_ps_works(use_bwrap):
    """The namespace has a /proc of its own: its pid 1 is the rollout's init, not the host's, and
    procps finds itself (under the host's /proc `ps` died with "lookup self" whenever the pid it
    has inside the namespace was free on the host)."""
    _need_bwrap(use_bwrap)
    sb = create_local_sandbox(use_bwrap=use_bwrap)
    try:
        r = await sb.exec("ps -eo pid,args && tr '\\0' ' ' < /proc/1/cmdline", timeout=30)
        assert r.exit_code == 0, r.stderr
        pids = {line.split()[0] for line in r.stdout.splitlines()[1:-1]}
        assert str(os.getpid()) not in pids  # the server is out of view
        if not use_bwrap:
            assert "harness-env-init" in r.stdout.splitlines()[-1], r.stdout
    finally:
        await sb.close()


async def test_a_sandbox_dir_reached_through_a_link_is_unmounted_and_removed(tmp_path, monkeypatch):
    """/proc/self/mounts names real paths: the rollout's tmpfs is found (and detached) through the
    sandbox directory's real path when HARNESS_ENV_SANDBOX_DIR goes through a link (/tmp often does)."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv("HARNESS_ENV_SANDBOX_DIR", str(tmp_path / "link"))
    sb = create_local_sandbox(use_bwrap=False)
    assert (await sb.exec("echo hi > hi.txt", timeout=10)).exit_code == 0
    assert await sb.close() is None
    assert os.listdir(real) == [] and mounts_at_or_below(real) == []
