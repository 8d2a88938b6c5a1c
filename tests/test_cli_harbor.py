"""`harness-env run` on Harbor task and dataset directories, `harness-env harbor-tasks`, and the
one-line errors for combinations that cannot work."""

import json
import subprocess

import pytest

from harness_env import cli
from harness_env.models import Task
from tests import needs
from tests.test_cli import CLI, _run

needs.module("harbor.models.task.task", "uv sync --extra harbor")
from harness_env.envs.harbor.task_dir import task_to_task_dir  # noqa: E402

NO_ENDPOINT = ["--base-url", "http://127.0.0.1:9/v1", "--model", "m"]


def _dataset(root):
    """root/ds/{alpha,beta}: write a word into /app/out.txt (each with its oracle solution), and a
    plain task file root/t.json."""
    for name, word in (("alpha", "hello"), ("beta", "world")):
        task = Task(instruction=f"Write the word {word} into /app/out.txt.\nSecond line.", verify=[f"grep -qx {word} /app/out.txt"])
        out = task_to_task_dir(task, root / "ds" / name, agent_timeout_s=60, verify_timeout_s=60, setup_timeout_s=60)
        (out / "solution").mkdir()
        (out / "solution" / "solve.sh").write_text(f"#!/usr/bin/env bash\necho {word} > /app/out.txt\n")
    (root / "t.json").write_text(json.dumps({"instruction": "Write hi into hi.txt.", "verify": ["grep -qx hi hi.txt"], "task_id": "plain"}))
    return root / "ds"


