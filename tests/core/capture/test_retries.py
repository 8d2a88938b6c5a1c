"""Retried requests never sample twice: the capture proxy against the scripted fake policy, over
real HTTP on loopback."""

import asyncio

import httpx
import pytest

from harness_env.core.capture.graph import link_turns
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.capture.serve import serve_on_loopback
from harness_env.models import Endpoint
from tests.fakes.policy import FakePolicy, FakePolicyServer

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "required": ["command"]}}}]


def _body(stream, content="go"):
    return {"model": "m", "messages": [{"role": "user", "content": content}], "tools": TOOLS, "stream": stream}


@pytest.fixture
async def env():
    policy = FakePolicy(scripts={"m": [{"bash": "echo hi"}, {"text": "all done"}]}, delay_s=0.5)
    with FakePolicyServer(policy) as upstream:
        proxy = CaptureProxy()
        async with serve_on_loopback(proxy.app) as url:
            async with httpx.AsyncClient(base_url=url + "/v1", timeout=30) as client:
                session = proxy.open_session(Endpoint(base_url=upstream.base_url, api_key="k", model="m"), CapturePolicy())
                yield session, policy, client, {"authorization": f"Bearer {session.key}"}
        await proxy.aclose()


def _one_turn_and_a_retry(session):
    turns = session.sorted_turns()
    graph = link_turns(turns)
    assert [(t.parent, t.branch) for t in turns] == [(None, 0), (0, None)] and turns[1].link == "retry"
    assert turns[1].completion_token_ids == [] and len(turns[0].completion_token_ids) > 0
    assert graph.links.get("retry") == 1 and graph.branches == 1
    return turns


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("concurrent", [True, False])
async def test_a_retried_request_gets_the_same_answer_from_one_engine_call(env, stream, concurrent):
    session, policy, client, h = env
    if concurrent:  # the retry arrives while the first is in flight: it waits for that answer
        first, second = await asyncio.gather(*(client.post("/chat/completions", json=_body(stream), headers=h) for _ in range(2)))
    else:
        first = await client.post("/chat/completions", json=_body(stream), headers=h)
        second = await client.post("/chat/completions", json=_body(stream), headers=h)
    assert first.status_code == second.status_code == 200
    assert first.content == second.content and first.headers["content-type"] == second.headers["content-type"]
    assert ("text/event-stream" in second.headers["content-type"]) is stream
    assert len(policy.requests) == 1  # one sample
    turns = _one_turn_and_a_retry(session)
    assert [t.stream for t in turns] == [stream, stream] and turns[1].capture_level == "tokens"


async def test_a_request_retried_after_the_harness_gave_up_waiting_gets_the_answer_still_coming():
    """Claude Code re-sends a call after its API timeout: the engine's answer to the first, which
    arrives after the harness hung up, is the retry's answer."""
    policy = FakePolicy(scripts={"m": [{"bash": "echo hi"}]}, delay_s=1.0)
    with FakePolicyServer(policy) as upstream:
        proxy = CaptureProxy()
        async with serve_on_loopback(proxy.app) as url, httpx.AsyncClient(base_url=url + "/v1") as client:
            session = proxy.open_session(Endpoint(base_url=upstream.base_url, api_key="k", model="m"), CapturePolicy())
            h = {"authorization": f"Bearer {session.key}"}
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/chat/completions", json=_body(False), headers=h, timeout=0.3)
            again = await client.post("/chat/completions", json=_body(False), headers=h, timeout=30)
        await proxy.aclose()
    assert again.status_code == 200 and "echo hi" in again.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert len(policy.requests) == 1
    _one_turn_and_a_retry(session)


async def test_a_different_request_or_a_retry_of_a_failed_call_is_sent_again(env):
    session, policy, client, h = env
    await client.post("/chat/completions", json=_body(False), headers=h)
    await client.post("/chat/completions", json=_body(False, content="something else"), headers=h)
    assert len(policy.requests) == 2  # not equal: sampled
    policy.down_status = 503  # the engine fails: a retry of a failed call is what the harness meant
    failed = [await client.post("/chat/completions", json=_body(False, content="third"), headers=h) for _ in range(2)]
    assert [r.status_code for r in failed] == [503, 503] and len(policy.requests) == 4
    assert [t.link for t in session.sorted_turns()] == [None] * 4


async def test_retries_count_against_the_turn_limit_like_any_model_call():
    """Answered from the record, a retry is still a model call to the harness: an agent that
    resends one request without end meets the turn limit (and its budgets), never unbounded turns."""
    policy = FakePolicy(scripts={"m": [{"bash": "echo hi"}, {"text": "all done"}]})
    with FakePolicyServer(policy) as upstream:
        proxy = CaptureProxy()
        async with serve_on_loopback(proxy.app) as url:
            async with httpx.AsyncClient(base_url=url + "/v1", timeout=30) as client:
                session = proxy.open_session(Endpoint(base_url=upstream.base_url, api_key="k", model="m"), CapturePolicy(max_turns=3))
                h = {"authorization": f"Bearer {session.key}"}
                codes = [(await client.post("/chat/completions", json=_body(False), headers=h)).status_code for _ in range(5)]
        await proxy.aclose()
    assert codes == [200, 200, 200, 429, 429] and len(policy.requests) == 1
    assert len(session.sorted_turns()) == 3 and session.turn_limit_hit
