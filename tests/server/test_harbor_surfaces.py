"""Harbor tasks through the real server: list_tasks over MCP, OpenEnv's JSON-RPC, HTTP and the
client; harness="harbor" rollouts over MCP with Harbor's oracle and nop agents (local sandbox)."""

import asyncio
import os

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from harness_env.client import AsyncHarnessEnv, HarnessEnv, HarnessEnvClientError
from harness_env.envs.harbor.options import HarborTaskInfo
from harness_env.models import Task
from tests import needs, openenv_env
from tests.fakes.policy import FakePolicyServer
from tests.server_process import ServerProcess

needs.module("harbor.models.task.task", "uv sync --extra harbor")
from harness_env.envs.harbor.task_dir import task_to_task_dir  # noqa: E402

pytestmark = pytest.mark.e2e
needs_bwrap = pytest.mark.usefixtures("needs_bwrap")  # the local Harbor sandbox
TASKS_DIR_VAR = "HARNESS_ENV_HARBOR_TASKS_DIR"
UNDER_ROOT = f"must lie under ${TASKS_DIR_VAR}"
WORDS = {"alpha": "hello", "beta": "world", "gamma": "again"}


def write_task(dest, name: str, word: str):
    """A Harbor task: write `word` into /app/out.txt; its oracle solution does exactly that."""
    task = Task(instruction=f"Write the word {word} into /app/out.txt.\nNothing else.", verify=[f"grep -qx {word} /app/out.txt"])
    out = task_to_task_dir(task, dest / name, agent_timeout_s=60, verify_timeout_s=60, setup_timeout_s=60)
    (out / "solution").mkdir()
    (out / "solution" / "solve.sh").write_text(f"#!/usr/bin/env bash\necho {word} > /app/out.txt\n")
    return out


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """root/suite/{alpha,beta}, root/splits/train/gamma, and a dataset outside the root."""
    base = tmp_path_factory.mktemp("harbor")
    root = base / "root"
    for name in ("alpha", "beta"):
        write_task(root / "suite", name, WORDS[name])
    write_task(root / "splits" / "train", "gamma", WORDS["gamma"])
    write_task(base / "outside", "secret", "nope")
    return root


@pytest.fixture(scope="module")
def harbor_server(tasks, tmp_path_factory):
    """One server for the module (its first Harbor trial pays LiteLLM's import once)."""
    server = ServerProcess(tmp_path_factory.mktemp("server-sandboxes"), env={TASKS_DIR_VAR: str(tasks)})
    yield server
    out = server.stop()
    assert os.listdir(server.sandbox_dir) == [], "the server left rollout directories behind"
    assert "Traceback" not in out, out[-3000:]


@pytest.fixture(scope="module")
def policy():
    with FakePolicyServer() as srv:  # the oracle and nop agents call no model; the endpoint is still checked
        yield srv


def _names(tasks: list) -> list[tuple[int, str]]:
    return [(t["index"], t["name"]) for t in tasks]


