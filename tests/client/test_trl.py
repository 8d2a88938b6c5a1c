"""The TRL adapters: rollout_func output and loop-owning sessions, on real rollouts (white-box
harness, in-process, against the scripted fake policy)."""

import functools
import inspect
import itertools
import pickle

import pytest

from harness_env.client.trl import HarnessRolloutFunc, HarnessSession, HarnessSessionFactory, harness_reward, rollout_batch
from harness_env.models import RolloutArgs, RolloutResult, Turn
from harness_env.rollout import run_many_sync
from tests import openenv_env

pytestmark = pytest.mark.e2e


def test_rollout_func_returns_trl_keys_with_masks_aligned(request_for):
    verdicts = itertools.cycle([["test -f a"], ["false"]])  # one pass, one fail per group
    func = HarnessRolloutFunc(
        run_many=functools.partial(run_many_sync, concurrency=2),
        task_for_prompt=lambda p: {"instruction": p[-1]["content"], "verify": next(verdicts)},
        request=request_for,
        num_generations=2,
    )
    prompts = [[{"role": "user", "content": "make a"}]] * 2 + [[{"role": "user", "content": "make b"}]] * 2
    out = func(prompts)
    assert out["harness_reward"] == [1.0, 0.0, 1.0, 0.0]
    assert out["group_status"] == ["ok"] * 4 and out["rollout_type"] == ["train"] * 4
    assert harness_reward(completions=None, **out) == out["harness_reward"]
    for i, res in enumerate(func.last_results):
        (row,) = res.training_rows()
        assert out["prompt_ids"][i] + out["completion_ids"][i] == row.token_ids
        assert len(out["completion_ids"][i]) == len(out["logprobs"][i]) == len(out["env_mask"][i])
        # Tool results inside the completion are masked out; sampled tokens are in, with their logprobs.
        sampled = [lp for lp, m in zip(out["logprobs"][i], out["env_mask"][i]) if m]
        assert sampled == [lp for t in res.proxy_turns for lp in t.per_token_logps]
        assert 0 in out["env_mask"][i]


def test_failed_rollouts_are_unscored_and_groups_marked():
    ok = RolloutResult(reward=1.0)
    failed = RolloutResult(error="endpoint down", error_kind="endpoint")
    out = rollout_batch([failed, failed, ok, RolloutResult(reward=1.0)], 2, filler_token_id=7)
    # Infrastructure failures are unscored; rollouts without a row to train still count in their
    # group's baseline (a filler row, masked out of the loss).
    assert out["harness_reward"] == [None, None, 1.0, 1.0]
    assert out["completion_ids"][0] == [7] and out["env_mask"][0] == [0]
    assert out["completion_ids"][2] == [7] and out["env_mask"][2] == [0]
    assert out["group_status"] == ["all_failed"] * 2 + ["all_tied"] * 2
    assert out["harness_error"][0] == "endpoint down"


def test_an_infrastructure_failure_changes_no_advantage_of_its_group():
    """A masked rollout is left out of its group's mean and std: the others' advantages are those of
    the same group without it; it gets zero advantage and trains nothing."""
    rewards = [1.0, 0.0, 0.5]
    failed = RolloutResult(reward=None, error="sandbox died", error_kind="sandbox")
    without = rollout_batch([RolloutResult(reward=r) for r in rewards], 3)
    with_failure = rollout_batch([RolloutResult(reward=r) for r in rewards[:2]] + [failed, RolloutResult(reward=0.5)], 4)
    assert with_failure["harness_advantage"][:2] + with_failure["harness_advantage"][3:] == pytest.approx(without["harness_advantage"])
    assert with_failure["harness_advantage"][2] == 0.0 and with_failure["env_mask"][2] == [0]
    assert with_failure["harness_reward"][2] is None and with_failure["mask_sample"] == [False, False, True, False]
    assert with_failure["failure_kind"][2] == "sandbox" and with_failure["group_status"] == ["ok"] * 4
    assert without["harness_advantage"][0] > 0 > without["harness_advantage"][1]


