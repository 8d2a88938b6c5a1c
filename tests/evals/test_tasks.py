"""What TASKS names, and the requests eval makes of it (no rollout runs)."""

import json

import pytest

from harness_env.cli import build_parser
from harness_env.cli_eval import eval_requests
from harness_env.core.errors import InvalidRequestError
from harness_env.evals.tasks import load_tasks, task_request
from harness_env.models import RolloutRequest

ENDPOINT = ["--base-url", "http://127.0.0.1:9/v1", "--model", "m"]


def _requests(tasks_path, *flags):
    return eval_requests(build_parser().parse_args(["eval", str(tasks_path), "--out", "x", *ENDPOINT, *flags]))[0]


def test_a_directory_of_task_files_in_name_order_with_unique_ids(tmp_path):
    (tmp_path / "b.json").write_text(json.dumps({"instruction": "B", "verify": ["true"]}))
    (tmp_path / "a.json").write_text(json.dumps({"instruction": "A", "task_id": "same id"}))
    (tmp_path / "c.json").write_text(json.dumps({"instruction": "C", "task_id": "same id"}))
    assert [t.task_id for t in load_tasks(tmp_path)] == ["same_id", "b", "same_id-2"]
    reqs = _requests(tmp_path, "--harness", "whitebox", "--max-turns", "3")
    assert [(tid, r.task.instruction, r.harness, r.max_turns) for tid, r in reqs] == [
        ("same_id", "A", "whitebox", 3),
        ("b", "B", "whitebox", 3),
        ("same_id-2", "C", "whitebox", 3),
    ]
    assert reqs[1][1].task.task_id == "b" and reqs[1][1].task.verify == ["true"]


def test_an_svg_icon_dataset(tmp_path):
    (tmp_path / "refs").mkdir()
    (tmp_path / "refs" / "sq.png").write_bytes(b"\x89PNG")
    record = {
        "task_id": "sq",
        "prompt": "a red square",
        "reference_png": "refs/sq.png",
        "source_svg": "<svg/>",
        "agent_timeout_s": 90,
        "verify_timeout_s": 30,
        "source": {"kind": "manual"},
    }
    (tmp_path / "tasks.jsonl").write_text(json.dumps(record) + "\n")
    ((tid, req),) = _requests(tmp_path, "--harness", "whitebox")
    assert tid == "sq" and req.task_family == "svg_icon" and req.task.instruction == "a red square"
    assert req.family_options["reference_png"] == str(tmp_path / "refs" / "sq.png") and "source_svg" not in req.family_options
    assert (req.agent_timeout_s, req.verify_timeout_s) == (90, 30)
    assert _requests(tmp_path, "--verify-timeout-s", "5")[0][1].verify_timeout_s == 5  # the command line wins
    py = RolloutRequest.model_validate(task_request(load_tasks(tmp_path)[0], {"endpoint": {"base_url": "http://h/v1", "model": "m"}}))
    assert py.task_family == "svg_icon" and py.family_options == req.family_options and py.verify_timeout_s == 30


def _harbor_task(d, instruction):
    d.mkdir(parents=True)
    (d / "task.toml").write_text("[verifier]\ntimeout_sec = 12.0\n")
    (d / "instruction.md").write_text(instruction)
    (d / "tests").mkdir()
    (d / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (d / "environment").mkdir()
    (d / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\n")


def test_a_harbor_dataset_one_request_per_task_index(tmp_path):
    _harbor_task(tmp_path / "ds" / "zeta", "Z")
    _harbor_task(tmp_path / "ds" / "alpha", "A")
    reqs = _requests(tmp_path / "ds", "--agent", "oracle")
    assert [tid for tid, _ in reqs] == ["alpha", "zeta"]
    assert [(r.harness, r.harness_options.dataset, r.harness_options.task_index) for _, r in reqs] == [
        ("harbor", str((tmp_path / "ds").resolve()), 0),
        ("harbor", str((tmp_path / "ds").resolve()), 1),
    ]
    py = RolloutRequest.model_validate(task_request(load_tasks(tmp_path / "ds")[1], {"harness_options": {"agent": "oracle"}}))
    assert py.harness == "harbor" and py.harness_options.task_index == 1 and py.harness_options.agent == "oracle"


def test_what_is_no_tasks_says_so(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidRequestError, match="holds no task"):
        load_tasks(tmp_path / "empty")
    (tmp_path / "t.jsonl").write_text('{"instruction": "x"}\nnot json\n')
    with pytest.raises(InvalidRequestError, match="line 2 is not valid JSON"):
        load_tasks(tmp_path / "t.jsonl")


@pytest.mark.parametrize("name", ["t" * 256, "é" * 300, "a/" * 200, "../" * 100 + "x", "." * 300, "x" * 10_000])
def test_any_task_id_becomes_a_bounded_directory_name(name):
    from harness_env.evals.tasks import MAX_ID_CHARS, safe_id

    safe = safe_id(name)
    assert 0 < len(safe) <= MAX_ID_CHARS and "/" not in safe and not safe.startswith(".") and safe_id(safe) == safe


def test_long_task_ids_that_share_a_start_stay_apart(tmp_path):
    from harness_env.evals.tasks import safe_id

    assert safe_id("t" * 256) != safe_id("t" * 255 + "u") and safe_id("t" * 256).startswith("t" * 80)
    (tmp_path / "a.json").write_text(json.dumps({"instruction": "A", "task_id": "t" * 256}))
    (tmp_path / "b.json").write_text(json.dumps({"instruction": "B", "task_id": "t" * 255 + "u"}))
    ids = [t.task_id for t in load_tasks(tmp_path)]
    assert len(set(ids)) == 2 and all(len(i) <= 100 for i in ids)
