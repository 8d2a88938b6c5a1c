"""Task images through the real server: a registry reference runs for any caller (HTTP client,
MCP); a local transport names the server's own files and is refused to them with one error."""

from __future__ import annotations

import os

import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from harness_env.client import HarnessEnv, HarnessEnvClientError
from tests.core.sandbox.test_images import VERIFY, image_layout, registry, registry_host  # noqa: F401 - the image and its registry
from tests.fakes.policy import FakePolicy, FakePolicyServer
from tests.server_process import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("needs_bwrap")]
REFUSED = "names a file on the server's disk"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("server-sandboxes"))
    yield srv
    out = srv.stop()
    assert os.listdir(srv.sandbox_dir) == [], "the server left rollout directories behind"
    assert "Traceback" not in out, out[-3000:]


@pytest.fixture(scope="module")
def policy():
    with FakePolicyServer(FakePolicy()) as srv:
        srv.policy.scripts["m"] = [{"bash": "only-in-image > made.txt"}, {"text": "done"}]
        yield srv


def _args(policy, image: str) -> dict:
    return {
        "instruction": "run only-in-image",
        "verify": VERIFY,
        "image": image,
        "harness": "whitebox",
        "base_url": policy.base_url,
        "model": "m",
        "agent_timeout_s": 60,
    }


def test_an_http_caller_runs_a_registry_image_and_may_not_name_a_local_one(server, policy, registry, image_layout):  # noqa: F811
    with HarnessEnv(server.url) as env:
        result = env.run_rollout(_args(policy, registry))
        assert result.error is None and result.reward == 1.0, (result.error, result.verify_results)
        for local in (image_layout, "oci-archive:/etc/passwd", "docker-archive:/root/x.tar"):
            with pytest.raises(HarnessEnvClientError) as e:
                env.run_rollout(_args(policy, local))
            assert e.value.status == 422 and REFUSED in e.value.message, e.value.message
    server.assert_no_rollout_left()


async def test_an_mcp_caller_is_refused_a_local_image_and_a_malformed_reference(server, policy, image_layout):  # noqa: F811
    async with streamable_http_client(server.url + "/mcp") as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            bad = await session.call_tool("run_rollout", _args(policy, image_layout))
            assert bad.is_error and REFUSED in bad.content[0].text, bad.content
            bad = await session.call_tool("run_rollout", _args(policy, "-x registry/name"))
            assert bad.is_error and "neither a registry reference" in bad.content[0].text, bad.content
