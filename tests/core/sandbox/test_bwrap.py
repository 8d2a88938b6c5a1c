"""The bubblewrap command line (a pure builder) and extra binds in a real sandbox."""

import pytest

from harness_env.core.errors import SandboxError
from harness_env.core.sandbox.bwrap import BwrapSpec, bwrap_argv
from harness_env.core.sandbox.local import create_local_sandbox


def test_extra_binds_come_after_tmpfs_parents_first_and_before_the_verifier_mounts():
    spec = BwrapSpec(
        root_entries=[],
        rollout_dir="/r/x",
        sandboxes_dir="/r",
        workdir="/r/x/workspace",
        verifier_dir="/r/x/verifier",
        extra_binds={"/logs/agent": "/r/x/a", "/tests": "/r/x/t"},
    )
    argv = bwrap_argv("bwrap", spec, ["true"])
    binds = [i for i, a in enumerate(argv) if a == "--bind"]
    targets = [argv[i + 2] for i in binds]
    assert targets.index("/tests") < targets.index("/logs/agent") < targets.index("/logs/verifier")
    assert argv.index("--tmpfs") < binds[targets.index("/tests")]


async def test_extra_binds_are_visible_and_writable_inside():
    sandbox = create_local_sandbox(use_bwrap=True, ro_paths=[], extra_binds={"/tests": "harbor/tests"})
    try:
        r = await sandbox.exec("echo ok > /tests/probe && cat /tests/probe", timeout=30)
        assert r.exit_code == 0 and r.stdout.strip() == "ok"
        assert (sandbox.root / "harbor" / "tests" / "probe").read_text() == "ok\n"
    finally:
        await sandbox.close()


def test_extra_binds_need_bubblewrap():
    with pytest.raises(SandboxError):
        create_local_sandbox(use_bwrap=False, ro_paths=[], extra_binds={"/tests": "harbor/tests"})