def test_groups_with_too_few_valid_members_are_marked():
    failed = RolloutResult(error="endpoint down", error_kind="endpoint")
    out = rollout_batch([failed, failed, RolloutResult(reward=1.0), RolloutResult(reward=0.0)], 4)
    assert out["group_status"] == ["ok"] * 4  # two valid members: the default threshold
    out = rollout_batch([failed, failed, RolloutResult(reward=1.0), RolloutResult(reward=0.0)], 4, min_valid=3)
    assert out["group_status"] == ["too_few_valid"] * 4
    assert rollout_batch([failed, RolloutResult(reward=1.0)], 2)["group_status"] == ["too_few_valid"] * 2


def test_a_masked_rollout_gives_the_async_worker_no_row_and_no_vote():
    session = HarnessSession(
        lambda reqs: [
            RolloutResult(
                reward=1.0,
                error="cancelled",
                error_kind="internal",
                proxy_turns=[Turn(index=0, branch=0, prompt_token_ids=[1], completion_token_ids=[2], per_token_logps=[-0.1], upstream_status=200)],
            )
        ],
        {},
        "ep",
    )
    assert session.fetch_proxy_trace() == []
    verdict = session.verdict()  # verify()'s VerifyResult fields
    assert verdict["env_reward"] is None and verdict["metrics"]["mask_sample"] is True


def test_an_agent_caused_end_and_an_untrainable_row_still_vote_in_the_group():
    """A timed-out agent (graded 0) and a rollout whose tokens cannot be trained keep their
    rewards for the group's baseline: neither may turn a failing grade into a neutral one."""
    timed_out = RolloutResult(reward=0.0, error="the agent did not finish", error_kind="agent_timeout")
    untrainable = RolloutResult(reward=0.0, proxy_turns=[Turn(index=0, branch=0, completion_text="x")])
    out = rollout_batch([timed_out, untrainable, RolloutResult(reward=1.0)], 3)
    assert out["harness_reward"] == [0.0, 0.0, 1.0] and out["group_status"] == ["ok"] * 3
    assert out["env_mask"][1] == [0] and "no token ids" in out["harness_error"][1]


def test_loop_owning_session_matches_openenv_and_trl_protocols(request_for, policy_server):
    """Our session's turns and verdict, read by OpenEnv's own TrainingTrace and VerifyResult (in
    OpenEnv's venv: openenv 0.10 cannot share the project's lock), and its methods held to
    OpenEnv's TrainableSession and LoopOwningSession protocols, parameter names and all."""
    factory = HarnessSessionFactory(run_many=functools.partial(run_many_sync, concurrency=1), request=request_for)
    factory = pickle.loads(pickle.dumps(factory))(sampling={"temperature": 0.7})  # TRL pickles it into its worker, then calls it
    session = factory.create({"instruction": "make a", "verify": ["test -f a"]}, seed=3, episode_id="ep1")
    assert session.wait_for_completion(60) == 0
    read = openenv_env.check("trl_session", {"entries": session.fetch_proxy_trace(), "verdict": session.verdict()})
    session.close()
    for protocol, members in read["protocols"].items():
        for name, params in members.items():
            assert list(inspect.signature(getattr(HarnessSession, name)).parameters) == params, (protocol, name)
    assert set(read["protocols"]) == {"TrainableSession", "LoopOwningSession"} and "fetch_training_trace" in read["protocols"]["TrainableSession"]
    turns = read["turns"]
    assert [t["node_id"] for t in turns] == ["ep1:0", "ep1:1"]
    assert all(len(t["loss_mask"]) == len(t["prompt_token_ids"]) + len(t["completion_token_ids"]) for t in turns)
    assert read["verify"]["env_reward"] == 1.0 and read["verify"]["done"] is True
    # The temperature TRL trains with is the one every policy call was sampled at.
    assert [r["temperature"] for r in policy_server.policy.tool_requests()] == [0.7, 0.7]


