"""Export's pieces without a rollout: the ATIF trajectories, the dataset card and the Hub upload plan.

No local stand-in of the Hub API is installed, so the upload itself is not run: the plan (repository,
visibility, files, card) is what `push_to_hub` hands to huggingface_hub's create_repo/upload_folder."""

import json

import pytest

from harness_env.evals.atif import build_trajectory, trajectory_of
from harness_env.evals.export import export, upload_plan
from harness_env.evals.run import attempt_path, write_atomic
from harness_env.models import RolloutResult, Turn
from harness_env.storage import ROW_COLUMNS, pack


def _result(**kw):
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    t0 = Turn(
        index=0,
        request_messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": "do it"}],
        tool_calls=[call],
        prompt_token_ids=[1, 2],
        completion_token_ids=[3, 4],
        per_token_logps=[-0.1, -0.2],
        branch=0,
        capture_level="tokens",
    )
    t1 = Turn(
        index=1,
        request_messages=[*t0.request_messages, {"role": "assistant", "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}],
        prompt_token_ids=[1, 2, 3, 4, 5],
        completion_token_ids=[6],
        per_token_logps=[-0.3],
        completion_text="done",
        parent=0,
        branch=0,
        capture_level="tokens",
    )
    return RolloutResult(rollout_id="r1", harness="whitebox", reward=1.0, proxy_turns=[t0, t1], **kw)


def test_an_atif_trajectory_from_the_turns_that_harbor_accepts():
    from harbor.models.trajectories import Trajectory

    traj = Trajectory.model_validate(build_trajectory(_result(), "m"))
    assert [s.source for s in traj.steps] == ["system", "user", "agent", "agent"]
    first = traj.steps[2]
    assert first.tool_calls[0].function_name == "bash" and first.tool_calls[0].arguments == {"command": "ls"}
    assert first.observation.results[0].content == "a.txt" and first.observation.results[0].source_call_id == "c1"
    assert first.metrics.completion_token_ids == [3, 4] and first.metrics.logprobs == [-0.1, -0.2]
    assert traj.steps[3].message == "done" and traj.final_metrics.total_completion_tokens == 3


def test_a_harbor_rollout_exports_the_trajectory_harbor_wrote():
    own = {"schema_version": "ATIF-v1.6", "agent": {"name": "terminus-2", "version": "1"}, "steps": []}
    assert trajectory_of(_result(agent_trajectory=own)) == own
    assert trajectory_of(_result())["agent"]["name"] == "whitebox"


def test_the_card_and_the_upload_plan(tmp_path):
    out = tmp_path / "run"
    write_atomic(out / "eval.json", json.dumps({"attempts": 1, "threshold": 1.0, "harness": "whitebox", "model": "m", "tasks": ["t1"]}))
    write_atomic(attempt_path(out, "t1", 0), json.dumps(pack(_result())))
    target = export(out, "jsonl")
    rows = [json.loads(line) for line in (target / "rows.jsonl").read_text().splitlines()]
    assert rows == [
        {
            "task_id": "t1",
            "attempt": 0,
            "rollout_id": "r1",
            "branch": 0,
            "turn_indices": [0, 1],
            "prompt_ids": [1, 2],
            "completion_ids": [3, 4, 5, 6],
            "loss_mask": [1, 1, 0, 1],
            "logprobs": [-0.1, -0.2, 0.0, -0.3],
            "reward": 1.0,
            "trainable": True,
            "untrainable_reason": None,
            "mask_sample": False,
            "stale": False,
        }
    ]
    assert tuple(rows[0]) == ROW_COLUMNS  # as `harness-env run --rows-out` writes them
    card = (target / "README.md").read_text()
    assert card.startswith("---\nconfigs:\n- config_name: results\n  data_files: results.jsonl\n") and "`t1`" in card and "model `m`" in card
    plan = upload_plan(target, "me/evals")
    assert plan == {
        "repo_id": "me/evals",
        "repo_type": "dataset",
        "private": True,
        "folder": str(target),
        "files": ["README.md", "results.jsonl", "rows.jsonl"],
    }
    assert upload_plan(target, "me/evals", private=False)["private"] is False
    with pytest.raises(ValueError, match="no evaluation"):
        export(tmp_path / "nothing")