async def test_mcp_list_tasks_and_confinement(harbor_server, tasks):
    async with streamable_http_client(harbor_server.url + "/mcp") as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert "list_tasks" in tools
            run_schema = tools["run_rollout"].input_schema
            listed_options = run_schema["properties"]["options"]["properties"]
            # Harbor's options are harness_options, named in the description; the former key is not listed.
            assert "harness_options" in listed_options and "harbor" not in listed_options
            assert "harbor (" in tools["run_rollout"].description and "instruction" not in run_schema.get("required", [])

            out = await session.call_tool("list_tasks", {"dataset": "suite"})
            assert not out.is_error, out.content
            listed = out.structured_content["result"]
            assert _names(listed) == [(0, "alpha"), (1, "beta")]
            assert listed[0]["path"] == "alpha" and listed[0]["has_solution"] is True
            assert listed[0]["instruction"].startswith("Write the word hello") and listed[0]["agent_timeout_s"] == 60.0

            out = await session.call_tool("list_tasks", {"dataset": "splits", "split": "train"})
            assert _names(out.structured_content["result"]) == [(0, "gamma")]
            out = await session.call_tool("list_tasks", {})  # the root itself holds datasets, not tasks
            assert not out.is_error and out.structured_content["result"] == []

            for dataset in ("../outside", str(tasks.parent / "outside"), "suite/../../outside"):
                bad = await session.call_tool("list_tasks", {"dataset": dataset})
                assert bad.is_error and UNDER_ROOT in bad.content[0].text, bad.content
            bad = await session.call_tool("list_tasks", {"dataset": "missing"})
            assert bad.is_error and "does not exist" in bad.content[0].text
            bad = await session.call_tool("list_tasks", {"dataset": "suite", "split": ".."})
            assert bad.is_error and "plain subdirectory name" in bad.content[0].text

            bad = await session.call_tool(
                "run_rollout",
                {"harness": "harbor", "harbor": {"task_dir": "../outside/secret", "agent": "oracle"}, "base_url": "http://127.0.0.1:9/v1", "model": "m"},
            )
            assert bad.is_error and UNDER_ROOT in bad.content[0].text, bad.content
            bad = await session.call_tool(
                "run_rollout",
                {"harness": "harbor", "harbor": {"dataset": "suite", "task_index": 7, "agent": "oracle"}, "base_url": "http://127.0.0.1:9/v1", "model": "m"},
            )
            assert bad.is_error and "out of range" in bad.content[0].text and "holds 2 tasks" in bad.content[0].text
            bad = await session.call_tool("run_rollout", {"harness": "pi", "harbor": {"dataset": "suite"}, "base_url": "http://127.0.0.1:9/v1", "model": "m"})
            assert bad.is_error and "`harbor` options are for harness='harbor', not 'pi'" in bad.content[0].text, bad.content
            bad = await session.call_tool(
                "run_rollout", {"harness": "harbor", "harbor": {"dataset": "suite", "agnet": "oracle"}, "base_url": "http://127.0.0.1:9/v1", "model": "m"}
            )
            assert bad.is_error and "harness_options.agnet" in bad.content[0].text, bad.content
            bad = await session.call_tool("run_rollout", {"base_url": "http://127.0.0.1:9/v1", "model": "m"})  # no task at all
            assert bad.is_error and "instruction is required" in bad.content[0].text


@needs_bwrap
async def test_mcp_harbor_rollouts_oracle_passes_nop_fails(harbor_server, policy):
    async with streamable_http_client(harbor_server.url + "/mcp") as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            for agent, index, reward in (("oracle", 1, 1.0), ("nop", 0, 0.0)):
                out = await session.call_tool(
                    "run_rollout",
                    {
                        "harness": "harbor",
                        "harbor": {"dataset": "suite", "task_index": index, "agent": agent},
                        "base_url": policy.base_url,
                        "model": "m",
                        "agent_timeout_s": 60,
                        "verify_timeout_s": 60,
                        "detail": "full",
                    },
                )
                assert not out.is_error, out.content
                result = out.structured_content
                assert result["error"] is None, result["error"]
                assert result["reward"] == reward, result
                assert result["harness"] == "harbor" and result["task_id"] == ("alpha", "beta")[index]
                assert result["run_info"]["agent"] == agent and result["run_info"]["sandbox"] == "local"
                assert result["run_info"]["task_name"] == ("alpha", "beta")[index]
    harbor_server.assert_no_rollout_left()


async def test_openenv_json_rpc_face_routes_list_tasks(harbor_server):
    steps = [
        {"list_tools": True},
        {"call": "list_tasks", "arguments": {"dataset": "splits", "split": "train"}},
        {"call": "list_tasks", "arguments": {"dataset": "../outside"}},
        {"call": "list_tasks", "arguments": {"datset": "suite"}},
    ]
    spec = {"base_url": harbor_server.url, "message_timeout_s": 60, "style": "plain", "steps": steps}
    answers = await asyncio.to_thread(openenv_env.check, "mcp_client", spec)  # in OpenEnv's own venv
    tools, listed, outside, misspelt = answers["results"]
    assert "list_tasks" in tools["tools"]
    assert _names(listed["data"]) == [(0, "gamma")]
    assert outside["error"]["type"] == "RuntimeError" and "must lie under" in outside["error"]["message"]
    assert misspelt["error"]["type"] == "RuntimeError" and "takes dataset and split" in misspelt["error"]["message"]
    # The plain JSON-RPC an OpenEnv client posts, as the wire shows it.
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "list_tasks", "arguments": {"dataset": "suite"}}}
    async with httpx.AsyncClient(base_url=harbor_server.url, timeout=30) as http:
        body = (await http.post("/mcp", json=rpc)).json()
        assert _names(body["result"]["data"]) == [(0, "alpha"), (1, "beta")]
        rpc["params"]["arguments"] = {"dataset": "/etc"}
        body = (await http.post("/mcp", json=rpc)).json()
        assert body["error"]["code"] == -32000 and UNDER_ROOT in body["error"]["message"]


