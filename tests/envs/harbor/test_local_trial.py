"""Harbor's own Trial (oracle / nop agents, Harbor's verifier) on our bubblewrap environment."""

import asyncio
import json
import os

import pytest

from harness_env.envs.harbor.config import trial_config
from harness_env.envs.harbor.options import HarborOptions
from harness_env.envs.harbor.task_dir import task_to_task_dir
from harness_env.models import Task
from tests import needs

needs.module("harbor.trial.trial", "uv sync --extra harbor")
pytestmark = [pytest.mark.usefixtures("needs_bwrap"), pytest.mark.slow]  # Harbor trials: not in the fast tier

from harness_env.envs.harbor.local_env import LocalHarborEnvironment  # noqa: E402
from harness_env.envs.harbor.trial import run_harbor_trial  # noqa: E402


def _hello_task_dir(tmp_path, *, solve=True, setup=None, files=None):
    task = Task(
        instruction="Write the word hello into /app/hello.txt.",
        setup=setup or [],
        verify=["grep -qx hello /app/hello.txt", "grep -qx hello hello.txt"],
        files=files or {},
    )
    out = task_to_task_dir(task, tmp_path / "hello-world", agent_timeout_s=60, verify_timeout_s=60, setup_timeout_s=60)
    if solve:  # Harbor's oracle runs <task>/solution/solve.sh at /solution/solve.sh
        (out / "solution").mkdir()
        (out / "solution" / "solve.sh").write_text("#!/usr/bin/env bash\necho hello > /app/hello.txt\n")
    return out


def _marked_processes() -> list[int]:
    sandboxes = os.environ["HARNESS_ENV_SANDBOX_DIR"]
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if sandboxes.encode() in f.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def _run(task_dir, agent, tmp_path, timeout_s=120, stop=None):
    opts = HarborOptions(agent=agent)  # oracle / nop: no model, so no endpoint options
    config = trial_config(
        opts,
        task_dir=task_dir,
        trials_dir=tmp_path / "trials",
        trial_name="t",
        proxy_base_url="http://127.0.0.1:9/v1",
        session_key="unused",
        model="m",
        agent_timeout_s=60,
        setup_timeout_s=60,
        verify_timeout_s=60,
    )
    return asyncio.run(run_harbor_trial(config, timeout_s=timeout_s, stop=stop))


def test_oracle_writes_harbor_logs_and_per_command_results(tmp_path):
    out = _run(_hello_task_dir(tmp_path), "oracle", tmp_path)
    assert out.exception is None, out.notes
    assert out.reward == 1.0 and out.reward_source == "reward_txt", out.notes
    assert (out.verifier_dir / "verify_results.jsonl").read_text().count('"exit_code": 0') == 2
    assert (out.agent_dir / "oracle.txt").is_file()
    assert _marked_processes() == []


def test_files_and_setup_reach_the_workdir(tmp_path):
    # The oracle only copies a seeded file: files/ and setup.sh ran in /app before the agent.
    task_dir = _hello_task_dir(tmp_path, solve=False, files={"seed.txt": "hel"}, setup=["cat seed.txt > seeded; echo lo >> seeded"])
    (task_dir / "solution").mkdir()
    (task_dir / "solution" / "solve.sh").write_text("tr -d '\\n' < /app/seeded > /app/hello.txt; echo >> /app/hello.txt\n")
    out = _run(task_dir, "oracle", tmp_path)
    assert out.reward == 1.0, out.notes


def test_a_failing_setup_is_reported_not_raised(tmp_path):
    task_dir = _hello_task_dir(tmp_path, setup=["exit 3"])
    out = _run(task_dir, "oracle", tmp_path)
    assert out.reward is None and out.exception and "setup.sh" in out.exception, out.notes


def test_the_deadline_stops_the_trial_and_cleans_up(tmp_path):
    task_dir = _hello_task_dir(tmp_path, solve=False)
    (task_dir / "solution").mkdir()
    (task_dir / "solution" / "solve.sh").write_text("sleep 600\n")
    out = _run(task_dir, "oracle", tmp_path, timeout_s=8)
    assert out.reward is None and out.exception and "TimeoutError" in out.exception, out.notes
    assert _marked_processes() == []


