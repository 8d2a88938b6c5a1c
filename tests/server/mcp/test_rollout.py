"""run_rollout's and submit_rollout's tool listings are small enough for an agent's context (each
at most 4 KB as the MCP client lists it), and the advanced options grouped under `options` are
still every one reachable: sent there or at the top, as before."""

from __future__ import annotations

import json

import pytest
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client

from harness_env.models import RolloutOptions
from tests.fakes.policy import hello_rollout

pytestmark = pytest.mark.e2e
MAX_TOOL_BYTES = 4096


async def test_the_rollout_tools_are_listed_in_4_kb_with_every_option_reachable(start_server, policy_server) -> None:
    server = start_server()
    args = hello_rollout(policy_server, "options-nested")
    async with streamable_http_client(server.url + "/mcp") as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = {t.name: t for t in (await session.list_tools()).tools}
            for name in ("run_rollout", "submit_rollout"):
                tool = tools[name]
                listed = json.dumps({"name": tool.name, "description": tool.description, "inputSchema": tool.input_schema})
                assert len(listed.encode()) <= MAX_TOOL_BYTES, (name, len(listed))
                props = tool.input_schema["properties"]
                reachable = set(props) | set(props["options"]["properties"])
                assert set(RolloutOptions.model_fields) <= reachable, set(RolloutOptions.model_fields) - reachable
            out = await session.call_tool("run_rollout", {**args, "options": {"max_turns": 1, "temperature": 0.0}})
            assert not out.is_error, out.content
            # max_turns=1 under options was applied: the second model call was refused, the work stands.
            assert out.structured_content["reward"] == 1.0 and out.structured_content["model_calls"] == 1
            twice = await session.call_tool("run_rollout", {**args, "max_turns": 2, "options": {"max_turns": 1}})
            assert twice.is_error and "max_turns given both in options and at the top" in twice.content[0].text
            bad = await session.call_tool("run_rollout", {**args, "options": {"max_turns": 0}})
            assert bad.is_error and "max_turns" in bad.content[0].text and "\n" not in bad.content[0].text
    server.assert_no_rollout_left()


async def test_the_sdks_high_level_client_negotiates_and_runs_a_rollout(start_server, policy_server) -> None:
    """mcp 2's `Client` (mode "auto": it probes `server/discover`, the 2026-07-28 protocol, before the
    initialize handshake) finds the same tools and gets the same answer as ClientSession."""
    server = start_server()
    args = hello_rollout(policy_server, "high-level")
    async with Client(server.url + "/mcp") as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == {"run_rollout", "submit_rollout", "get_rollout", "list_harnesses", "list_tasks", "catalog"}
        out = await client.call_tool("run_rollout", args)
        assert not out.is_error and out.structured_content["reward"] == 1.0, out.content
        bad = await client.call_tool("run_rollout", {**args, "options": {"max_turns": 0}})
        assert bad.is_error and "max_turns" in bad.content[0].text
    server.assert_no_rollout_left()
