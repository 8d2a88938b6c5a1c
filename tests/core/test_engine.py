"""The engine's lifecycle as a user sees it, against the scripted policy."""

import pytest

from harness_env import Endpoint, RolloutRequest, Task, run_rollout

pytestmark = pytest.mark.e2e


async def test_an_endpoint_without_the_chat_route_ends_the_rollout_before_the_agent(policy_server):
    req = RolloutRequest(task=Task(instruction="x", verify=["true"]), endpoint=Endpoint(base_url=policy_server.base_url + "/nope", model="m"),
                         harness="whitebox")
    res = await run_rollout(req)
    assert res.error_kind == "endpoint" and "404" in res.error and res.reward is None
    assert [p.name for p in res.phases] == ["endpoint", "collect"]  # no sandbox, no agent