def test_a_workdir_under_a_system_directory_is_refused(tmp_path):
    from harbor.models.task.config import EnvironmentConfig
    from harbor.models.trial.paths import TrialPaths

    with pytest.raises(ValueError, match="cannot map workdir"):
        LocalHarborEnvironment(
            environment_dir=tmp_path,
            environment_name="x",
            session_id="x__env",
            trial_paths=TrialPaths(tmp_path / "trial"),
            task_env_config=EnvironmentConfig(workdir="/usr/app"),
        )


# -- attacks (issue 18 items 1, 2, 5): the oracle's solve.sh stands in for the agent's shell, a
# hand-written tests/test.sh for verify commands that run the agent's code. Each trial must end
# within its deadline with no forged reward, and leave nothing behind.

NATIVE_TEST_SH = (  # Harbor's usual shape: the test writes 1 or 0 itself
    "#!/bin/bash\nif grep -qx hello /app/hello.txt; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
)


def _native_task(tmp_path, solve_sh, test_sh=NATIVE_TEST_SH):
    out = _hello_task_dir(tmp_path, solve=False)
    (out / "tests" / "test.sh").write_text(test_sh)
    (out / "solution").mkdir()
    (out / "solution" / "solve.sh").write_text("#!/usr/bin/env bash\n" + solve_sh)
    return out


def _no_rollout_left():
    root = os.environ["HARNESS_ENV_SANDBOX_DIR"]
    assert [p for p in os.listdir(root) if p.startswith("rollout-")] == []
    assert _marked_processes() == []


@pytest.mark.parametrize("plant", ["link", "fifo"])
def test_the_agent_replacing_the_verifier_dir_forges_no_reward(tmp_path, plant):
    # Issue 18 items 1-2, as written: a forged reward (1e308) behind a link in place of the
    # verifier directory, or a FIFO in its place. Whichever layer stops it (a read-only rollout
    # directory, the fresh verifier directory made before verify, the link-free copy), the
    # verifier runs on a real directory of the server's and the agent's failure scores 0.
    evil = {
        "link": 'mkdir -p "$R/workspace/.x"; echo 1e308 > "$R/workspace/.x/reward.txt"; rm -rf "$R/verifier"; ln -s "$R/workspace/.x" "$R/verifier"\n',
        "fifo": 'rm -rf "$R/verifier"; mkfifo "$R/verifier"; mkfifo /logs/verifier/reward.txt\n',
    }[plant]
    task_dir = _native_task(tmp_path, 'R=$(dirname "$HOME")\n' + evil + "true\n")
    out = _run(task_dir, "oracle", tmp_path, timeout_s=90)
    assert out.reward == 0.0 and out.reward_source == "reward_txt", (out.reward, out.notes)
    _no_rollout_left()


@pytest.mark.parametrize("plant", ["link", "fifo", "dir"])
def test_a_reward_file_that_is_no_regular_file_is_never_followed_or_waited_on(tmp_path, plant):
    # The verify step itself (running the agent's code) leaves reward.txt as a link to a "1.0"
    # the agent wrote, as a FIFO nobody writes, or as a directory: no reward, and the trial ends.
    make = {
        "link": "echo 1.0 > /app/r.txt; ln -s /app/r.txt /logs/verifier/reward.txt",
        "fifo": "mkfifo /logs/verifier/reward.txt",
        "dir": "mkdir -p /logs/verifier/reward.txt/x",
    }[plant]
    task_dir = _native_task(tmp_path, "true\n", test_sh=f"#!/bin/bash\nrm -f /logs/verifier/reward.txt\n{make}\n")
    out = _run(task_dir, "oracle", tmp_path, timeout_s=90)
    assert out.reward is None and out.reward_source is None, (out.reward, out.notes)
    assert "TimeoutError" not in (out.exception or "")
    assert any("reward.txt" in n for n in out.notes), out.notes
    _no_rollout_left()


def test_a_converted_tasks_test_sh_drops_planted_reward_files_and_scores_the_commands(tmp_path):
    # A uniform Task whose second verify command (the agent's code, say) plants a link to a "1.0"
    # as reward.txt and a FIFO as reward.json: test.sh drops both, without waiting on the FIFO,
    # and writes passed/total (one command of two failed: 0.5, not the forged 1.0).
    plant = 'echo 1.0 > /app/r.txt; ln -sf /app/r.txt "$HARNESS_ENV_REWARD_FILE"; mkfifo "$(dirname "$HARNESS_ENV_REWARD_FILE")/reward.json"'
    task = Task(instruction="x", verify=["grep -qx nope /app/hello.txt", plant])
    task_dir = task_to_task_dir(task, tmp_path / "t", agent_timeout_s=60, verify_timeout_s=60, setup_timeout_s=60)
    (task_dir / "solution").mkdir()
    (task_dir / "solution" / "solve.sh").write_text("echo hello > /app/hello.txt\n")
    out = _run(task_dir, "oracle", tmp_path)
    assert out.reward == 0.5 and out.reward_source == "reward_txt", (out.reward, out.notes)


