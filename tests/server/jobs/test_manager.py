"""Jobs on a real `harness-env serve`: submit, watch the events, fetch the result, list; cancel
(running and queued); busy refused at once with nothing kept; called rollouts stored too; the MCP
tools submit_rollout and get_rollout on both faces; retention in a running server."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.fakes.policy import hello_rollout
from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e
SLOW = [{"bash": "sleep 50"}, {"text": "done"}]


def sse_events(url: str, headers: dict | None = None) -> list[tuple[str | None, str, dict]]:
    """(id, event, data) of a whole event stream."""
    out, cur = [], {}
    with httpx.stream("GET", url, headers=headers, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                if cur:
                    out.append((cur.get("id"), cur["event"], json.loads(cur["data"])))
                cur = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(": ")
                cur[name] = value
    return out


def wait_for(server: ServerProcess, rollout_id: str, predicate, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = httpx.get(f"{server.url}/rollouts/{rollout_id}").json()
        if predicate(job) or time.monotonic() > deadline:
            return job
        time.sleep(0.1)


def agent_started(job: dict) -> bool:
    return any(p["phase"] == "agent" and p["status"] == "started" for p in job["phases"])


def test_submit_watch_events_fetch_the_result_and_list(start_server, policy_server) -> None:
    server = start_server()
    body = hello_rollout(policy_server, "jobs-a")
    first = httpx.post(server.url + "/rollouts", json=body, headers={"idempotency-key": "try-1"})
    assert first.status_code == 202 and first.json()["created"] is True
    rid = first.json()["rollout_id"]
    assert first.headers["location"].endswith(f"rollouts/{rid}")
    again = httpx.post(server.url + "/rollouts", json=body, headers={"idempotency-key": "try-1"})
    assert again.status_code == 200 and again.json() == {"rollout_id": rid, "status": again.json()["status"], "created": False}

    events = sse_events(f"{server.url}/rollouts/{rid}/events")
    assert events[-1][1] == "end" and events[-1][2] == {"rollout_id": rid, "status": "finished", "reward": 1.0, "error_kind": None, "error": None}
    phases = [(d["phase"], d["status"]) for _, kind, d in events if kind == "phase"]
    # The wait for a running place is the first phase, an event like the engine's (core/runner.py).
    assert phases[:3] == [("queue", "started"), ("queue", "finished"), ("endpoint", "started")] and phases[-1] == ("done", "finished")
    assert [int(i) for i, kind, _ in events if kind == "phase"] == list(range(len(phases)))
    resumed = sse_events(f"{server.url}/rollouts/{rid}/events", headers={"last-event-id": "5"})  # a reconnecting client
    assert resumed[0][0] == "6" and resumed[-1][1] == "end" and len(resumed) == len(events) - 6

    job = httpx.get(f"{server.url}/rollouts/{rid}").json()
    assert job["status"] == "finished" and job["reward"] == 1.0 and job["harness"] == "whitebox" and job["model"] == "jobs-a"
    assert job["summary"]["rollout_id"] == rid and job["summary"]["reward"] == 1.0 and job["result"] is None
    assert [p["phase"] for p in job["phases"]][:3] == ["queue", "queue", "endpoint"] and job["events"] == len(phases)
    full = httpx.get(f"{server.url}/rollouts/{rid}", params={"detail": "full"}).json()["result"]
    assert full["rollout_id"] == rid and full["reward"] == 1.0 and full["files"]["hello.txt"] == "hello\n"
    assert len(full["proxy_turns"]) == 2 and all(t["completion_token_ids"] for t in full["proxy_turns"])
    assert len(policy_server.policy.tool_requests()) == 2  # the repeated submission ran nothing

    called = httpx.post(server.url + "/rollout", json=hello_rollout(policy_server, "jobs-b", task_id="t-called"), timeout=120).json()
    assert called["reward"] == 1.0
    stored = httpx.get(f"{server.url}/rollouts/{called['rollout_id']}", params={"detail": "full"}).json()
    assert stored["status"] == "finished" and stored["task_id"] == "t-called" and stored["result"] == called  # called rollouts are jobs too

    listing = httpx.get(server.url + "/rollouts").json()
    assert [i["rollout_id"] for i in listing["items"]] == [called["rollout_id"], rid] and listing["next_cursor"] is None
    assert [i["rollout_id"] for i in httpx.get(server.url + "/rollouts", params={"task_id": "t-called"}).json()["items"]] == [called["rollout_id"]]
    assert httpx.get(server.url + "/rollouts", params={"status": ["failed", "cancelled"]}).json()["items"] == []
    page = httpx.get(server.url + "/rollouts", params={"limit": 1}).json()
    assert [i["rollout_id"] for i in page["items"]] == [called["rollout_id"]] and page["next_cursor"]
    assert [i["rollout_id"] for i in httpx.get(server.url + "/rollouts", params={"limit": 1, "before": page["next_cursor"]}).json()["items"]] == [rid]
    assert httpx.get(f"{server.url}/rollouts/0123456789abcdef").status_code == 404
    assert httpx.get(f"{server.url}/rollouts/not-an-id").status_code == 422
    assert httpx.get(server.url + "/rollouts", params={"status": "lost"}).status_code == 422
    server.assert_no_rollout_left()


def test_cancel_running_and_queued_and_busy_refused_at_once(start_server, policy_server) -> None:
    server = start_server("--max-concurrent", "1", "--max-queue", "1")
    running = httpx.post(server.url + "/rollouts", json=hello_rollout(policy_server, "slow-1", SLOW)).json()["rollout_id"]
    queued = httpx.post(server.url + "/rollouts", json=hello_rollout(policy_server, "slow-2", SLOW)).json()["rollout_id"]
    refused = httpx.post(server.url + "/rollouts", json=hello_rollout(policy_server, "slow-3", SLOW), headers={"idempotency-key": "busy"})
    assert refused.status_code == 429 and "server busy: 1 running, 1 queued" in refused.json()["detail"]
    assert httpx.get(f"{server.url}/rollouts/{queued}").json()["status"] == "queued"  # at once: not after a place came free
    assert {i["rollout_id"] for i in httpx.get(server.url + "/rollouts").json()["items"]} == {running, queued}  # nothing kept of it
    assert wait_for(server, running, agent_started)["status"] == "running"
    assert httpx.get(f"{server.url}/rollouts/{queued}").json()["status"] == "queued"

    gone = httpx.delete(f"{server.url}/rollouts/{queued}", timeout=30).json()
    assert gone["status"] == "cancelled" and gone["summary"]["error"] == "cancelled before it started" and gone["reward"] is None
    assert gone["error_kind"] == "cancelled"  # a user's cancel, not a failure of the server
    # The key of a refused submission was never taken: the retry is accepted.
    retried = httpx.post(server.url + "/rollouts", json=hello_rollout(policy_server, "slow-3", SLOW), headers={"idempotency-key": "busy"})
    assert retried.status_code == 202
    httpx.delete(f"{server.url}/rollouts/{retried.json()['rollout_id']}", timeout=30)
    cancelled = httpx.delete(f"{server.url}/rollouts/{running}", timeout=30).json()
    assert cancelled["status"] == "cancelled" and cancelled["error_kind"] == "cancelled" and cancelled["reward"] is None
    assert "cancelled" in cancelled["error"]
    listed = {i["rollout_id"]: i["error_kind"] for i in httpx.get(server.url + "/rollouts").json()["items"]}
    assert listed[running] == listed[queued] == "cancelled"  # as the store keeps it (the Rollouts tab's list)
    metrics = httpx.get(server.url + "/metrics").text
    assert 'error_kind="cancelled"' in metrics and 'error_kind="internal"' not in metrics
    server.assert_no_rollout_left()  # its sleep and its directory are gone
    assert httpx.delete(f"{server.url}/rollouts/{running}").json()["status"] == "cancelled"  # an ended one stays as it is
    events = sse_events(f"{server.url}/rollouts/{running}/events")
    assert events[-1][2]["status"] == "cancelled"


async def test_mcp_submit_rollout_and_get_rollout(start_server, policy_server) -> None:
    server = start_server()
    async with streamable_http_client(server.url + "/mcp") as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert {"submit_rollout", "get_rollout", "run_rollout"} <= set(tools)
            assert "idempotency_key" in tools["submit_rollout"].input_schema["properties"]
            assert "detail" not in tools["submit_rollout"].input_schema["properties"]
            out = await session.call_tool("submit_rollout", {**hello_rollout(policy_server, "mcp-a"), "idempotency_key": "m1"})
            assert not out.is_error and out.structured_content["created"] is True
            rid = out.structured_content["rollout_id"]
            again = await session.call_tool("submit_rollout", {**hello_rollout(policy_server, "mcp-a"), "idempotency_key": "m1"})
            assert again.structured_content["rollout_id"] == rid and again.structured_content["created"] is False
            job = await session.call_tool("get_rollout", {"rollout_id": rid, "wait_s": 30})
            assert not job.is_error and job.structured_content["status"] == "finished" and job.structured_content["summary"]["reward"] == 1.0
            assert job.structured_content["result"] is None and f"rollout {rid}: finished" in job.content[0].text
            # The whole result of a rollout whose summary run_rollout gave.
            summary = (await session.call_tool("run_rollout", hello_rollout(policy_server, "mcp-b"))).structured_content
            full = await session.call_tool("get_rollout", {"rollout_id": summary["rollout_id"], "detail": "full"})
            assert full.structured_content["result"]["rollout_id"] == summary["rollout_id"]
            assert len(full.structured_content["result"]["proxy_turns"]) == summary["model_calls"]
            missing = await session.call_tool("get_rollout", {"rollout_id": "0123456789abcdef"})
            assert missing.is_error and "no rollout" in missing.content[0].text
            bad = await session.call_tool("submit_rollout", {"instruction": "x", "endpoint": "nowhere"})
            assert bad.is_error and "unknown endpoint 'nowhere'" in bad.content[0].text

    # OpenEnv's plain JSON-RPC face routes them too.
    def rpc(name: str, arguments: dict) -> dict:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
        return httpx.post(server.url + "/mcp", json=body, timeout=120).json()

    submitted = rpc("submit_rollout", hello_rollout(policy_server, "rpc-a"))["result"]["data"]
    got = rpc("get_rollout", {"rollout_id": submitted["rollout_id"], "wait_s": 30, "detail": "full"})["result"]["data"]
    assert got["status"] == "finished" and got["result"]["reward"] == 1.0
    assert "takes rollout_id, detail and wait_s" in rpc("get_rollout", {"id": "x"})["error"]["message"]
    server.assert_no_rollout_left()


def test_retention_removes_ended_results_and_never_a_running_one(start_server, policy_server) -> None:
    server = start_server(env={"HARNESS_ENV_RETENTION_INTERVAL_S": "0.5", "HARNESS_ENV_RETENTION_MAX_SIZE": "1"})
    slow = httpx.post(server.url + "/rollouts", json=hello_rollout(policy_server, "ret-slow", SLOW)).json()["rollout_id"]
    quick = [httpx.post(server.url + "/rollouts", json=hello_rollout(policy_server, f"ret-{i}")).json()["rollout_id"] for i in range(2)]
    assert wait_for(server, slow, agent_started)["status"] == "running"
    deadline = time.monotonic() + 60
    while any(httpx.get(f"{server.url}/rollouts/{q}").status_code == 200 for q in quick) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(httpx.get(f"{server.url}/rollouts/{q}").status_code == 404 for q in quick)  # over the size: removed once ended
    assert httpx.get(f"{server.url}/rollouts/{slow}").json()["status"] == "running"  # never a running one
    httpx.delete(f"{server.url}/rollouts/{slow}", timeout=30)
    server.assert_no_rollout_left()