def test_rollout_func_through_a_server_with_a_catalog_endpoint(start_server, policy_server):
    from harness_env.client import HarnessEnv
    from harness_env.client.trl import remote_runner

    policy_server.policy.scripts["m"] = [{"bash": "touch a"}, {"text": "done"}]
    server = start_server(env={"VLLM_URL": policy_server.base_url, "VLLM_MODEL": "m"})
    with HarnessEnv(server.url) as client:
        func = HarnessRolloutFunc(
            run_many=remote_runner(client, concurrency=2),
            task_for_prompt=lambda p: {"instruction": p, "verify": ["test -f a"]},
            request={"harness": "whitebox", "endpoint": "vllm", "temperature": 1.0},
            num_generations=2,
        )
        out = func(["make a", "make a", "", ""])  # an empty instruction is refused: unscored, never a crash
    assert out["harness_reward"][:2] == [1.0, 1.0] and out["group_status"] == ["all_tied"] * 2 + ["all_failed"] * 2
    assert out["harness_reward"][2:] == [None, None] and "instruction" in out["harness_error"][2]


def test_requests_become_the_servers_flat_arguments():
    from harness_env.client.trl import args_from_request

    named = args_from_request({"harness": "pi", "endpoint": "openai", "api_key": "sk-x", "temperature": 0.5, "task": {"instruction": "x"}})
    assert (named["endpoint"], named["api_key"], named["temperature"], named["instruction"]) == ("openai", "sk-x", 0.5, "x")
    explicit = args_from_request(
        {"endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key": "k"}, "task": {"instruction": "y", "verify": ["true"]}}
    )
    assert (explicit["base_url"], explicit["model"], explicit["api_key"], explicit["verify"]) == ("http://127.0.0.1:9/v1", "m", "k", ["true"])
    RolloutArgs.model_validate(explicit)  # what the client checks before sending: a task with no task_id passes


def test_every_trainable_branch_becomes_a_row_sharing_the_rollouts_reward(request_for, compacting):
    (res,) = run_many_sync([{**request_for, "task": {"instruction": "make a", "verify": ["test -f a"]}}], concurrency=1)
    assert res.reward == 1.0 and res.graph.branches == 2, [(t.index, t.branch, t.parent) for t in res.proxy_turns]
    rows = {r.branch: r for r in res.training_rows()}
    assert [rows[b].turn_indices for b in (0, 1)] == [[0], [1, 2]] and all(r.trainable for r in rows.values())

    out = rollout_batch([res], 1, branch_slots=2)
    assert out["harness_branch"] == [1, 0]  # the main branch (the agent's last turn) first
    for i, branch in enumerate(out["harness_branch"]):
        row = rows[branch]
        assert out["prompt_ids"][i] + out["completion_ids"][i] == row.token_ids
        assert out["env_mask"][i] == row.loss_mask[row.prompt_length :] and out["logprobs"][i] == row.logprobs[row.prompt_length :]
        assert sum(out["env_mask"][i]) == sum(len(res.proxy_turns[t].completion_token_ids) for t in row.turn_indices)
    assert out["harness_reward"] == [1.0, 1.0] and out["dropped_branches"] == [0, 0]
    assert rollout_batch([res], 1)["dropped_branches"] == [1]  # one slot: the other branch is reported lost

    # TRL's AsyncGRPO worker chains the session's trace entries into rows: one per branch, the same rows
    # (TRL's worker imports OpenEnv, which has a venv of its own: tests/openenv_env.py).
    session = HarnessSession(lambda reqs: [res], {}, "ep")
    sequences = openenv_env.check_beside_trl("trl_worker_rows", {"entries": session.fetch_proxy_trace(), "episode_id": "ep"})["rows"]
    assert [s["input_ids"] for s in sequences] == [rows[0].token_ids, rows[1].token_ids]
    assert [s["completion_mask"] for s in sequences] == [rows[0].loss_mask, rows[1].loss_mask]


def test_branch_slots_must_divide_the_group_and_need_a_token_level_loss(request_for):
    from types import SimpleNamespace

    func = HarnessRolloutFunc(run_many=lambda reqs: [], task_for_prompt=lambda p: {"instruction": p}, request=request_for, branch_slots=2)
    with pytest.raises(ValueError, match="must divide"):
        func(["x"] * 3, SimpleNamespace(args=SimpleNamespace(num_generations=3, loss_type="dapo")))
    with pytest.raises(ValueError, match="token-level loss"):
        func(["x"] * 4, SimpleNamespace(args=SimpleNamespace(num_generations=4, loss_type="grpo")))
