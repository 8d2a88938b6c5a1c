"""The export's token sidecar: the training rows rebuilt from an export equal storage.row_records
exactly, for turns the real capture proxy recorded from the scripted policy over HTTP (two branches
joined by a compaction, an auxiliary title call, a retry, two weight versions, stale turns), for a
white-box rollout, and through `harness-env export` read back from its files."""

import json
import subprocess
import sys

import httpx
import pytest

from harness_env import Endpoint, RolloutRequest, Task, run_rollout
from harness_env.core.capture.graph import link_turns, summarise_rows
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.capture.serve import serve_on_loopback
from harness_env.evals.atif import build_trajectory
from harness_env.evals.export import export
from harness_env.evals.run import attempt_path, write_atomic
from harness_env.evals.sidecar import prompts, rows_from_export, rows_from_sidecar, token_sidecar
from harness_env.models import RolloutResult, Turn
from harness_env.storage import pack, row_records
from tests.fakes.policy import FakePolicy, FakePolicyServer
from tests.test_storage import chat  # a conversation on one branch, 100 new prompt tokens a call

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]
SYSTEM = {"role": "system", "content": "You are a coding agent."}


async def _captured_rollout() -> RolloutResult:
    """A harness that works, asks for a title, compacts its history into a summary and goes on,
    then re-sends its last call; the trainer moves the weights from version 1 to 2 before the
    compaction, and turns may lag by none (max_weight_lag 0): the first branch's are stale."""
    policy = FakePolicy(scripts={"m": [{"bash": "ls"}, {"text": "listed"}]})
    with FakePolicyServer(policy) as upstream:
        proxy = CaptureProxy()
        async with serve_on_loopback(proxy.app) as url, httpx.AsyncClient(base_url=url + "/v1", timeout=30) as client:
            session = proxy.open_session(Endpoint(base_url=upstream.base_url, api_key="k", model="m"), CapturePolicy(max_weight_lag=0))

            async def call(messages, tools=TOOLS):
                r = await client.post(
                    "/chat/completions", json={"model": "m", "messages": messages, "tools": tools}, headers={"authorization": f"Bearer {session.key}"}
                )
                assert r.status_code == 200, r.text
                return r.json()["choices"][0]["message"]

            async def work(user):  # a tool call, its result, the answer
                messages = [SYSTEM, {"role": "user", "content": user}]
                answer = await call(messages)
                messages += [answer, {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": "a.txt b.txt"}]
                await call(messages)
                return messages

            proxy.weights.update(version=1)
            await work("List the files of the project, then say what they are.")
            await call([{"role": "user", "content": "Title for: list the files"}], tools=[])  # auxiliary
            proxy.weights.update(version=2)
            messages = await work("Summary so far: the files are listed.")  # same system prompt, shorter history: compaction
            await call(messages)  # the same request again: a retry
            turns = session.sorted_turns()
        await proxy.aclose()
    result = RolloutResult(rollout_id="r-1", task_id="t", harness="fake", reward=0.75, proxy_turns=turns)
    result.graph = summarise_rows(link_turns(result.proxy_turns), result.training_rows())
    return result


@pytest.fixture
async def captured():
    return await _captured_rollout()


def test_the_captured_graph_is_what_the_round_trips_below_need(captured):
    """The premises, so that the round trips cannot pass on a graph with one branch and nothing else."""
    g = captured.graph
    assert g.branches == 2 and g.links == {"new_thread": 1, "extends": 2, "auxiliary": 1, "compaction": 1, "retry": 1}
    assert g.weight_versions == [1, 2] and g.stale_branches == [0]
    rows = captured.training_rows()
    assert [r.turn_indices for r in rows] == [[0, 1], [3, 4]] and all(r.trainable for r in rows)


def test_rows_rebuilt_from_the_sidecar_equal_the_rows_exactly(captured):
    sidecar = json.loads(json.dumps(token_sidecar(captured, {0: 3})))  # as a trainer reads it: through JSON
    rebuilt = rows_from_sidecar(sidecar, task_id="t", attempt=2, rollout_id="r-1", reward=0.75, mask_sample=False)
    assert rebuilt == row_records(captured, attempt=2)
    by_turn = {t.index: t for t in captured.proxy_turns}
    aux = [t.index for t in captured.proxy_turns if t.purpose == "auxiliary"]
    assert aux == [2] and 2 not in {r["turn_index"] for r in sidecar}  # never a step, never a row
    for rec in sidecar:  # what each field means, against the turn it came from
        t = by_turn[rec["turn_index"]]
        assert rec["prompt_ids"] == t.prompt_token_ids[rec["prompt_offset"] :] and rec["completion_ids"] == t.completion_token_ids
        assert rec["loss_mask"] == [0] * len(rec["prompt_ids"]) + [1] * len(t.completion_token_ids)
        assert (rec["link"], rec["parent"], rec["branch"], rec["weight_version"], rec["stale"]) == (t.link, t.parent, t.branch, t.weight_version, t.stale)
    assert prompts(sidecar) == {i: by_turn[i].prompt_token_ids for i in (0, 1, 3, 4, 5)}  # the whole prompts, as ATIF means them
    firsts = {r["turn_index"]: r["prompt_offset"] for r in sidecar}
    assert firsts[0] == firsts[3] == 0 and firsts[1] == len(by_turn[0].prompt_token_ids) + len(by_turn[0].completion_token_ids)
    assert [r["link"] for r in sidecar] == ["new_thread", "extends", "compaction", "extends", "retry"]
    assert sidecar[0]["step_id"] == 3 and sidecar[1]["step_id"] is None


def test_an_untrainable_branch_is_rebuilt_with_the_same_reason():
    """Rows that break (no token ids, logprobs missing, a turn that does not extend its branch)
    come back untrainable with the words of TrainingRow.untrainable_reason."""

    def turn(i, prompt, completion, logps=None, **kw):
        return Turn(
            index=i,
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            upstream_status=200,
            capture_level="tokens",
            per_token_logps=[-0.5] * len(completion) if logps is None else logps,
            **kw,
        )

    turns = [
        turn(0, [1, 2], [3], stale=True),
        turn(1, [1, 2, 3, 4], [5, 6], [-0.1]),
        turn(2, [9], [8]),
        turn(3, [9, 8, 7], [6]),
        Turn(index=4, completion_text="hi", upstream_status=200, capture_level="text"),
    ]
    result = RolloutResult(rollout_id="r", reward=None, error_kind="endpoint", proxy_turns=turns)
    link_turns(result.proxy_turns)
    result.proxy_turns[3].prompt_token_ids = [9, 7]  # breaks branch 1 after linking: a row that does not extend
    expected = row_records(result, task_id="t")
    assert [r["untrainable_reason"] for r in expected] == [
        "turn 1 has 1 logprobs for 2 tokens",
        "turn 3 does not extend its branch's tokens",
        "turn 4 has no token ids (capture level text)",
    ]
    assert rows_from_sidecar(token_sidecar(result), task_id="t", attempt=0, rollout_id="r", reward=None, mask_sample=True) == expected


def test_the_trajectory_carries_the_step_ids_harbor_validates_and_no_prompt_ids(captured):
    from harbor.models.trajectories import Trajectory

    traj = build_trajectory(captured, "m")
    valid = Trajectory.model_validate(traj)
    agent = [s for s in valid.steps if s.source == "agent"]
    assert [s.extra["turn_index"] for s in agent] == [0, 1, 3, 4, 5]  # the auxiliary turn is no step
    assert all(s.metrics.prompt_token_ids is None for s in agent)  # ATIF's means the whole prompt: the sidecar has the new ones
    assert agent[2].extra["link"] == "compaction" and agent[2].extra["weight_version"] == 2
    assert agent[0].metrics.prompt_tokens == len(captured.proxy_turns[0].prompt_token_ids)


def test_the_trajectory_and_its_sidecar_grow_linearly_with_the_conversation():
    """Not quadratically, as whole prompts per step would (ATIF's prompt_token_ids)."""

    def size(result):
        return len(json.dumps(build_trajectory(result))) + len(json.dumps(token_sidecar(result)))

    assert size(chat(40)) / size(chat(20)) < 2.2
    whole = sum(len(t.prompt_token_ids) for t in chat(40).proxy_turns) / sum(len(t.prompt_token_ids) for t in chat(20).proxy_turns)
    assert whole > 3  # what storing the whole prompts would have grown by


def _eval_dir(root, results):
    write_atomic(root / "eval.json", json.dumps({"attempts": len(results), "threshold": 1.0, "harness": "fake", "model": "m", "tasks": ["t"]}))
    for n, r in enumerate(results):
        write_atomic(attempt_path(root, "t", n), json.dumps(pack(r)))
    return root


def _read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow  # the command in processes of its own: not in the fast tier
def test_export_round_trip_through_the_command(tmp_path, captured):
    """`harness-env export`, then its files read back: the results' sidecars rebuild the rows table,
    and both equal row_records of the stored attempts; each sidecar step names its ATIF step."""
    broken = RolloutResult(
        rollout_id="r-2",
        reward=None,
        error_kind="endpoint",
        proxy_turns=[Turn(index=0, prompt_token_ids=[1, 2], completion_token_ids=[3], per_token_logps=[-1.0], upstream_status=200, capture_level="tokens")],
    )
    link_turns(broken.proxy_turns)
    out = _eval_dir(tmp_path / "run", [captured, broken])
    for fmt in ("jsonl", "parquet"):
        p = subprocess.run(
            [sys.executable, "-m", "harness_env.cli", "export", str(out), "--format", fmt, "--to", str(tmp_path / fmt)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr
    expected = row_records(captured, task_id="t", attempt=0) + row_records(broken, task_id="t", attempt=1)
    results = _read_jsonl(tmp_path / "jsonl" / "results.jsonl")
    assert [r for rec in results for r in rows_from_export(rec)] == _read_jsonl(tmp_path / "jsonl" / "rows.jsonl") == expected
    assert expected[-1]["mask_sample"] is True and expected[-1]["reward"] is None
    import pyarrow.parquet as pq

    results = pq.read_table(tmp_path / "parquet" / "results.parquet").to_pylist()
    assert [r for rec in results for r in rows_from_export(rec)] == pq.read_table(tmp_path / "parquet" / "rows.parquet").to_pylist() == expected
    traj = json.loads(results[0]["trajectory"])
    steps = {s["step_id"]: s for s in traj["steps"]}
    for rec in json.loads(results[0]["tokens"]):
        assert steps[rec["step_id"]]["extra"]["turn_index"] == rec["turn_index"]
        assert steps[rec["step_id"]]["metrics"].get("completion_token_ids") == (rec["completion_ids"] or None)


def test_a_harbor_agents_own_trajectory_is_kept_and_its_sidecar_names_no_steps(tmp_path, captured):
    own = {"schema_version": "ATIF-v1.6", "agent": {"name": "terminus-2", "version": "1"}, "steps": []}
    target = export(_eval_dir(tmp_path / "run", [captured.model_copy(update={"agent_trajectory": own})]))
    (rec,) = _read_jsonl(target / "results.jsonl")
    assert json.loads(rec["trajectory"]) == own
    assert {s["step_id"] for s in json.loads(rec["tokens"])} == {None}
    assert rows_from_export(rec) == row_records(captured, task_id="t")


@pytest.mark.e2e
async def test_a_white_box_rollout_round_trips(policy_server):
    policy_server.policy.scripts["m"] = [{"bash": "echo 1"}, {"bash": "echo 2"}, {"text": "ok"}]
    res = await run_rollout(
        RolloutRequest(task=Task(instruction="x", verify=["true"]), harness="whitebox", endpoint=Endpoint(base_url=policy_server.base_url, model="m"))
    )
    assert res.graph.branches == 1 and res.rollout_type == "train" and len(res.proxy_turns) == 3
    sidecar = json.loads(json.dumps(token_sidecar(res)))
    assert [r["prompt_offset"] > 0 for r in sidecar] == [False, True, True]
    assert rows_from_sidecar(sidecar, task_id=res.task_id, attempt=0, rollout_id=res.rollout_id, reward=res.reward, mask_sample=res.mask_sample) == row_records(
        res
    )