def test_http_route_and_sync_client_list_tasks(harbor_server):
    with HarnessEnv(harbor_server.url) as env:
        listed = env.list_tasks("suite")
        assert all(isinstance(t, HarborTaskInfo) for t in listed)
        assert [(t.index, t.name, t.has_solution) for t in listed] == [(0, "alpha", True), (1, "beta", True)]
        assert [t.name for t in env.list_tasks("splits", split="train")] == ["gamma"]
        with pytest.raises(HarnessEnvClientError) as e:
            env.list_tasks("../outside")
        assert e.value.status == 422 and UNDER_ROOT in e.value.message
        with pytest.raises(HarnessEnvClientError) as e:
            env.list_tasks("suite", split="nope")
        assert e.value.status == 422 and "does not exist" in e.value.message
    r = httpx.get(harbor_server.url + "/harbor/tasks", params={"dataset": "suite/../.."}, timeout=30)
    assert r.status_code == 422 and UNDER_ROOT in r.json()["detail"]
    r = httpx.get(harbor_server.url + "/harbor/tasks", params={"dataset": "suite"}, timeout=30)
    assert r.status_code == 200 and _names(r.json()) == [(0, "alpha"), (1, "beta")]


@pytest.mark.parametrize(
    ("dataset", "said"),
    [
        ("~nouser/suite", "does not exist"),  # a remote ~ is a literal name under the root, never the server's home
        ("~", "does not exist"),
        ("su\x00ite", "NUL byte"),
        ("0" * 27 + "\x80" * 300, "too long"),  # found by the fuzzer: ENAMETOOLONG was a 500
    ],
)
def test_dataset_names_the_os_cannot_resolve_are_one_clear_error(harbor_server, dataset, said):
    r = httpx.get(harbor_server.url + "/harbor/tasks", params={"dataset": dataset}, timeout=30)
    assert r.status_code == 422 and said in r.json()["detail"], r.text


async def test_async_client_list_tasks(harbor_server, tasks):
    async with AsyncHarnessEnv(harbor_server.url) as env:
        assert [t.name for t in await env.list_tasks("suite")] == ["alpha", "beta"]
        assert [t.name for t in await env.list_tasks("splits", split="train")] == ["gamma"]
        with pytest.raises(HarnessEnvClientError) as e:
            await env.list_tasks(str(tasks.parent / "outside"))
        assert e.value.status == 422 and UNDER_ROOT in e.value.message


@needs_bwrap
def test_http_client_runs_a_harbor_dataset_task(harbor_server, policy):
    with HarnessEnv(harbor_server.url) as env:
        result = env.run_rollout(
            harness="harbor",
            harbor={"dataset": "splits", "split": "train", "task_index": 0, "agent": "oracle"},
            base_url=policy.base_url,
            model="m",
            agent_timeout_s=60,
        )
    assert result.error is None and result.reward == 1.0 and result.run_info is not None
    assert result.run_info.task_name == "gamma" and result.task_id == "gamma"
    harbor_server.assert_no_rollout_left()


def test_list_tasks_without_a_tasks_root_is_refused(start_server, monkeypatch):
    monkeypatch.delenv(TASKS_DIR_VAR, raising=False)
    server = start_server()
    with HarnessEnv(server.url) as env:
        with pytest.raises(HarnessEnvClientError) as e:
            env.list_tasks("suite")
    assert e.value.status == 422 and f"${TASKS_DIR_VAR}" in e.value.message and "not set" in e.value.message
