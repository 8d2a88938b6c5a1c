"""The real server process, driven by every kind of client it promises to serve."""

import asyncio
import os
import subprocess
import sys
import threading

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from harness_env.client import AsyncHarnessEnv, HarnessEnv, HarnessEnvClientError
from tests import openenv_env

pytestmark = pytest.mark.e2e
WRITE = [{"bash": "echo hello > hello.txt"}, {"text": "done"}]


def _args(srv, model="m", **kw):
    srv.policy.scripts.setdefault(model, WRITE)
    return {
        "instruction": "Create hello.txt containing hello.",
        "base_url": srv.base_url,
        "model": model,
        "verify": ["grep -qx hello hello.txt"],
        "agent_timeout_s": 60,
        **kw,
    }


def _check_result(result: dict, srv) -> None:
    assert result["error"] is None, result["error"]
    assert result["reward"] == 1.0
    policy_turns = [t for t in result["proxy_turns"] if t["purpose"] == "policy"]
    assert policy_turns and all(t["completion_token_ids"] for t in policy_turns)
    sent_ids = [s.completion_token_ids for s in srv.policy.sent]
    assert all(t["completion_token_ids"] in sent_ids for t in policy_turns)


async def test_official_mcp_client_lists_tools_runs_a_rollout_and_gets_progress(start_server, policy_server):
    server = start_server()
    progress: list[str] = []

    async def on_progress(p, total, message):
        progress.append(message or "")

    async with streamable_http_client(server.url + "/mcp") as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            names = {t.name for t in (await session.list_tools()).tools}
            assert names == {"run_rollout", "list_harnesses", "list_tasks", "catalog", "submit_rollout", "get_rollout"}
            out = await session.call_tool("run_rollout", _args(policy_server, detail="full"), progress_callback=on_progress)
            assert not out.is_error
            _check_result(out.structured_content, policy_server)
            assert out.content[0].text.startswith("reward 1 (verify_ratio)")  # a few lines; the data is in structuredContent
            phases = [m.split(":")[0] for m in progress]
            for phase in ("setup", "agent", "verify", "collect"):
                assert phase in phases, progress
            assert phases.index("setup") < phases.index("agent") < phases.index("verify") < phases.index("collect")
            whitebox = await session.call_tool("run_rollout", {**_args(policy_server), "harness": "whitebox"})  # its summary
            assert not whitebox.is_error and whitebox.structured_content["reward"] == 1.0 and whitebox.structured_content["detail"] == "summary"
            assert whitebox.structured_content["harness"] == "whitebox" and whitebox.structured_content["rollout_type"] == "train"
            harnesses = await session.call_tool("list_harnesses", {})
            assert {h["name"] for h in harnesses.structured_content["result"]} == {"pi", "opencode", "whitebox", "harbor", "codex", "claude-code", "gemini-cli"}
            bad = await session.call_tool("run_rollout", {"instruction": "x", "endpoint": "nowhere"})
            assert bad.is_error and "unknown endpoint 'nowhere'" in bad.content[0].text
            bad = await session.call_tool("run_rollout", {"instruction": "x", "base_url": policy_server.base_url, "model": "m", "max_turns": 0})
            assert bad.is_error and "max_turns" in bad.content[0].text


def _openenv_client(server, style: str, steps: list[dict]) -> list[dict]:
    """OpenEnv's MCPToolClient (in OpenEnv's own venv) running `steps` against `server`: what each gave."""
    return openenv_env.check("mcp_client", {"base_url": server.url, "style": style, "steps": steps})["results"]


def test_openenv_mcp_tool_client_with_and_without_async_with(start_server, policy_server):
    server = start_server()
    listed, full = _openenv_client(server, "async_with", [{"list_tools": True}, {"call": "run_rollout", "arguments": _args(policy_server, detail="full")}])
    assert set(listed["tools"]) == {"run_rollout", "list_harnesses", "list_tasks", "catalog", "submit_rollout", "get_rollout"}
    _check_result(full["data"], policy_server)
    summary, bad = _openenv_client(
        server,
        "plain",
        [{"call": "run_rollout", "arguments": _args(policy_server)}, {"call": "run_rollout", "arguments": {"instruction": "x", "endpoint": "nowhere"}}],
    )
    summary = summary["data"]
    assert summary["detail"] == "summary" and summary["reward"] == 1.0 and summary["error"] is None
    assert bad["error"]["type"] == "RuntimeError" and "unknown endpoint" in bad["error"]["message"]


def test_openenv_mcp_tool_client_sync(start_server, policy_server):
    server = start_server()
    [full] = _openenv_client(server, "sync", [{"call": "run_rollout", "arguments": _args(policy_server, detail="full")}])
    _check_result(full["data"], policy_server)


def test_sync_client_and_http_errors(start_server, policy_server):
    server = start_server()
    with HarnessEnv(server.url) as env:
        result = env.run_rollout(**_args(policy_server))
        _check_result(result.model_dump(), policy_server)
        assert env.health()["status"] == "healthy"
        harnesses = {h.name: h for h in env.list_harnesses()}
        assert set(harnesses) == {"pi", "opencode", "whitebox", "harbor", "codex", "claude-code", "gemini-cli"}
        cli_harnesses = [harnesses[name] for name in ("pi", "opencode", "whitebox")]
        assert all(h.installed and h.version == h.pinned_version and "token_capture" in h.capabilities for h in cli_harnesses)
        assert "harbor_tasks" in harnesses["harbor"].capabilities
        with pytest.raises(HarnessEnvClientError) as e:
            env.run_rollout(instruction="x", endpoint="vllm")  # the server has no VLLM_MODEL
        assert e.value.status == 422 and "VLLM_MODEL" in e.value.message
        with pytest.raises(HarnessEnvClientError) as e:
            env.run_rollout(instruction="x", base_url="http://10.1.2.3/v1", model="m")
        assert e.value.status == 422 and "not allowed" in e.value.message


