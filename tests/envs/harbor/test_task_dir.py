import json
import os
import subprocess

import pytest

from harness_env.core.errors import InvalidRequestError
from harness_env.envs.harbor.reward import read_verifier_reward
from harness_env.envs.harbor.task_dir import find_task_in_dataset, load_task_dir, task_to_task_dir
from harness_env.models import Task
from tests import needs

harbor_task = needs.module("harbor.models.task.task", "uv sync --extra harbor")


def _task(**kw):
    base = dict(
        instruction="Create out.txt holding the word hi.",
        setup=["echo seeded > seed.txt", "mkdir -p sub"],
        verify=["test -f out.txt", "grep -q hi out.txt"],
        files={"src/main.py": "print('x')\n", "README": "r"},
        task_id="t-1",
    )
    base.update(kw)
    return Task(**base)


def test_round_trip_and_harbors_own_loader_accepts_it(tmp_path):
    out = task_to_task_dir(_task(), tmp_path / "t", agent_timeout_s=123, verify_timeout_s=45, setup_timeout_s=67)
    # Harbor's own classes accept the directory.
    ht = harbor_task.Task(out)
    assert harbor_task.Task.is_valid_dir(out)
    assert ht.instruction == "Create out.txt holding the word hi."
    assert ht.config.agent.timeout_sec == 123
    # The scripts time each command; Harbor's timeouts are their budgets: 2 commands x (timeout + 5 s grace) + 30 s.
    assert ht.config.verifier.timeout_sec == 2 * (45 + 5) + 30
    assert ht.config.environment.build_timeout_sec == 2 * (67 + 5) + 30
    assert ht.config.environment.workdir == "/app"
    # And ours reads back what we wrote.
    t = load_task_dir(out)
    assert t.instruction == ht.instruction and t.name == "t"
    assert (t.agent_timeout_s, t.verifier_timeout_s, t.build_timeout_s) == (123, 130, 174)
    assert t.workdir == "/app" and t.os == "linux"
    assert t.test_script == out.resolve() / "tests" / "test.sh"
    assert t.dockerfile is not None and t.solution_dir is None and t.solve_script is None
    assert (t.files_dir / "src" / "main.py").read_text() == "print('x')\n"
    assert t.metadata["harness_env"]["task_id"] == "t-1"
    assert "echo seeded > seed.txt" in t.setup_script.read_text()


def test_setup_script_runs_in_the_workdir(tmp_path):
    # setup.sh cd's to the Task's workdir (/app); run it with the workdir rewritten to a temp dir.
    out = task_to_task_dir(_task(), tmp_path / "t", agent_timeout_s=10, verify_timeout_s=10, workdir=str(tmp_path / "w"))
    (tmp_path / "w").mkdir()
    subprocess.run(["bash", str(out / "environment" / "setup.sh")], check=True)
    assert (tmp_path / "w" / "seed.txt").read_text() == "seeded\n"


def _verify(tmp_path, task, agent_cmd=None, verify_timeout_s=10):
    work, verifier = tmp_path / "work", tmp_path / "verifier"
    work.mkdir()
    out = task_to_task_dir(task, tmp_path / "t", agent_timeout_s=10, verify_timeout_s=verify_timeout_s)
    if agent_cmd:
        subprocess.run(["bash", "-c", agent_cmd], check=True, cwd=work)
    env = {**os.environ, "HARNESS_ENV_WORKDIR": str(work), "HARNESS_ENV_VERIFIER_DIR": str(verifier)}
    r = subprocess.run(["bash", str(out / "tests" / "test.sh")], env=env, capture_output=True, text=True, timeout=120)  # a hang fails
    assert r.returncode == 0, r.stderr
    return verifier


def test_test_sh_writes_passed_over_total(tmp_path):
    verifier = _verify(tmp_path, _task(verify=["test -f out.txt", "grep -q bye out.txt", "true"]), "echo hi > out.txt")
    assert read_verifier_reward(verifier, None) == (pytest.approx(2 / 3), "reward_txt", [])
    lines = [json.loads(line) for line in (verifier / "verify_results.jsonl").read_text().splitlines()]
    assert [(e["index"], e["exit_code"], e["timed_out"]) for e in lines] == [(0, 0, False), (1, 1, False), (2, 0, False)]


