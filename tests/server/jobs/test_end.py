"""A job always ends, on a real `harness-env serve` with its real SQLite store: a result holding
what cannot be encoded (the policy's lone surrogates, a file name that is not UTF-8) is answered
and stored, and a store that refuses the result still ends the job `failed` with why. Never a
500, never a job left `running` (DELETE and a client's wait would never return)."""

from __future__ import annotations

import json
import sqlite3
from functools import partial

import httpx
import pytest

from tests.fakes.policy import hello_rollout
from tests.server_process import ServerProcess, served_in_process

pytestmark = pytest.mark.e2e
# A whole chat completion whose text is a lone surrogate, escaped as JSON allows.
SURROGATE_ANSWER = json.dumps(
    {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "done \\udfff"}, "finish_reason": "stop"}],
    }
).replace("\\\\udfff", "\\udfff")


def _job(server: ServerProcess, rollout_id: str) -> dict:
    r = httpx.get(f"{server.url}/rollouts/{rollout_id}", params={"wait": 30, "detail": "full"}, timeout=60)
    assert r.status_code == 200
    return r.json()


def test_what_cannot_be_encoded_never_hangs_a_job(start_server, policy_server) -> None:
    server = start_server()
    body = hello_rollout(
        policy_server,
        "end-unicode",
        [
            {"bash": "echo hello > hello.txt && touch \"$(printf 'bad\\377name')\""},  # a name that is not UTF-8
            {"raw": SURROGATE_ANSWER},
        ],
    )
    assert "\\udfff" in SURROGATE_ANSWER
    r = httpx.post(server.url + "/rollout", json=body, timeout=120)
    assert r.status_code == 200, r.text
    result = r.json()
    assert result["reward"] == 1.0 and result["error"] is None
    assert result["files"]["bad\\xffname"] == ""  # the name's byte kept, as an escape
    assert result["proxy_turns"][-1]["completion_text"] == "done \ufffd"  # the engine's text, made valid
    job = _job(server, result["rollout_id"])
    assert job["status"] == "finished" and job["result"]["files"] == result["files"]
    server.assert_no_rollout_left()


def test_a_store_that_refuses_the_result_still_ends_the_job_failed(start_server, policy_server) -> None:
    server = start_server()
    # The fault: the real store refuses every result of task "refused" (as a full disk would).
    with sqlite3.connect(server.data_dir / "rollouts.db") as db:
        db.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON results WHEN (SELECT task_id FROM rollouts WHERE id = NEW.rollout_id)"
            " = 'refused' BEGIN SELECT RAISE(ABORT, 'injected: database or disk is full'); END"
        )
    body = hello_rollout(policy_server, "end-refused", task_id="refused")

    r = httpx.post(server.url + "/rollout", json=body, timeout=120)  # called: the caller gets why
    assert r.status_code == 200, r.text
    called = r.json()
    assert called["reward"] is None and called["error_kind"] == "internal"
    assert "could not be stored" in called["error"] and "injected: database or disk is full" in called["error"]
    job = _job(server, called["rollout_id"])
    assert job["status"] == "failed" and "could not be stored" in job["error"] and job["result"] is None

    r = httpx.post(server.url + "/rollouts", json=body, timeout=30)  # submitted: a client's wait returns
    assert r.status_code == 202
    rid = r.json()["rollout_id"]
    job = _job(server, rid)
    assert job["status"] == "failed" and "could not be stored" in job["error"]
    deleted = httpx.delete(f"{server.url}/rollouts/{rid}", timeout=30)
    assert deleted.status_code == 200 and deleted.json()["status"] == "failed"

    r = httpx.post(server.url + "/rollout", json={**body, "task_id": "kept"}, timeout=120)  # the store still works for others
    assert r.status_code == 200 and r.json()["reward"] == 1.0
    assert _job(server, r.json()["rollout_id"])["status"] == "finished"
    server.assert_no_rollout_left()


async def test_a_result_that_does_not_serialise_is_stored_repaired(tmp_path, policy_server, monkeypatch) -> None:
    """Whatever else puts a lone surrogate into a result (the fault injected here: the engine's
    result carries one in a file name, a turn and a log), the job ends with its data made valid."""
    from harness_env.core.engine import RolloutRun
    from harness_env.core.sandbox.backends import SandboxSettings
    from harness_env.server.app import create_app

    real_execute = RolloutRun.execute

    async def poisoned(self):
        result = await real_execute(self)
        result.files["bad\udcffname"] = "x\udfff"
        result.agent_log_tail += "\ud800"
        return result

    monkeypatch.setattr(RolloutRun, "execute", poisoned)
    body = hello_rollout(policy_server, "end-repaired")
    make_app = partial(create_app, data_dir=tmp_path / "data", sandbox_settings=SandboxSettings(use_bwrap=False))
    async with served_in_process(lambda url: make_app(public_url=url)) as url, httpx.AsyncClient(base_url=url, timeout=120) as client:
        r = await client.post("/rollout", json=body)
        assert r.status_code == 200, r.text
        result = r.json()
        assert result["error"] is None, result["error"]
        assert result["reward"] == 1.0 and result["files"]["bad\ufffdname"] == "x\ufffd" and result["agent_log_tail"].endswith("\ufffd")
        job = (await client.get(f"/rollouts/{result['rollout_id']}", params={"wait": 30, "detail": "full"})).json()
        assert job["status"] == "finished" and job["result"]["files"] == result["files"]
