"""A sandbox command's rlimits and cgroup are set by its entry shell before it execs: from its
first instruction, and for everything it starts."""

import asyncio
import contextlib
import resource
import time

import pytest

from harness_env.core.sandbox.cgroups import cgroup_support
from harness_env.core.sandbox.limits import Limits, child_rlimits, entry_argv
from harness_env.core.sandbox.local import create_local_sandbox
from tests import needs


def limits_of(text: str) -> dict[str, str]:
    """/proc/<pid>/limits as {name: soft limit}."""
    rows = {}
    for line in text.splitlines()[1:]:
        name, soft = line[:26].strip(), line[26:].split()[0]
        rows[name] = soft
    return rows


def test_the_entry_shell_caps_each_limit_at_the_hard_one():
    nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    asked = Limits(open_files=10**9, file_size_bytes=1024**3)
    got = dict(child_rlimits(asked))
    assert got[resource.RLIMIT_NOFILE] == (10**9 if nofile_hard == resource.RLIM_INFINITY else nofile_hard)
    assert got[resource.RLIMIT_FSIZE] == 1024**3 and got[resource.RLIMIT_CORE] == 0
    argv = entry_argv(child_rlimits(asked), ["/cg/a/cgroup.procs", "/cg/b/cgroup.procs"], ["echo", "hi there"])
    assert argv[0] == "/bin/sh" and argv[-5:] == ["/cg/a/cgroup.procs", "/cg/b/cgroup.procs", "--", "echo", "hi there"]


@pytest.mark.parametrize("use_bwrap", [False, True])
async def test_a_command_and_its_children_run_under_the_limits(use_bwrap):
    if use_bwrap:
        needs.bwrap()
    limits = Limits(open_files=777, file_size_bytes=64 * 1024**2)
    sb = create_local_sandbox(use_bwrap=use_bwrap, limits=limits)
    try:
        # A child of a child (bash forks cat) reads its own limits.
        r = await sb.exec("bash -c 'cat /proc/self/limits'", timeout=20)
        assert r.exit_code == 0, r.stderr
        rows = limits_of(r.stdout)
        assert rows["Max open files"] == "777"
        assert rows["Max file size"] == str(64 * 1024**2)
        assert rows["Max core file size"] == "0"
        if cgroup_support():
            # The command's processes are in the rollout's cgroup while it runs.
            running = asyncio.create_task(sb.exec("sleep 30 & sleep 31", timeout=60))
            deadline = time.monotonic() + 10
            while len(sb._cgroup.pids()) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert len(sb._cgroup.pids()) >= 2
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
        # Writing past the file-size limit fails (SIGXFSZ), as it did under a preexec function.
        big = await sb.exec("head -c 70000000 /dev/zero > big; echo rc=$?", timeout=30)
        assert "rc=0" not in big.stdout
    finally:
        await sb.close()