def test_each_verify_command_has_its_own_timeout(tmp_path):
    verifier = _verify(tmp_path, _task(verify=["sleep 600", "exit 124", "test -f out.txt"]), "echo hi > out.txt", verify_timeout_s=1)
    # The hung command was killed (timed out below); the script went on to the others.
    assert read_verifier_reward(verifier, None)[:2] == (pytest.approx(1 / 3), "reward_txt")
    lines = [json.loads(line) for line in (verifier / "verify_results.jsonl").read_text().splitlines()]
    # exit 124 from a quick command is its own exit code, not a timeout
    assert [(e["exit_code"], e["timed_out"]) for e in lines] == [(124, True), (124, False), (0, False)]
    assert lines[0]["duration_s"] >= 1


def test_a_quick_exit_124_under_a_sub_second_timeout_is_not_a_timeout(tmp_path):
    verifier = _verify(tmp_path, _task(verify=["exit 124", "sleep 600"]), verify_timeout_s=0.9)
    lines = [json.loads(line) for line in (verifier / "verify_results.jsonl").read_text().splitlines()]
    # The same sub-second timeout does stop a command that outlasts it.
    assert [(e["exit_code"], e["timed_out"]) for e in lines] == [(124, False), (124, True)]


def test_each_setup_command_has_its_own_timeout(tmp_path):
    out = task_to_task_dir(
        _task(setup=["sleep 600", "touch never"]), tmp_path / "t", agent_timeout_s=10, verify_timeout_s=10, setup_timeout_s=1, workdir=str(tmp_path / "w")
    )
    (tmp_path / "w").mkdir()
    r = subprocess.run(["bash", str(out / "environment" / "setup.sh")], capture_output=True, text=True, timeout=120)  # a hang fails
    assert r.returncode == 124 and "setup command #1 timed out after 1.0s" in r.stderr
    assert not (tmp_path / "w" / "never").exists()  # the first failure stops setup


def test_a_setup_command_that_fails_quickly_with_124_is_not_called_a_timeout(tmp_path):
    out = task_to_task_dir(
        _task(setup=["exit 124", "touch never"]), tmp_path / "t", agent_timeout_s=10, verify_timeout_s=10, setup_timeout_s=30, workdir=str(tmp_path / "w")
    )
    (tmp_path / "w").mkdir()
    r = subprocess.run(["bash", str(out / "environment" / "setup.sh")], capture_output=True, text=True)
    assert r.returncode == 124 and "timed out" not in r.stderr
    assert not (tmp_path / "w" / "never").exists()


