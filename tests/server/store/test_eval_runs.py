"""Eval runs in the store, against SQLite and a real PostgreSQL: a run and its attempts recorded and
read back (the endpoint's key nowhere), a resumed run recorded once, a server's job in the same
store linked rather than copied, and a schema 1 store migrated in place."""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import inspect, select, text, update

from harness_env.models import RolloutRequest, RolloutResult
from harness_env.server.store import Store
from harness_env.server.store import eval_runs as er
from harness_env.server.store.codec import decompress
from harness_env.server.store.schema import meta
from tests.server.store.test_store import job

KEY = "sk-secret-key-0123456789"


def request(task_id: str) -> RolloutRequest:
    return RolloutRequest.model_validate(
        {
            "task": {"instruction": f"do {task_id}", "task_id": task_id, "verify": ["true"]},
            "harness": "whitebox",
            "max_turns": 7,
            "endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key": KEY},
        }
    )


@pytest.fixture
def store(store_url):
    s = Store.open(store_url)
    yield s
    s.close()


def record(store: Store, run_id: str = "r" * 32) -> er.EvalRecorder:
    rec = er.EvalRecorder(store)
    rec.begin(run_id, "/runs/x", request("a"), ["a", "b"], 2, 1.0, None)
    return rec


def test_a_run_and_its_attempts_are_recorded_without_the_key(store: Store) -> None:
    rec = record(store)
    rec.attempt("a", 0, request("a"), RolloutResult(rollout_id="ro1", task_id="a", harness="whitebox", reward=1.0, wall_s=2.0))
    rec.attempt("a", 1, request("a"), RolloutResult(rollout_id="ro2", task_id="a", harness="whitebox", reward=0.0))
    rec.attempt(
        "b", 0, request("b"), RolloutResult(rollout_id="ro3", task_id="b", harness="whitebox", reward=None, error="upstream said 500", error_kind="endpoint")
    )
    run = er.get_run(store, rec.run_id)
    assert (run["harness"], run["model"], run["base_url"], run["tasks"], run["attempts"], run["status"]) == (
        "whitebox",
        "m",
        "http://127.0.0.1:9/v1",
        ["a", "b"],
        2,
        "running",
    )
    assert run["options"]["max_turns"] == 7 and "endpoint" not in run["options"] and "task" not in run["options"]
    got = er.run_attempts(store, rec.run_id)
    assert [(a["id"], a["task_id"], a["eval_attempt"], a["status"], a["reward"]) for a in got] == [
        ("ro1", "a", 0, "finished", 1.0),
        ("ro2", "a", 1, "finished", 0.0),
        ("ro3", "b", 0, "failed", None),
    ]
    assert store.load_result("ro1").reward == 1.0 and store.get("ro3")["error_kind"] == "endpoint"
    assert rec.recorded() == {("a", 0), ("a", 1), ("b", 0)}
    rec.end("finished", {"overall": {"attempts": 3}})
    assert er.stored_summary(store, rec.run_id) == {"overall": {"attempts": 3}} and er.get_run(store, rec.run_id)["status"] == "finished"
    with store.engine.connect() as conn:  # the key is in no table
        for table in ("rollouts", "eval_runs"):
            assert KEY not in json.dumps([list(map(str, r)) for r in conn.execute(text(f"SELECT * FROM {table}"))])
    assert KEY not in json.dumps(decompress(store.get("ro1")["request"]))


def test_a_server_sweeping_the_store_meanwhile_never_takes_an_attempt_for_a_dead_job(store: Store, monkeypatch) -> None:
    """A server on the same data directory looks for dead servers' running jobs at any time: an
    attempt is never in the store as running, not even between its row and its result."""
    seen, finish = [], store.finish

    def sweep_then_finish(*args, **kw):
        seen.extend(store.orphans("server", "host", time.time(), 30.0, exclusive=True))
        return finish(*args, **kw)

    monkeypatch.setattr(store, "finish", sweep_then_finish)
    record(store).attempt("a", 0, request("a"), RolloutResult(rollout_id="ro1", reward=1.0))
    assert seen == [] and store.get("ro1")["status"] == "finished"


def test_a_resumed_run_is_one_run_and_the_newest_is_listed_first(store: Store) -> None:
    record(store, "a" * 32)
    time.sleep(0.01)
    record(store, "b" * 32)
    record(store, "a" * 32)  # resumed: the same run, not a third
    assert [r["id"] for r in er.list_runs(store)] == ["b" * 32, "a" * 32]


def test_a_job_of_a_server_sharing_the_store_is_linked_not_copied(store: Store) -> None:
    job(store, "srv1", task_id="a", status="running")
    rec = record(store)
    rec.attempt("a", 0, request("a"), RolloutResult(rollout_id="srv1", task_id="a", reward=1.0))
    assert [a["id"] for a in er.run_attempts(store, rec.run_id)] == ["srv1"]
    assert len(store.list()) == 1 and store.get("srv1")["status"] == "running"  # the server's own row, as the server left it


def test_a_schema_1_store_is_migrated_in_place(store_url: str) -> None:
    old = Store.open(store_url)
    job(old, "old1", task_id="t")
    with old.engine.begin() as conn:  # undo schema 2: the store as harness-env with schema 1 left it
        conn.exec_driver_sql("DROP INDEX rollouts_eval_run")
        conn.exec_driver_sql("DROP TABLE eval_runs")
        for column in ("eval_run", "eval_attempt"):
            conn.exec_driver_sql(f"ALTER TABLE rollouts DROP COLUMN {column}")
        conn.execute(update(meta).values(value="1"))
    old.close()
    s = Store.open(store_url)
    try:
        assert {"eval_run", "eval_attempt"} <= {c["name"] for c in inspect(s.engine).get_columns("rollouts")}
        with s.engine.connect() as conn:
            assert conn.execute(select(meta.c.value).where(meta.c.key == "schema_version")).scalar() == "2"
        assert s.get("old1")["task_id"] == "t" and s.get("old1")["eval_run"] is None
        rec = record(s)
        rec.attempt("a", 0, request("a"), RolloutResult(rollout_id="new1", reward=1.0))
        assert [a["id"] for a in er.run_attempts(s, rec.run_id)] == ["new1"]
    finally:
        s.close()
    Store.open(store_url).close()  # opened again: nothing left to migrate
