"""The wire-dialect seam: a second, test-only dialect registered next to chat completions and
driven through a real proxy against the scripted fake policy.

`PlainLines` (tests/fakes/plain_dialect.py) is a made-up wire API that differs from chat
completions everywhere a real one can; the turn is still assembled from the engine's own token ids.
"""

import json
import time

import httpx
import pytest

from harness_env.core.capture.dialects import Route, RouteTable, register_dialect, registered_dialects, unregister_dialect
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.capture.serve import serve_on_loopback
from harness_env.models import Endpoint
from tests.core.capture.dialect_streams import HeldEnd
from tests.fakes.plain_dialect import PlainLines
from tests.fakes.policy import FakePolicy, FakePolicyServer


@pytest.fixture
async def plain_env():
    """One registration, then a proxy made as the server makes it (no `dialects` argument)."""
    register_dialect(PlainLines())
    try:
        policy = FakePolicy(scripts={"m": [{"bash": "echo hi"}, {"text": "all done"}]})
        with FakePolicyServer(policy) as upstream:
            proxy = CaptureProxy()
            async with serve_on_loopback(proxy.app) as url:
                async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                    session = proxy.open_session(Endpoint(base_url=upstream.base_url, api_key="sk-up", model="m"), CapturePolicy(top_logprobs=2))
                    yield proxy, policy, session, client
            await proxy.aclose()
    finally:
        unregister_dialect("plain_lines")


@pytest.mark.parametrize("stream", [True, False])
async def test_a_registered_dialect_is_translated_both_ways_and_recorded_from_the_engine(plain_env, stream):
    proxy, policy, session, client = plain_env
    h = {"x-plain-key": session.key}
    r = await client.post("/plain/whatever:complete", json={"prompt": "go", "tools": ["bash"], "stream": stream}, headers=h)
    assert r.status_code == 200
    if stream:
        assert r.headers["content-type"] == "application/x-ndjson"
        *deltas, last = [json.loads(line) for line in r.text.splitlines()]
        assert deltas == [] and last["done"] is True  # a tool call: no text to stream
    else:
        last = r.json()
    assert last["calls"] == [{"name": "bash", "arguments": json.dumps({"command": "echo hi"})}] and last["finish"] == "tool_calls"
    # The engine got chat completions with the session's policy applied, and the real key and model.
    [sent] = policy.sent
    assert sent.request["messages"] == [{"role": "user", "content": "go"}] and sent.request["tools"][0]["function"]["name"] == "bash"
    assert sent.request["model"] == "m" and sent.request["return_token_ids"] is True and sent.request["top_logprobs"] == 2
    assert policy.headers[0]["authorization"] == "Bearer sk-up"
    # The turn: the neutral view of the request, and the engine's ids as the truth.
    [turn] = session.turns
    assert turn.purpose == "policy" and turn.stream is stream and turn.request_messages == [{"role": "user", "content": "go"}]
    assert turn.prompt_token_ids == sent.prompt_token_ids and turn.completion_token_ids == sent.completion_token_ids
    assert turn.per_token_logps == sent.logprobs and turn.capture_level == "tokens"
    # Chat completions is still served by the same proxy.
    chat = await client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "title?"}]}, headers={"authorization": f"Bearer {session.key}"}
    )
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"] == "Fake title"
    assert [t.purpose for t in session.sorted_turns()] == ["policy", "auxiliary"]


async def test_the_stream_is_translated_chunk_by_chunk_as_the_engine_sends(plain_env):
    proxy, policy, session, client = plain_env
    pieces = [f'data: {{"choices": [{{"index": 0, "delta": {{"content": "{w} "}}}}]}}\n\n' for w in ("one", "two", "three")]
    held = HeldEnd([*pieces, 'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'])
    policy.scripts["m"] = [{"raw": held, "gap_s": 0.3}]
    lines = []
    started = time.monotonic()
    async with client.stream("POST", "/plain/m:complete", json={"prompt": "go", "tools": ["bash"], "stream": True}, headers={"x-plain-key": session.key}) as r:
        async for line in r.aiter_lines():
            if line:
                lines.append(json.loads(line))
                if "delta" in lines[-1]:
                    held.word_seen()  # the engine's end is held until then
    assert [a.get("delta") for a in lines[:3]] == ["one ", "two ", "three "]
    assert lines[-1] == {"done": True, "text": "one two three ", "calls": [], "finish": "stop", "error": None}
    [turn] = session.turns
    assert turn.completion_text == "one two three " and turn.finish_reason == "stop"
    assert started + turn.ttft_s < held.released_at  # timed at the first token, not the end


async def test_errors_and_local_routes_speak_the_dialect(plain_env):
    proxy, policy, session, client = plain_env
    r = await client.post("/plain/m:complete", json={"prompt": "go"}, headers={"authorization": f"Bearer {session.key}"})
    assert r.status_code == 401 and r.json() == {"problem": "unknown or expired capture key", "code": "invalid_api_key"}
    r = await client.post("/plain/m:complete", json={"prompt": 3}, headers={"x-plain-key": session.key})
    assert r.status_code == 400 and r.json() == {"problem": "'prompt' must be a string", "code": "invalid_request"}
    policy.scripts["m"] = [{"status": 503}]
    r = await client.post("/plain/m:complete", json={"prompt": "go", "tools": ["bash"]}, headers={"x-plain-key": session.key})
    assert r.status_code == 503 and r.json()["code"] == "upstream" and "scripted failure 503" in r.json()["problem"]
    assert session.turns[-1].upstream_status == 503
    r = await client.get("/plain/ping", headers={"x-plain-key": session.key})
    assert r.status_code == 200 and r.json() == {"pong": "m"}
    r = await client.post("/plain/m:explode", json={}, headers={"x-plain-key": session.key})
    assert r.status_code == 404 and "POST /v1/chat/completions" in r.text and "POST /plain/{model}:complete" in r.text


def test_a_route_is_claimed_once_and_a_name_registered_once():
    class Squatter(PlainLines):
        name = "squatter"
        routes = (Route("POST", "/v1/chat/completions"),)

    with pytest.raises(ValueError, match="both claim POST /v1/chat/completions"):
        register_dialect(Squatter())
    with pytest.raises(ValueError, match="already registered"):
        register_dialect(registered_dialects()[0])
    assert [d.name for d in registered_dialects()] == ["chat_completions", "responses", "messages", "gemini"]


def test_routes_match_exactly_or_by_template():
    gemini = Route("POST", "/v1beta/models/{model}:generateContent")
    assert gemini.match("/v1beta/models/gemini-2.5:generateContent") == {"model": "gemini-2.5"}
    assert gemini.match("/v1beta/models/gemini-2.5:streamGenerateContent") is None
    assert gemini.match("/v1beta/models/a/b:generateContent") is None
    assert Route("GET", "/v1/models").match("/v1/models") == {} and Route("GET", "/v1/models").match("/v1/models/") is None
    table = RouteTable(registered_dialects())
    assert table.find("POST", "/v1/chat/completions")[0].name == "chat_completions"
    assert table.find("GET", "/v1/chat/completions") is None
