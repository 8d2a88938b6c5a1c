"""The local Harbor environment's file transfers against what an agent can leave in its sandbox:
links (to host files, and in place of whole directories), FIFOs, oversized files and deep trees.
Each test plants them in a real started environment (a real rollout directory) as the agent
would, then runs the server-side operation and checks it neither follows, nor blocks, nor writes
outside the rollout directory. Whole trials with the same attacks are in test_local_trial.py."""

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from harness_env.core.errors import SandboxError
from tests import needs

needs.module("harbor.environments.base", "uv sync --extra harbor")
pytestmark = pytest.mark.usefixtures("needs_bwrap")

from harness_env.envs.harbor import local_env  # noqa: E402
from harness_env.envs.harbor.local_env import LocalHarborEnvironment  # noqa: E402

FAST_S = 10  # anything that waited on a FIFO would hang for ever: every operation gets this long


def _env(tmp_path: Path) -> LocalHarborEnvironment:
    from harbor.models.task.config import EnvironmentConfig
    from harbor.models.trial.paths import TrialPaths

    env_dir = tmp_path / "environment"
    env_dir.mkdir(exist_ok=True)
    return LocalHarborEnvironment(
        environment_dir=env_dir, environment_name="x", session_id="x__env", trial_paths=TrialPaths(tmp_path / "trial"), task_env_config=EnvironmentConfig()
    )


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, FAST_S))


@pytest.fixture
def env(tmp_path):
    e = _env(tmp_path)
    run(e.start(force_build=False))
    yield e
    run(e.stop(delete=True))


def _host(env: LocalHarborEnvironment, rel: str) -> Path:
    return env._require().root / rel


def test_a_download_copies_regular_files_only_and_notes_the_rest(env, tmp_path, monkeypatch):
    monkeypatch.setattr(local_env, "DOWNLOAD_MAX_FILE_BYTES", 1000)
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host-secret-3c2b")
    agent = _host(env, "harbor/logs/agent")
    (agent / "ok.txt").write_text("fine")
    (agent / "leak.txt").symlink_to(secret)
    (agent / "etc").symlink_to("/etc")
    os.mkfifo(agent / "pipe.txt")
    os.mkfifo(agent / "trajectory.json")
    (agent / "big.txt").write_bytes(b"x" * 5000)
    deep = agent
    for _ in range(40):
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "bottom.txt").write_text("deep")
    out = tmp_path / "out"
    run(env.download_dir("/logs/agent", out))
    copied = sorted(str(p.relative_to(out)) for p in out.rglob("*") if not p.is_dir())
    assert copied == ["ok.txt"]
    assert not any(p.is_symlink() for p in out.rglob("*"))
    note = " ".join(env.transfer_notes)
    for what in ("leak.txt: a symbolic link", "pipe.txt: a FIFO", "trajectory.json: a FIFO", "big.txt: 5000 bytes", "deeper than"):
        assert what in note, note
    assert str(tmp_path) not in note  # container-side names only


def test_a_directory_replaced_by_a_link_downloads_as_empty(env, tmp_path):
    victim = tmp_path / "victim-dir"
    victim.mkdir()
    (victim / "reward.txt").write_text("1.0")
    agent = _host(env, "harbor/logs/agent")
    os.rmdir(agent)
    agent.symlink_to(victim)
    out = tmp_path / "out"
    run(env.download_dir("/logs/agent", out))
    assert out.is_dir() and list(out.iterdir()) == []
    assert "symbolic link" in " ".join(env.transfer_notes)
    with pytest.raises(OSError):  # a single file through the link: refused, not followed
        run(env.download_file("/logs/agent/reward.txt", tmp_path / "one.txt"))
    assert not (tmp_path / "one.txt").exists()


def test_download_file_refuses_a_fifo_without_waiting_and_a_link(env, tmp_path):
    ws = _host(env, "workspace")
    os.mkfifo(ws / "pipe")
    (ws / "link").symlink_to("/etc/passwd")
    (ws / "real.txt").write_text("real")
    for name in ("pipe", "link"):
        with pytest.raises(OSError):
            run(env.download_file(f"/app/{name}", tmp_path / name))
    run(env.download_file("/app/real.txt", tmp_path / "real.txt"))
    assert (tmp_path / "real.txt").read_text() == "real"


def test_uploads_replace_planted_links_instead_of_writing_through_them(env, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")
    victim_dir = tmp_path / "victim-dir"
    victim_dir.mkdir()
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "test.sh").write_text("echo fresh\n")
    (src / "sub" / "x.txt").write_text("x")
    tests = _host(env, "harbor/tests")
    (tests / "test.sh").symlink_to(victim)  # a file through a link
    (tests / "sub").symlink_to(victim_dir)  # a directory through a link
    run(env.upload_dir(src, "/tests"))
    assert victim.read_text() == "untouched\n" and list(victim_dir.iterdir()) == []
    assert not (tests / "test.sh").is_symlink() and (tests / "test.sh").read_text() == "echo fresh\n"
    assert (tests / "sub").is_dir() and not (tests / "sub").is_symlink() and (tests / "sub" / "x.txt").read_text() == "x"
    # A FIFO or a directory in a file's place is replaced too, without waiting on it.
    os.unlink(tests / "test.sh")
    os.mkfifo(tests / "test.sh")
    run(env.upload_file(src / "test.sh", "/tests/test.sh"))
    assert (tests / "test.sh").read_text() == "echo fresh\n"
    # The whole target directory replaced by a link: replaced by a real one.
    agent = _host(env, "harbor/logs/agent")
    os.rmdir(agent)
    agent.symlink_to(victim_dir)
    run(env.upload_dir(src, "/logs/agent"))
    assert list(victim_dir.iterdir()) == [] and not agent.is_symlink() and (agent / "test.sh").is_file()
    # A link above the target: refused, nothing written.
    shutil.rmtree(agent / "sub")
    (agent / "sub").symlink_to(victim_dir)
    with pytest.raises(OSError):
        run(env.upload_file(src / "test.sh", "/logs/agent/sub/x.txt"))
    assert list(victim_dir.iterdir()) == []