async def test_async_client_runs_8_concurrent_rollouts(start_server, policy_server):
    server = start_server("--max-concurrent", "8")
    peak = 0

    async def watch(env) -> None:
        nonlocal peak
        while True:
            peak = max(peak, (await env.health())["rollouts_running"])
            await asyncio.sleep(0.05)

    async with AsyncHarnessEnv(server.url) as env:
        reqs = [_args(policy_server, task_id=f"t{i}") for i in range(8)]
        watcher = asyncio.create_task(watch(env))
        try:
            results = [r async for r in env.run_many(reqs, concurrency=8)]
        finally:
            watcher.cancel()
    assert sorted(r.task_id for r in results) == [f"t{i}" for i in range(8)]
    for r in results:
        _check_result(r.model_dump(), policy_server)
    assert peak == 8  # all eight ran at once, not one after another


async def test_full_queue_is_refused_at_once(start_server, policy_server):
    server = start_server("--max-concurrent", "1", "--max-queue", "0")
    policy_server.policy.scripts["slow"] = [{"hang": 30}]
    async with AsyncHarnessEnv(server.url) as env:
        first = asyncio.create_task(env.run_rollout(**_args(policy_server, model="slow", agent_timeout_s=10)))
        for _ in range(100):
            if (await env.health())["rollouts_running"] == 1:
                break
            await asyncio.sleep(0.05)
        with pytest.raises(HarnessEnvClientError) as e:
            await env.run_rollout(**_args(policy_server))
        assert e.value.status == 429 and "server busy: 1 running, 0 queued" in e.value.message
        assert not first.done() and (await env.health())["rollouts_running"] == 1  # at once: not after waiting for the first
        async with streamable_http_client(server.url + "/mcp") as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                out = await session.call_tool("run_rollout", _args(policy_server))
                assert out.is_error and "server busy" in out.content[0].text
        assert (await first).error_kind == "agent_timeout"


def test_auth_on(start_server, policy_server):
    server = start_server(env={"HARNESS_ENV_TOKEN": "s3cret"})
    assert httpx.get(server.url + "/health").status_code == 200
    for method, path in (("POST", "/rollout"), ("POST", "/mcp"), ("GET", "/harnesses"), ("GET", "/catalog")):
        r = httpx.request(method, server.url + path, json={})
        assert r.status_code == 401 and "HARNESS_ENV_TOKEN" in r.text, path
    for path in ("/docs", "/openapi.json", "/metadata", "/schema"):  # they describe the API, and run nothing
        assert httpx.get(server.url + path).status_code == 200, path
    with HarnessEnv(server.url, token="wrong") as env, pytest.raises(HarnessEnvClientError) as e:
        env.health()  # health is open; a guarded call is not
        env.list_harnesses()
    assert e.value.status == 401
    with HarnessEnv(server.url, token="s3cret") as env:
        _check_result(env.run_rollout(**_args(policy_server)).model_dump(), policy_server)


def test_catalog_shorthand_resolved_from_server_environment(start_server, policy_server):
    server = start_server(env={"VLLM_URL": policy_server.base_url.removesuffix("/v1"), "VLLM_MODEL": "m"})
    policy_server.policy.scripts["m"] = WRITE
    with HarnessEnv(server.url) as env:
        result = env.run_rollout(instruction="Create hello.txt.", endpoint="vllm", verify=["test -f hello.txt"])
        assert result.reward == 1.0
        entries = {e["name"]: e for e in httpx.get(server.url + "/catalog").json()}
        assert entries["vllm"]["configured"] and entries["vllm"]["base_url"] == policy_server.base_url
        assert not entries["openai"]["api_key_set"]


def test_killed_client_connection_cancels_the_rollout(start_server, policy_server):
    server = start_server()
    policy_server.policy.scripts["slow"] = [{"hang": 120}]
    body = _args(policy_server, model="slow", agent_timeout_s=120)

    def call():
        try:
            httpx.post(server.url + "/rollout", json=body, timeout=2.5)
        except httpx.TimeoutException:
            pass  # the client gives up and drops its connection

    t = threading.Thread(target=call)
    t.start()
    t.join()
    server.assert_no_rollout_left()


def test_serve_refuses_an_exposed_address_without_a_token():
    p = subprocess.run(
        [sys.executable, "-m", "harness_env.cli", "serve", "--host", "0.0.0.0", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "HARNESS_ENV_TOKEN"},
    )
    assert p.returncode == 2 and "refusing to serve on 0.0.0.0 without a token" in p.stderr


async def test_mcp_client_that_goes_away_cancels_its_rollout(start_server, policy_server):
    server = start_server()
    policy_server.policy.scripts["slow"] = [{"hang": 120}]

    async def call():
        async with streamable_http_client(server.url + "/mcp") as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await session.call_tool("run_rollout", _args(policy_server, model="slow", agent_timeout_s=120))

    task = asyncio.create_task(call())
    async with AsyncHarnessEnv(server.url) as env:
        for _ in range(100):
            if (await env.health())["rollouts_running"] == 1:
                break
            await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    server.assert_no_rollout_left()
