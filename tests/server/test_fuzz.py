"""The server survives anything a client sends: no 500, no crash, on the OpenAPI and MCP surfaces.

Fuzzed rollouts can only call loopback endpoints (HARNESS_ENV_ALLOWED_HOSTS in the fixture)."""

import json

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    tasks = tmp_path_factory.mktemp("fuzz-harbor-tasks")  # Harbor paths resolve under it (an empty dataset)
    (tasks / "suite").mkdir()
    server = ServerProcess(tmp_path_factory.mktemp("fuzz-sandboxes"), "--max-concurrent", "4", env={"HARNESS_ENV_HARBOR_TASKS_DIR": str(tasks)})
    yield server
    out = server.stop()
    assert "Traceback" not in out, out[-3000:]


def test_openapi_surface(fuzz_server):
    # schemathesis generates the cases from the live OpenAPI schema; hypothesis drives them
    # (the schemathesis pytest plugin does not load under this pytest, so it is driven directly).
    schema = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/rollout", "/health", "/harnesses", "/catalog"}
    for op in operations:

        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=op.as_strategy())
        def run(case):
            response = case.call(timeout=60)
            assert response.status_code < 500, (case.operation.path, response.text)

        run()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
methods = st.sampled_from(["openenv/session/create", "openenv/session/close", "tools/list", "tools/call", "initialize", "ping", "x/y"]) | st.text(max_size=20)
# Path-like strings a remote caller might send for Harbor tasks: home, parent, NUL, absolute.
paths = st.text(max_size=20) | st.sampled_from(["~", "~root/x", "~nosuchuser", "..", "suite", "suite/../..", "/etc", "a\x00b"])
tool_args = st.fixed_dictionaries(
    {},
    optional={
        "instruction": st.text(max_size=40),
        "base_url": st.sampled_from(["http://127.0.0.1:9/v1", "nonsense", ""]),
        "model": st.text(max_size=10),
        "endpoint": st.text(max_size=10),
        "max_turns": json_values,
        "files": json_values,
        "verify": json_values,
        "agent_timeout_s": st.floats(allow_nan=True, allow_infinity=True) | st.integers(),
        "dataset": paths,
        "split": st.text(max_size=8) | json_values,
        "harness": st.sampled_from(["harbor", "pi", "nope"]),
        "detail": st.sampled_from(["summary", "full"]) | json_values,
        "harbor": st.fixed_dictionaries(
            {}, optional={"task_dir": paths, "dataset": paths, "agent": st.text(max_size=12), "sandbox": st.text(max_size=8), "agent_kwargs": json_values}
        )
        | json_values,
    },
)
rpc = st.fixed_dictionaries(
    {"jsonrpc": st.just("2.0"), "method": methods},
    optional={
        "id": st.integers() | st.text(max_size=5),
        "params": json_values
        | st.fixed_dictionaries(
            {"name": st.sampled_from(["run_rollout", "list_harnesses", "catalog", "list_tasks", "nope"]), "arguments": tool_args | json_values}
        ),
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=rpc | json_values, sse=st.booleans())
def test_mcp_surface(fuzz_server, body, sse):
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream" if sse else "*/*"}
    r = httpx.post(fuzz_server.url + "/mcp", content=json.dumps(body), headers=headers, timeout=60)
    assert r.status_code < 500, r.text


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=200))
def test_mcp_surface_raw_bytes(fuzz_server, raw):
    r = httpx.post(fuzz_server.url + "/mcp", content=raw, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code < 500
    assert httpx.get(fuzz_server.url + "/health", timeout=10).status_code == 200