def test_the_agents_home_never_runs_in_the_verifier(tmp_path):
    # Item 5 for Harbor's verifier: the agent's own grep first on its PATH, and a git fsmonitor in
    # its global git config that writes a reward; the verifier uses neither.
    solve = (
        'mkdir -p "$HOME/.local/bin"; printf "#!/bin/sh\\nexit 0\\n" > "$HOME/.local/bin/grep"; chmod +x "$HOME/.local/bin/grep"\n'
        "git config --global core.fsmonitor 'echo 1 > /logs/verifier/reward.txt; false'\n"
        "cd /app && git init -q . && git config user.email a@b && git config user.name a\n"
    )
    test_sh = "#!/bin/bash\ncd /app\n" + NATIVE_TEST_SH.split("\n", 1)[1] + "git status --porcelain >/dev/null 2>&1\n"
    out = _run(_native_task(tmp_path, solve, test_sh), "oracle", tmp_path)
    assert out.reward == 0.0, (out.reward, out.notes)


def test_links_in_place_of_the_agent_logs_dir_neither_leak_nor_write_outside(tmp_path):
    secret = tmp_path / "host-secret"
    secret.mkdir()
    (secret / "trajectory.json").write_text('{"steps": [{"source": "agent", "message": "host-secret-77aa"}]}')
    (secret / "oracle.txt").write_text("host-secret-77aa")
    before = sorted(p.name for p in secret.iterdir())
    solve = f"echo hello > /app/hello.txt\nrm -rf /logs/agent\nln -s {secret} /logs/agent\n"
    out = _run(_native_task(tmp_path, solve), "oracle", tmp_path)
    assert out.reward == 1.0, out.notes
    assert sorted(p.name for p in secret.iterdir()) == before  # Harbor's upload of the logs wrote nothing there
    assert not any("host-secret-77aa" in p.read_text(errors="replace") for p in out.agent_dir.rglob("*") if p.is_file())
    _no_rollout_left()


# Programs a Harbor trial's own scripts run (its verifier's test.sh, its agents' setup), copied from
# the host with their libraries into an image that has nothing else but `only-in-image`.
TRIAL_PROGRAMS = (
    "timeout",
    "mkdir",
    "cat",
    "chmod",
    "rm",
    "date",
    "grep",
    "tee",
    "env",
    "ls",
    "cp",
    "mv",
    "touch",
    "sh",
    "head",
    "tail",
    "id",
    "chown",
    "ln",
    "sed",
    "/bin/sh",
    "stdbuf",
    "/usr/libexec/coreutils/libstdbuf.so",
)


@pytest.fixture(scope="module")
def trial_image(tmp_path_factory):
    from tests.core.sandbox.test_images import _build_image

    return _build_image(tmp_path_factory.mktemp("trial-image"), programs=TRIAL_PROGRAMS)


def test_a_tasks_docker_image_is_the_trials_root(tmp_path, trial_image):
    """task.toml's docker_image: the oracle's solve.sh and the verifier run the image's program;
    without the image the same task fails its tests on the host."""
    out = _native_task(
        tmp_path / "img",
        "only-in-image > /app/hello.txt; echo hello >> /app/hello.txt\n",
        NATIVE_TEST_SH.replace("grep -qx hello /app/hello.txt", "grep -qx image-ok /app/hello.txt && test -x /usr/local/bin/only-in-image"),
    )
    toml = out / "task.toml"
    toml.write_text(toml.read_text().replace("[environment]", f"[environment]\ndocker_image = {json.dumps(trial_image)}", 1))
    res = _run(out, "oracle", tmp_path)
    assert res.exception is None and res.reward == 1.0, res.notes
    _no_rollout_left()
    toml.write_text(toml.read_text().replace(f"docker_image = {json.dumps(trial_image)}\n", ""))
    assert _run(out, "oracle", tmp_path / "host").reward == 0.0