def test_paths_that_go_up_or_out_are_refused(env):
    for path in ("/logs/agent/../../../etc/passwd", "/etc/passwd", "../x"):
        with pytest.raises(SandboxError):
            env.rel_path(path)
    assert env.rel_path("/logs/verifier/reward.txt") == "verifier/reward.txt"
    assert env.rel_path("/logs/agent/x") == "harbor/logs/agent/x"
    assert env.rel_path("hello.txt") == "workspace/hello.txt"


def test_the_reset_before_verify_replaces_a_verifier_dir_that_is_a_link(env, tmp_path):
    # The attack: the verifier directory replaced by a link to a directory holding a forged
    # reward (made from the host side here, as an agent could under a writable rollout directory).
    forged = _host(env, "workspace/.x")
    forged.mkdir()
    (forged / "reward.txt").write_text("1e308\n")
    verifier = _host(env, "verifier")
    os.rmdir(verifier)
    verifier.symlink_to(forged)
    with pytest.raises(SandboxError, match="no longer a directory"):  # no command runs on a swapped bind source
        run(env.exec("true"))
    env.reset_for_verification()
    assert verifier.is_dir() and not verifier.is_symlink() and list(verifier.iterdir()) == []
    assert (forged / "reward.txt").read_text() == "1e308\n"  # the link was removed, not followed
    tests = _host(env, "harbor/tests")
    assert tests.is_dir() and list(tests.iterdir()) == []
    res = run(env.exec("ls -A /logs/verifier; echo 0 > /logs/verifier/reward.txt"))
    assert res.return_code == 0 and res.stdout == "", res
    out = tmp_path / "verifier-out"
    run(env.download_dir("/logs/verifier", out))
    assert (out / "reward.txt").read_text() == "0\n"


def test_a_fifo_and_a_planted_tree_in_the_verifier_dir_are_replaced(env):
    verifier = _host(env, "verifier")
    os.rmdir(verifier)
    os.mkfifo(verifier)
    env.reset_for_verification()
    assert verifier.is_dir() and not verifier.is_symlink()
    deep = _host(env, "harbor/tests")
    for _ in range(1500):  # deeper than any recursive removal goes
        os.mkdir(deep / "d")
        deep = deep / "d"
    env.reset_for_verification()
    assert list(_host(env, "harbor/tests").iterdir()) == []


def test_a_swapped_workdir_stops_every_later_command(env, tmp_path):
    ws = _host(env, "workspace")
    os.rename(ws, _host(env, "workspace-old"))
    ws.symlink_to("/etc")  # bwrap would bind the host's /etc, writable, at /app
    with pytest.raises(SandboxError, match="workspace"):
        run(env.exec("touch /app/pwned"))
    assert not Path("/etc/pwned").exists()


def test_verify_commands_get_a_fresh_home_and_the_system_path(env):
    home = Path(env._require().home)
    wrapper = home / ".local" / "bin" / "grep"
    wrapper.write_text("#!/bin/sh\nexit 0\n")  # the agent's own grep, first on its PATH
    wrapper.chmod(0o755)
    agent_view = run(env.exec("command -v grep; echo $HOME"))
    assert agent_view.stdout.splitlines() == [str(wrapper), str(home)]
    env.reset_for_verification()
    verify_view = run(env.exec("command -v grep; echo $HOME"))
    grep, verify_home = verify_view.stdout.splitlines()
    assert grep != str(wrapper) and not grep.startswith(str(home)) and verify_home != str(home)


def test_filtered_and_excluding_downloads_happen_on_the_host(env, tmp_path):
    logs = _host(env, "harbor/logs/agent")
    (logs / "keep.txt").write_text("k")
    (logs / "drop.log").write_text("d")
    (logs / "reward.txt").write_text("1")
    (logs / "cache").mkdir()
    (logs / "cache" / "x.txt").write_text("x")
    os.mkfifo(logs / "pipe.txt")
    out = tmp_path / "filtered"
    run(env.download_dir_filtered(source_dir="/logs/agent", target_dir=out, include=["*.txt"], exclude=["cache/*"], protect=["drop.log"]))
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == ["drop.log", "keep.txt", "reward.txt"]
    out2 = tmp_path / "excluded"
    run(env.download_dir_with_exclusions(source_dir="/logs/agent", target_dir=out2, exclude=["cache", "*.log"]))
    assert sorted(str(p.relative_to(out2)) for p in out2.rglob("*") if p.is_file()) == ["keep.txt", "reward.txt"]


def test_tar_style_exclusion():
    from harness_env.envs.harbor.local_env import _tar_excluded

    assert _tar_excluded("a/node_modules/x.js", ["node_modules"])
    assert _tar_excluded("a/b.log", ["*.log"]) and _tar_excluded("a/b/c", ["b/c"])
    assert not _tar_excluded("a/bc", ["b"]) and not _tar_excluded("keep.txt", ["*.log"])
