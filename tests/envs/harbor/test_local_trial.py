"""Harbor's own Trial (oracle / nop agents, Harbor's verifier) on our bubblewrap environment."""

import asyncio
import os

import pytest

from harness_env.core.sandbox.local import bwrap_available
from harness_env.envs.harbor.config import trial_config
from harness_env.envs.harbor.task_dir import task_to_task_dir
from harness_env.models import HarborOptions, Task

pytest.importorskip("harbor.trial.trial", reason="install the extra: uv sync --extra harbor")
pytestmark = pytest.mark.skipif(not bwrap_available(), reason="needs bubblewrap: apt-get install bubblewrap")

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
        opts, task_dir=task_dir, trials_dir=tmp_path / "trials", trial_name="t", proxy_base_url="http://127.0.0.1:9/v1",
        session_key="unused", model="m", agent_timeout_s=60, setup_timeout_s=60, verify_timeout_s=60,
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
            environment_dir=tmp_path, environment_name="x", session_id="x__env",
            trial_paths=TrialPaths(tmp_path / "trial"), task_env_config=EnvironmentConfig(workdir="/usr/app"),
        )