def test_setup_stops_when_the_workdir_is_missing(tmp_path):
    out = task_to_task_dir(_task(setup=["touch here"]), tmp_path / "t", agent_timeout_s=10, verify_timeout_s=10, workdir=str(tmp_path / "missing"))
    r = subprocess.run(["bash", str(out / "environment" / "setup.sh")], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode != 0 and not (tmp_path / "here").exists()


def test_a_reward_written_by_verify_wins(tmp_path):
    verifier = _verify(tmp_path, _task(verify=["false", 'echo 0.9 > "$HARNESS_ENV_REWARD_FILE"']))
    assert read_verifier_reward(verifier, None)[:2] == (0.9, "reward_txt")


def test_a_reward_json_written_by_verify_wins(tmp_path):
    verifier = _verify(tmp_path, _task(verify=["""echo '{"reward": 0.3}' > "$(dirname "$HARNESS_ENV_REWARD_FILE")/reward.json" """]))
    assert read_verifier_reward(verifier, None)[:2] == (0.3, "reward_json")


def test_junk_reward_written_by_verify_falls_back_to_the_ratio(tmp_path):
    verifier = _verify(tmp_path, _task(verify=["true", 'echo nope > "$HARNESS_ENV_REWARD_FILE"']))
    assert read_verifier_reward(verifier, None)[:2] == (1.0, "reward_txt")


def test_a_stale_reward_from_the_agent_is_dropped(tmp_path):
    verifier = tmp_path / "verifier"
    verifier.mkdir()
    (verifier / "reward.txt").write_text("1.0")
    verifier = _verify(tmp_path, _task(verify=["false"]))
    assert read_verifier_reward(verifier, None)[:2] == (0.0, "reward_txt")


@pytest.mark.parametrize(
    "plant",
    [
        'echo 1.0 > forged; ln -sf "$PWD/forged" "$HARNESS_ENV_REWARD_FILE"',  # a link to a forged reward
        'mkfifo "$HARNESS_ENV_REWARD_FILE"',  # grep on it would wait for ever
        'echo 1.0 > forged; ln -s "$PWD/forged" "$(dirname "$HARNESS_ENV_REWARD_FILE")/reward.json"',
        'mkfifo "$(dirname "$HARNESS_ENV_REWARD_FILE")/reward.json"',
        'mkdir -p "$HARNESS_ENV_REWARD_FILE/x"',
    ],
)
def test_a_reward_file_that_is_not_a_regular_file_is_dropped_for_the_ratio(tmp_path, plant):
    verifier = _verify(tmp_path, _task(verify=["false", plant]))  # one of two passed
    assert read_verifier_reward(verifier, None)[:2] == (0.5, "reward_txt")
    assert not (verifier / "reward.txt").is_symlink() and not (verifier / "reward.json").exists()


def test_no_verify_commands_write_no_reward(tmp_path):
    verifier = _verify(tmp_path, _task(verify=[]))
    assert read_verifier_reward(verifier, None)[:2] == (None, None)


def test_quoting_survives_hostile_commands(tmp_path):
    verifier = _verify(tmp_path, _task(verify=["""[ "$(echo 'a b' "c'd")" = "a b c'd" ]""", "echo $((1+1)) | grep -q 2"]))
    assert read_verifier_reward(verifier, None)[:2] == (1.0, "reward_txt")


def test_out_dir_must_be_empty(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "x").write_text("")
    with pytest.raises(InvalidRequestError, match="not an empty directory"):
        task_to_task_dir(_task(), tmp_path / "t", agent_timeout_s=1, verify_timeout_s=1)


def test_workdir_must_be_plain_absolute(tmp_path):
    with pytest.raises(InvalidRequestError, match="workdir"):
        task_to_task_dir(_task(), tmp_path / "t", agent_timeout_s=1, verify_timeout_s=1, workdir="/a$(x)")


def _harbor_dir(d, toml="[verifier]\ntimeout_sec = 12.0\n", instruction="Do.", test=True, env=True):
    d.mkdir(parents=True)
    (d / "task.toml").write_text(toml)
    if instruction is not None:
        (d / "instruction.md").write_text(instruction)
    if test:
        (d / "tests").mkdir()
        (d / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    if env:
        (d / "environment").mkdir()
        (d / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\n")
    return d


def test_load_a_handwritten_harbor_task(tmp_path):
    d = _harbor_dir(tmp_path / "hello", toml='[agent]\ntimeout_sec = 5.0\n[environment]\ndocker_image = "x:1"\n', instruction="<!-- canary abc -->\n\nSay hi.")
    (d / "solution").mkdir()
    (d / "solution" / "solve.sh").write_text("echo hi\n")
    t = load_task_dir(d)
    assert t.instruction == "Say hi." and t.agent_timeout_s == 5.0
    assert t.verifier_timeout_s == 600.0 and t.build_timeout_s == 600.0  # Harbor's defaults
    assert t.docker_image == "x:1" and t.solve_script == d.resolve() / "solution" / "solve.sh"
    assert t.files_dir is None and t.setup_script is None


def test_missing_instruction(tmp_path):
    with pytest.raises(InvalidRequestError, match="instruction.md"):
        load_task_dir(_harbor_dir(tmp_path / "t", instruction=None))


def test_missing_test_sh(tmp_path):
    with pytest.raises(InvalidRequestError, match="test.sh"):
        load_task_dir(_harbor_dir(tmp_path / "t", test=False))


def test_invalid_toml(tmp_path):
    with pytest.raises(InvalidRequestError, match="invalid Harbor task directory"):
        load_task_dir(_harbor_dir(tmp_path / "t", toml="[agent\n"))


def test_invalid_config_value(tmp_path):
    with pytest.raises(InvalidRequestError, match="timeout_sec"):
        load_task_dir(_harbor_dir(tmp_path / "t", toml='[verifier]\ntimeout_sec = "soon"\n'))


def test_missing_dir_and_toml(tmp_path):
    with pytest.raises(InvalidRequestError, match="does not exist"):
        load_task_dir(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidRequestError, match="task.toml"):
        load_task_dir(tmp_path / "empty")


def test_find_task_in_dataset(tmp_path):
    ds = tmp_path / "ds"
    for name in ["b-task", "a-task", "c-task"]:
        _harbor_dir(ds / name)
    (ds / "not-a-task").mkdir()
    assert find_task_in_dataset(ds, None, 0).name == "a-task"
    assert find_task_in_dataset(ds, "", 2).name == "c-task"
    with pytest.raises(InvalidRequestError, match="out of range.*3 tasks"):
        find_task_in_dataset(ds, None, 3)
    with pytest.raises(InvalidRequestError, match="no split 'train'.*not-a-task"):
        find_task_in_dataset(ds, "train", 0)
    _harbor_dir(ds / "train" / "z-task")
    assert find_task_in_dataset(ds, "train", 0).name == "z-task"