@pytest.mark.e2e
@pytest.mark.usefixtures("needs_bwrap")
def test_run_harbor_task_dir_dataset_and_converted_task(tmp_path, policy_server):
    _dataset(tmp_path)
    runs = {  # three CLI processes at once: each pays Harbor's first-trial import (~10 s) in parallel
        "dir": ["--task", "ds/alpha", "--agent", "oracle", "--rows-out", "rows.jsonl"],
        "dataset": ["--task", "ds", "--task-index", "1", "--agent", "oracle", "--quiet"],
        "converted": ["--task", "t.json", "--agent", "nop", "--quiet"],
    }
    procs = {
        # The oracle of "dir" calls no model: it is given no endpoint at all.
        name: subprocess.Popen(
            [*CLI, "run", *args, *([] if name == "dir" else ["--base-url", policy_server.base_url, "--model", "m"]), "--agent-timeout-s", "60"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in runs.items()
    }
    out = {name: p.communicate(timeout=240) for name, p in procs.items()}
    for name, p in procs.items():
        assert p.returncode == 0, (name, out[name][1])
    results = {name: json.loads(stdout) for name, (stdout, _) in out.items()}

    r = results["dir"]
    assert r["error"] is None and r["reward"] == 1.0, r
    assert r["harness"] == "harbor" and r["task_id"] == "alpha"
    assert r["run_info"]["agent"] == "oracle" and r["run_info"]["sandbox"] == "local"
    assert r["run_info"]["task_path"] == str((tmp_path / "ds" / "alpha").resolve())
    for phase in ("sandbox", "agent", "verify"):
        assert f"{phase}: started" in out["dir"][1]
    assert "endpoint: finished - the agent calls no model" in out["dir"][1]
    assert (tmp_path / "rows.jsonl").read_text() == ""  # the oracle called no model: no training rows

    r = results["dataset"]
    assert r["error"] is None and r["reward"] == 1.0 and r["task_id"] == "beta" and r["run_info"]["task_name"] == "beta"
    assert out["dataset"][1] == ""  # --quiet

    r = results["converted"]  # a plain task file run through Harbor: nop leaves hi.txt unwritten
    assert r["error"] is None and r["reward"] == 0.0, r
    assert r["harness"] == "harbor" and r["task_id"] == "plain" and r["run_info"]["agent"] == "nop" and r["run_info"]["task_path"] == ""


def test_harbor_tasks_table(tmp_path):
    ds = _dataset(tmp_path)
    p = _run(["harbor-tasks", str(ds)])
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split() == ["INDEX", "NAME", "INSTRUCTION"]
    assert lines[1].split(None, 2) == ["0", "alpha", "Write the word hello into /app/out.txt."]
    assert lines[2].split(None, 2) == ["1", "beta", "Write the word world into /app/out.txt."]
    assert len(lines) == 3  # one line per task: the instruction's first line only


def test_harbor_tasks_json_and_splits(tmp_path, monkeypatch, capsys):
    ds = _dataset(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["harbor-tasks", "ds", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(t["index"], t["name"], t["path"], t["has_solution"]) for t in listed] == [(0, "alpha", "alpha", True), (1, "beta", "beta", True)]
    assert listed[0]["instruction"] == "Write the word hello into /app/out.txt.\nSecond line."

    (tmp_path / "splits" / "train").mkdir(parents=True)
    (ds / "beta").rename(tmp_path / "splits" / "train" / "beta")
    assert cli.main(["harbor-tasks", "splits", "--split", "train", "--json"]) == 0
    assert [t["name"] for t in json.loads(capsys.readouterr().out)] == ["beta"]
    assert cli.main(["harbor-tasks", "splits"]) == 0  # no tasks at this level: said on stderr
    out, err = capsys.readouterr()
    assert out == "" and "no Harbor task directories in splits" in err


@pytest.mark.parametrize(
    "args,expect",
    [
        (
            ["run", "--task", "ds/alpha", "--harness", "pi"],
            "Harbor task directory: it runs with --harness harbor, not --harness pi (to run pi inside Harbor, use --agent pi)",
        ),
        (
            ["run", "--task", "ds", "--task-index", "0", "--harness", "whitebox"],
            "Harbor dataset directory: it runs with --harness harbor, not --harness whitebox",
        ),
        (
            ["run", "--task", "t.json", "--harness", "opencode", "--agent", "oracle"],
            "--agent is a Harbor option: it is for --harness harbor, not --harness opencode",
        ),
        (["run", "--task", "t.json", "--harness", "pi", "--sandbox", "docker"], "with --harness pi choose auto, bwrap or plain"),
        (["run", "--task", "ds"], "Harbor dataset directory: pick one of its tasks with --task-index N (list them with: harness-env harbor-tasks ds)"),
        (["run", "--task", "ds/alpha", "--task-index", "1"], "--task-index and --split are for a dataset directory"),
        (["run", "--task", "t.json", "--task-index", "1"], "is not a directory"),
        (["run", "--task", "empty", "--task-index", "0"], "neither a Harbor task directory (no task.toml) nor a Harbor dataset"),
        (["run", "--task", "ds", "--task-index", "5"], "task_index 5 is out of range"),
        (["run", "--task", "ds", "--task-index", "0", "--split", "train"], "has no split 'train'"),
        (["run", "--task", "ds/alpha", "--agent", "bogus"], "unknown Harbor agent 'bogus'"),
        (["run", "--task", "ds/alpha", "--agent", "aider"], "cannot run in the local sandbox"),
        (["run", "--task", "ds/alpha", "--sandbox", "plain"], "--sandbox plain: harness harbor's local environment always runs in bubblewrap"),
        (["run", "--task", "t.json", "--sandbox", "nowhere"], "unknown sandbox 'nowhere'"),
        (["harbor-tasks", "ds/alpha"], "is one Harbor task directory (it has task.toml), not a dataset"),
        (["harbor-tasks", "missing"], "does not exist"),
        (["harbor-tasks", "ds", "--split", "nope"], "split 'nope' does not exist"),
    ],
)
def test_bad_harbor_input_gives_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, expect):
    # In-process (the parsing and checks are the same; a subprocess would re-import Harbor each time).
    _dataset(tmp_path)
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        cli.main([*args, *(NO_ENDPOINT if args[0] == "run" else [])])
    out, err = capsys.readouterr()
    assert e.value.code == 2, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("harness-env: error: ") and expect in lines[0], err


def test_bad_combination_from_the_command_line(tmp_path):
    _dataset(tmp_path)
    p = _run(["run", "--task", "ds/alpha", "--harness", "opencode", *NO_ENDPOINT], cwd=tmp_path)
    assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr
    assert p.stderr.strip() == (
        "harness-env: error: --task ds/alpha is a Harbor task directory: it runs with --harness harbor, "
        "not --harness opencode (to run opencode inside Harbor, use --agent opencode)"
    )
