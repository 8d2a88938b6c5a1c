"""The job store, the same tests against SQLite and a real PostgreSQL (the `store_url` fixture):
jobs, events, results (exact and compact), listing, idempotency keys, dead servers' jobs,
retention, and the single writer."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy.exc import IntegrityError

from harness_env.models import PhaseEvent, RolloutResult, summarize
from harness_env.server.store import DuplicateKey, Store, StoreWriter
from harness_env.server.store.codec import encode_result
from harness_env.server.store.store import request_blob
from tests.test_storage import chat


@pytest.fixture
def store(store_url):
    s = Store.open(store_url)
    yield s
    s.close()


def job(store: Store, job_id: str, *, status: str = "queued", instance: str = "me", **kw) -> None:
    store.insert_job(
        {
            "id": job_id,
            "status": status,
            "created_at": time.time(),
            "instance": instance,
            "harness": kw.pop("harness", "pi"),
            "request": request_blob({"task": {"instruction": "x"}}),
            **kw,
        }
    )


def end(store: Store, job_id: str, result: RolloutResult | None = None, status: str = "finished", at: float | None = None) -> None:
    result = result or RolloutResult(rollout_id=job_id, reward=1.0)
    assert store.finish(job_id, status, result, summarize(result).model_dump_json(), at or time.time())


def test_a_job_from_submission_to_result(store: Store) -> None:
    job(store, "a1", task_id="t1", model="m", idempotency_key="k1")
    assert store.get("a1")["status"] == "queued" and store.id_for_key("k1") == "a1"
    store.mark_running("a1", time.time())
    store.set_sandbox("a1", "/tmp/x/rollout-1")
    evs = [
        PhaseEvent(rollout_id="a1", phase=p, status=s, elapsed_s=0.1)
        for p, s in (("endpoint", "started"), ("endpoint", "finished"), ("agent", "info"), ("agent", "finished"))
    ]
    store.append_events([("a1", i, time.time(), e.model_dump_json()) for i, e in enumerate(evs)])
    assert [s for s, _ in store.events_after("a1", -1)] == [0, 1, 2, 3]
    assert [s for s, _ in store.events_after("a1", 1)] == [2, 3]
    assert [p["status"] for p in store.phases("a1")] == ["started", "finished", "finished"]  # info left out
    row = store.get("a1")
    assert row["status"] == "running" and row["started_at"] and row["next_event"] == 4 and row["sandbox_dir"]
    result = chat(12).model_copy(update={"rollout_id": "a1", "task_id": "t1", "error": "x" * 5000, "error_kind": "agent_error"})
    end(store, "a1", result, "failed")
    row = store.get("a1")
    assert row["status"] == "failed" and row["error_kind"] == "agent_error" and len(row["error"]) == 2000 and row["sandbox_dir"] is None
    assert store.load_result("a1") == result  # exact, turns and all
    assert row["stored_bytes"] > 0 and store.total_bytes() == row["stored_bytes"]


def test_results_are_stored_compact(store: Store) -> None:
    """Linear in the conversation (the packed form, compressed), where whole results grow with its square."""
    sizes = {}
    for n in (20, 40):
        job(store, f"c{n}")
        end(store, f"c{n}", chat(n))
        sizes[n] = store.get(f"c{n}")["stored_bytes"]
        whole = len(chat(n).model_dump_json())
        assert sizes[n] < whole / 10
    assert sizes[40] / sizes[20] < 2.3
    header, turns = encode_result(chat(40))
    assert len(turns) == 40  # one row per turn, never one blob


def test_a_used_idempotency_key_is_refused(store: Store) -> None:
    job(store, "k1", idempotency_key="same")
    with pytest.raises(DuplicateKey):
        job(store, "k2", idempotency_key="same")
    assert store.get("k2") is None


def test_listing_is_newest_first_filtered_and_paged(store: Store) -> None:
    for i in range(7):
        job(store, f"j{i}", task_id=f"t{i % 2}", harness="pi" if i < 4 else "whitebox")
    end(store, "j1")
    end(store, "j2", RolloutResult(rollout_id="j2", error="boom", error_kind="agent_error"), "failed")
    ids = lambda rows: [r["id"] for r in rows]  # noqa: E731
    assert ids(store.list()) == ["j6", "j5", "j4", "j3", "j2", "j1", "j0"]
    assert ids(store.list(statuses=["finished", "failed"])) == ["j2", "j1"]
    assert ids(store.list(task_id="t1")) == ["j5", "j3", "j1"]
    assert ids(store.list(harness="whitebox", task_id="t0")) == ["j6", "j4"]
    page = store.list(limit=3)
    assert ids(page) == ["j6", "j5", "j4"] and ids(store.list(limit=3, before=page[-1]["seq"])) == ["j3", "j2", "j1"]
    assert "summary" not in page[0] and "request" not in page[0]  # a listing reads only its columns


def test_jobs_of_dead_servers_are_found_and_live_ones_left(store: Store) -> None:
    now = time.time()
    store.register_instance("me", "host-a", 1, now)
    store.register_instance("quiet", "host-b", 1, now - 120)  # no heartbeat for two minutes
    store.register_instance("alive", "host-b", 1, now)
    for job_id, instance in (("m", "me"), ("q", "quiet"), ("a", "alive"), ("u", "unknown-server")):
        job(store, job_id, status="running", instance=instance, sandbox_dir=f"/tmp/rollout-{job_id}")
    job(store, "done", status="queued", instance="quiet")
    end(store, "done")
    found = {o.id: o for o in store.orphans("me", "host-a", now, lease_s=60, exclusive=False)}
    assert set(found) == {"q", "u"} and found["q"].host == "host-b" and found["u"].host is None
    assert found["q"].sandbox_dir == "/tmp/rollout-q"
    # Found until marked (the dead server forgotten meanwhile). A store only one server uses
    # (SQLite's): every other server is dead.
    assert {o.id for o in store.orphans("me", "host-a", now, lease_s=60, exclusive=True)} == {"q", "a", "u"}
    # Marked interrupted once; the job's own server, should it still end it, wins.
    r = RolloutResult(rollout_id="a", error="died", error_kind="internal")
    assert store.finish("a", "interrupted", r, summarize(r).model_dump_json(), now, only_if_active=True)
    assert not store.finish("a", "interrupted", r, summarize(r).model_dump_json(), now, only_if_active=True)
    end(store, "a")
    assert store.get("a")["status"] == "finished"


def test_a_cancel_request_reaches_the_server_running_the_job(store: Store) -> None:
    job(store, "x", status="running", instance="other")
    job(store, "y", status="queued", instance="me")
    store.request_cancel("x")
    store.request_cancel("y")
    assert store.cancel_requests("other") == ["x"] and store.cancel_requests("me") == ["y"]
    end(store, "x", status="cancelled")
    assert store.cancel_requests("other") == []


def test_retention_removes_the_oldest_ended_first_and_never_an_active_job(store: Store) -> None:
    now = time.time()
    job(store, "running", status="running")
    job(store, "queued")
    for i in range(5):
        job(store, f"e{i}")
        end(store, f"e{i}", chat(4).model_copy(update={"rollout_id": f"e{i}"}), at=now - 1000 + i * 100)  # e0 ended first
    store.append_events([("running", 0, now, "{}")])
    # By age: what ended before the cut.
    assert store.to_remove(older_than=now - 750, max_bytes=None) == ["e0", "e1", "e2"]
    store.remove(["e0", "running"])  # an active job is never removed
    assert store.get("running") and store.events_after("running", -1) and store.get("e0") is None and store.load_result("e0") is None
    assert store.events_after("e0", -1) == []
    # By size: the oldest ended until the rest fits.
    each = store.get("e1")["stored_bytes"]  # the oldest left: removing it alone makes the rest fit
    assert store.to_remove(older_than=None, max_bytes=store.total_bytes() - each) == ["e1"]
    assert store.to_remove(older_than=None, max_bytes=0) == ["e1", "e2", "e3", "e4"]
    store.remove(store.to_remove(older_than=None, max_bytes=0))
    store.shrink()
    assert [r["id"] for r in store.list()] == ["queued", "running"]


def test_reopening_a_store_keeps_everything(store_url: str) -> None:
    s = Store.open(store_url)
    job(s, "keep")
    end(s, "keep", chat(3))
    s.close()
    s = Store.open(store_url)  # the tables are there: nothing is made anew
    try:
        assert s.load_result("keep") == chat(3) and s.get("keep")["status"] == "finished"
    finally:
        s.close()


async def test_the_writer_keeps_order_batches_events_and_reports_failures(store: Store) -> None:
    written: list[set[str]] = []
    writer = StoreWriter(store, written.append)
    writer.start()
    await writer.call("w", job, store, "w")
    for i in range(200):
        writer.post_event(("w", i, time.time(), f'{{"n": {i}}}'))
    result = RolloutResult(rollout_id="w", reward=0.5)
    await writer.call("w", store.finish, "w", "finished", result, summarize(result).model_dump_json(), time.time())
    assert [s for s, _ in store.events_after("w", -1, limit=1000)] == list(range(200))
    assert store.get("w")["status"] == "finished" and store.get("w")["next_event"] == 200
    with pytest.raises(DuplicateKey):  # a failed write raises in its caller
        await asyncio.gather(
            writer.call("v", lambda: job(store, "v", idempotency_key="dup")), writer.call("v2", lambda: job(store, "v2", idempotency_key="dup"))
        )
    await writer.close()
    assert {"w"} <= set().union(*written)


def test_an_id_met_twice_is_replaced(store: Store) -> None:
    job(store, "abc")
    row = {"id": "abc", "status": "queued", "created_at": time.time(), "instance": "me"}
    assert store.insert_job(row, new_id=lambda: "def") == "def"
    assert store.get("def")["status"] == "queued"
    with pytest.raises(IntegrityError):
        store.insert_job(row)  # without a way to make another
