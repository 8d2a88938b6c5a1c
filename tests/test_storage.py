"""Compact storage of results: exact round trip, linear growth."""

import json

import pytest

from harness_env import Endpoint, RolloutRequest, Task, run_rollout
from harness_env.core.capture.graph import link_turns
from harness_env.models import RolloutResult, Turn
from harness_env.storage import load, pack, save, unpack


def chat(turns: int) -> RolloutResult:
    prompt, messages, out = list(range(500)), [{"role": "user", "content": "go " * 100}], []
    for i in range(turns):
        completion = [1000 + i] * 50
        out.append(
            Turn(
                index=i,
                prompt_token_ids=list(prompt),
                completion_token_ids=completion,
                per_token_logps=[-0.1] * 50,
                upstream_status=200,
                capture_level="tokens",
                request_messages=list(messages),
            )
        )
        messages = messages + [{"role": "assistant", "content": "a" * 200}, {"role": "tool", "content": "t" * 400}]
        prompt = prompt + completion + [7] * 100
    res = RolloutResult(proxy_turns=out, reward=0.5)
    link_turns(res.proxy_turns)
    return res


def size(obj) -> int:
    return len(json.dumps(obj, separators=(",", ":")))


def test_round_trip_is_exact(tmp_path):
    res = chat(12)
    assert unpack(pack(res)) == res
    save(res, tmp_path / "r.json")
    assert load(tmp_path / "r.json") == res
    assert unpack(res.model_dump(mode="json")) == res  # a whole result reads too


def test_compact_storage_grows_linearly_whole_results_do_not():
    small, big = chat(20), chat(40)
    compact = size(pack(big)) / size(pack(small))
    whole = size(big.model_dump(mode="json")) / size(small.model_dump(mode="json"))
    assert compact < 2.2 < 2.8 < whole


@pytest.mark.e2e
async def test_a_real_rollout_round_trips(policy_server):
    policy_server.policy.scripts["m"] = [{"bash": "echo 1"}, {"bash": "echo 2"}, {"text": "ok"}]
    res = await run_rollout(
        RolloutRequest(task=Task(instruction="x", verify=["true"]), harness="whitebox", endpoint=Endpoint(base_url=policy_server.base_url, model="m"))
    )
    assert res.graph.branches == 1 and len(res.proxy_turns) == 3
    packed = pack(res)
    assert unpack(json.loads(json.dumps(packed))) == res
    assert packed["proxy_turns"][2]["request_messages_from_parent"] > 0
