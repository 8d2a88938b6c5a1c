"""Jobs survive their server: kill -9 a real `harness-env serve` while jobs run, start it again on
the same data directory, and find the finished results intact, the others `interrupted` (reward
None), and no process or directory of theirs left; a SQLite store that passes its integrity check.
Replicas sharing a real PostgreSQL store: any of them reads, follows and cancels any job."""

from __future__ import annotations

import shutil
import sqlite3

import httpx
import pytest

from harness_env.core.sandbox.processes import marked_pids
from harness_env.server.jobs.upkeep import remove_sandbox
from tests.fakes.policy import hello_rollout
from tests.server.jobs.test_manager import SLOW, agent_started, sse_events, wait_for
from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e


def _kill(server: ServerProcess) -> None:
    """kill -9: nothing of the server's own clean-up runs."""
    server.proc.kill()
    server.proc.wait()
    server._log.close()
    shutil.rmtree(server.tmp_dir, ignore_errors=True)  # its capture socket and the like: not what this test checks


def test_kill_9_with_jobs_running_then_restart(tmp_path_factory, policy_server) -> None:
    tmp_path = tmp_path_factory.mktemp("k9")  # short: the capture socket's path must fit
    sandboxes, data = tmp_path / "sandboxes", tmp_path / "data"
    sandboxes.mkdir()
    env = {"HARNESS_ENV_DATA_DIR": str(data)}
    first = ServerProcess(sandboxes, "--max-concurrent", "2", env=env)
    try:
        done = httpx.post(first.url + "/rollout", json=hello_rollout(policy_server, "dur-done"), timeout=120).json()
        assert done["reward"] == 1.0
        slow = [httpx.post(first.url + "/rollouts", json=hello_rollout(policy_server, f"dur-slow-{i}", SLOW)).json()["rollout_id"] for i in range(2)]
        queued = httpx.post(first.url + "/rollouts", json=hello_rollout(policy_server, "dur-queued", SLOW)).json()["rollout_id"]
        for rid in slow:
            assert wait_for(first, rid, agent_started)["status"] == "running"
        left = [d.name for d in sandboxes.iterdir() if not d.name.endswith(".lease")]
        assert len(left) == 2 and all(marked_pids(name) for name in left)  # the two running rollouts' directories, their `sleep` in them
    finally:
        _kill(first)
    assert sorted(p.name for p in sandboxes.iterdir()) == sorted([*left, *(f"{n}.lease" for n in left)])  # what the dead server left

    second = None
    try:
        second = ServerProcess(sandboxes, env=env)
        second.assert_no_rollout_left()  # directories and processes of the dead server's rollouts removed at start
        assert [pid for name in left for pid in marked_pids(name)] == []
        kept = httpx.get(f"{second.url}/rollouts/{done['rollout_id']}", params={"detail": "full"}).json()
        assert kept["status"] == "finished" and kept["result"] == done  # intact, to the last token
        for rid in (*slow, queued):
            job = httpx.get(f"{second.url}/rollouts/{rid}", params={"detail": "full"}).json()
            assert job["status"] == "interrupted" and job["error_kind"] == "internal" and job["reward"] is None, job
            assert job["result"]["reward"] is None and "stopped before it ended" in job["result"]["error"]
            assert sse_events(f"{second.url}/rollouts/{rid}/events")[-1][2]["status"] == "interrupted"
        notes = [n for rid in slow for n in httpx.get(f"{second.url}/rollouts/{rid}", params={"detail": "full"}).json()["result"]["sandbox_notes"]]
        assert notes == ["clean-up after the server died: sandbox directory removed"] * 2
        again = httpx.post(second.url + "/rollout", json=hello_rollout(policy_server, "dur-after"), timeout=120).json()
        assert again["reward"] == 1.0  # and it serves on
        assert [i["status"] for i in httpx.get(second.url + "/rollouts").json()["items"]] == [
            "finished",
            "interrupted",
            "interrupted",
            "interrupted",
            "finished",
        ]
    finally:
        if second is not None:
            second.stop()
        for left in sandboxes.iterdir():  # only when the test failed: no mount or process outlives it
            if not left.name.endswith(".lease"):
                remove_sandbox(str(left))
    with sqlite3.connect(data / "rollouts.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_replicas_sharing_postgres_read_follow_and_cancel_each_others_jobs(tmp_path_factory, policy_server, postgres_server) -> None:
    tmp_path = tmp_path_factory.mktemp("pg")
    url = postgres_server.new_database()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = ServerProcess(tmp_path / "a", env={"HARNESS_ENV_STORE_URL": url})
    b = ServerProcess(tmp_path / "b", env={"HARNESS_ENV_STORE_URL": url})
    try:
        quick = httpx.post(a.url + "/rollouts", json=hello_rollout(policy_server, "pg-quick")).json()["rollout_id"]
        events = sse_events(f"{b.url}/rollouts/{quick}/events")  # followed from the other replica
        assert events[-1][2]["status"] == "finished" and events[-2][2]["phase"] == "done"
        assert httpx.get(f"{b.url}/rollouts/{quick}", params={"detail": "full"}).json()["result"]["reward"] == 1.0
        slow = httpx.post(a.url + "/rollouts", json=hello_rollout(policy_server, "pg-slow", SLOW)).json()["rollout_id"]
        assert wait_for(b, slow, agent_started)["status"] == "running"
        assert httpx.delete(f"{b.url}/rollouts/{slow}", timeout=30).status_code == 200  # asked of B, done by A
        assert wait_for(b, slow, lambda j: j["status"] == "cancelled", timeout=30)["status"] == "cancelled"
        a.assert_no_rollout_left()
        assert {i["rollout_id"] for i in httpx.get(b.url + "/rollouts").json()["items"]} == {quick, slow}
    finally:
        a.stop()
        b.stop()
