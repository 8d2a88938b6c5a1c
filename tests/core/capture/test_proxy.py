"""The capture proxy against the scripted fake policy, over real HTTP on loopback."""

import asyncio
import json

import httpx
import pytest

from harness_env import RolloutRequest, Task, run_rollout
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.redact import register_secret, unregister_secret
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.capture.serve import serve_on_loopback
from harness_env.core.capture.sse import SSEDecoder
from harness_env.models import Endpoint
from tests.fakes.policy import FakePolicy, FakePolicyServer

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "required": ["command"]}}}]
UPSTREAM_KEY = "sk-upstream-secret-123"


def _body(stream, **kw):
    return {"model": "whatever", "messages": [{"role": "user", "content": "go"}], "tools": TOOLS, "stream": stream, **kw}


@pytest.fixture
async def proxy_env():
    policy = FakePolicy(scripts={"m": [{"bash": "echo hi"}, {"text": "all done"}]})
    with FakePolicyServer(policy) as upstream:
        proxy = CaptureProxy()
        async with serve_on_loopback(proxy.app) as url:
            async with httpx.AsyncClient(base_url=url + "/v1", timeout=30) as client:
                yield proxy, policy, upstream, client
        await proxy.aclose()


def _endpoint(upstream, key=UPSTREAM_KEY):
    return Endpoint(base_url=upstream.base_url, api_key=key, model="m")


async def test_unknown_key_is_rejected(proxy_env):
    proxy, policy, upstream, client = proxy_env
    r = await client.post("/chat/completions", json=_body(False), headers={"authorization": "Bearer nope"})
    assert r.status_code == 401 and policy.requests == []
    r = await client.post("/chat/completions", json=_body(False))
    assert r.status_code == 401


@pytest.mark.parametrize("stream", [True, False])
async def test_turn_records_exactly_what_the_engine_sent(proxy_env, stream):
    proxy, policy, upstream, client = proxy_env
    session = proxy.open_session(_endpoint(upstream), CapturePolicy(top_logprobs=2))
    r = await client.post("/chat/completions", json=_body(stream), headers={"authorization": f"Bearer {session.key}"})
    assert r.status_code == 200
    if stream:
        events = SSEDecoder().feed(r.content)
        assert events[-1] == "[DONE]"
        args = "".join(tc["function"].get("arguments", "") for e in events[:-1] for c in json.loads(e)["choices"] for tc in c["delta"].get("tool_calls", []))
    else:
        args = r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(args) == {"command": "echo hi"}  # the harness gets the answer intact
    [turn] = session.turns
    [sent] = policy.sent
    assert turn.prompt_token_ids == sent.prompt_token_ids and len(sent.prompt_token_ids) > 0
    assert turn.completion_token_ids == sent.completion_token_ids and len(sent.completion_token_ids) > 0
    assert turn.per_token_logps == sent.logprobs
    assert len(turn.top_logprobs) == len(sent.logprobs) and len(turn.top_logprobs[0]) == 2
    assert turn.tool_calls[0]["function"]["arguments"] == args
    assert turn.capture_level == "tokens" and turn.stream is stream and turn.upstream_status == 200
    assert turn.request_messages == [{"role": "user", "content": "go"}]
    # The upstream saw the real key and model; the session key never left the proxy.
    assert policy.headers[0]["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert policy.requests[0]["model"] == "m" and policy.requests[0]["return_token_ids"] is True
    assert session.key not in json.dumps(policy.requests) + json.dumps(policy.headers)


async def test_black_box_asks_for_nothing_and_records_text(proxy_env):
    proxy, policy, upstream, client = proxy_env
    session = proxy.open_session(_endpoint(upstream), CapturePolicy(capture=False))
    r = await client.post("/chat/completions", json=_body(True), headers={"authorization": f"Bearer {session.key}"})
    assert r.status_code == 200
    assert "logprobs" not in policy.requests[0] and "return_token_ids" not in policy.requests[0]
    [turn] = session.turns
    assert turn.capture_level == "text" and turn.completion_token_ids == [] and turn.per_token_logps == []


async def test_turn_limit_answers_429(proxy_env):
    proxy, policy, upstream, client = proxy_env
    session = proxy.open_session(_endpoint(upstream), CapturePolicy(max_turns=1))
    h = {"authorization": f"Bearer {session.key}"}
    assert (await client.post("/chat/completions", json=_body(False), headers=h)).status_code == 200
    r = await client.post("/chat/completions", json=_body(False, temperature=0.5), headers=h)  # not a retry of the first
    assert r.status_code == 429 and "turn limit" in r.json()["error"]["message"]
    assert session.turn_limit_hit and len(policy.requests) == 1


async def test_policy_caps_and_thinking(proxy_env):
    proxy, policy, upstream, client = proxy_env
    session = proxy.open_session(_endpoint(upstream), CapturePolicy(max_tokens_cap=64, disable_thinking=True))
    await client.post("/chat/completions", json=_body(False, max_completion_tokens=4096), headers={"authorization": f"Bearer {session.key}"})
    assert policy.requests[0]["max_completion_tokens"] == 64
    assert policy.requests[0]["chat_template_kwargs"] == {"enable_thinking": False}


PARAMS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
# Per dialect: (path below the proxy's root, the key's header, a body with `history` as its turns
# before the last user message).
DIALECT_CALLS = {
    "responses": (
        "/v1/responses",
        "authorization",
        lambda history: {
            "model": "m",
            "tools": [{"type": "function", "name": "bash", "parameters": PARAMS}],
            "input": [
                *({"type": "message", "role": r, "content": t if r == "user" else [{"type": "output_text", "text": t}]} for r, t in history),
                {"type": "message", "role": "user", "content": "again"},
            ],
        },
    ),
    "messages": (
        "/v1/messages",
        "x-api-key",
        lambda history: {
            "model": "m",
            "max_tokens": 100,
            "tools": [{"name": "bash", "input_schema": PARAMS}],
            "messages": [*({"role": r, "content": t} for r, t in history), {"role": "user", "content": "again"}],
        },
    ),
    "gemini": (
        "/v1beta/models/m:generateContent",
        "x-goog-api-key",
        lambda history: {
            "tools": [{"functionDeclarations": [{"name": "bash", "parametersJsonSchema": PARAMS}]}],
            "contents": [
                *({"role": "model" if r == "assistant" else r, "parts": [{"text": t}]} for r, t in history),
                {"role": "user", "parts": [{"text": "again"}]},
            ],
        },
    ),
}


@pytest.mark.parametrize("dialect", sorted(DIALECT_CALLS))
async def test_an_agents_rejected_request_changes_no_sessions_capture_in_any_dialect(proxy_env, dialect):
    proxy, policy, upstream, client = proxy_env
    policy.scripts["m"] = [{"bash": "echo hi"}, {"raw": HOSTILE_400, "status": 400}]
    path, header, body = DIALECT_CALLS[dialect]
    url = str(client.base_url).rstrip("/").removesuffix("/v1") + path

    def key(session):
        return {header: f"Bearer {session.key}" if header == "authorization" else session.key}

    hostile = proxy.open_session(_endpoint(upstream), CapturePolicy(top_logprobs=2, disable_thinking=True))
    other = proxy.open_session(_endpoint(upstream), CapturePolicy(top_logprobs=2, disable_thinking=True))
    for _ in range(2):
        r = await client.post(url, json=body([("user", "go"), ("assistant", "ok")]), headers=key(hostile))
        assert r.status_code == 400 and "float_parsing" in r.text
    for session in (other, hostile):
        r = await client.post(url, json=body([]), headers=key(session))
        assert r.status_code == 200, r.text
        assert policy.requests[-1].items() >= CAPTURE_FIELDS.items()
        assert session.turns[-1].capture_level == "tokens"


async def test_engine_parameters_off_the_allow_list_are_dropped_and_reported(proxy_env):
    proxy, policy, upstream, client = proxy_env
    session = proxy.open_session(_endpoint(upstream), CapturePolicy(max_tokens_cap=64))
    hostile = {"n": 64, "best_of": 64, "max_tokens": 10**7, "min_tokens": 10**6, "ignore_eos": True, "prompt_logprobs": 5, "logit_bias": {"7": 100}}
    r = await client.post("/chat/completions", json=_body(False, **hostile), headers={"authorization": f"Bearer {session.key}"})
    assert r.status_code == 200
    [sent] = policy.requests
    assert not set(hostile) - {"max_tokens"} & set(sent) and sent["max_tokens"] == 64
    assert session.dropped_fields == set(hostile) - {"max_tokens"}
    many = {f"made_up_{i:05d}_" + "x" * 200: 1 for i in range(5000)}  # made-up fields: the record stays small
    r = await client.post("/chat/completions", json=_body(False, **many), headers={"authorization": f"Bearer {session.key}"})
    assert r.status_code == 200 and "made_up_00000_" not in json.dumps(policy.requests[-1])
    assert len(session.dropped_fields) == 64 and max(len(f) for f in session.dropped_fields) <= 64


async def test_hosted_api_rejecting_fields_is_not_broken(proxy_env):
    proxy, policy, upstream, client = proxy_env
    policy.reject_unknown_fields = True
    policy.require_max_completion_tokens = True
    session = proxy.open_session(_endpoint(upstream), CapturePolicy(disable_thinking=True))
    h = {"authorization": f"Bearer {session.key}"}
    r = await client.post("/chat/completions", json=_body(True, max_tokens=100), headers=h)
    assert r.status_code == 200
    assert set(session.dropped_fields) >= {"return_token_ids", "chat_template_kwargs", "max_tokens"}
    [turn] = session.turns
    assert turn.capture_level == "logprobs" and turn.per_token_logps  # logprobs still captured
    # The lesson is remembered: the next session on that endpoint needs no retry.
    n = len(policy.requests)
    s2 = proxy.open_session(_endpoint(upstream), CapturePolicy(disable_thinking=True))
    r = await client.post("/chat/completions", json=_body(False, max_tokens=100), headers={"authorization": f"Bearer {s2.key}"})
    assert r.status_code == 200 and len(policy.requests) == n + 1


# -- what the proxy learns of an endpoint comes from its own probe only (issue 25 item 3) --------
# vLLM's validation errors quote the input: an agent can make any field's name appear in a 400.
HOSTILE_400 = json.dumps(
    {
        "object": "error",
        "type": "BadRequestError",
        "param": "logprobs",
        "code": 400,
        "message": "[{'type': 'float_parsing', 'loc': ('body', 'temperature'), 'msg': 'Input should be a valid number', "
        "'input': 'logprobs top_logprobs return_token_ids chat_template_kwargs max_tokens max_completion_tokens'}]",
    }
)
CAPTURE_FIELDS = {"logprobs": True, "top_logprobs": 2, "return_token_ids": True, "chat_template_kwargs": {"enable_thinking": False}}


def _continued(stream):
    """A request with one assistant message in it: the fake answers it with its script's step 1."""
    history = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]
    return _body(stream, messages=history, max_tokens=100)


@pytest.mark.parametrize("stream", [True, False])
async def test_an_agents_rejected_request_changes_no_sessions_capture(proxy_env, stream):
    proxy, policy, upstream, client = proxy_env
    policy.scripts["m"] = [{"bash": "echo hi"}, {"raw": HOSTILE_400, "status": 400}]
    hostile = proxy.open_session(_endpoint(upstream), CapturePolicy(top_logprobs=2, disable_thinking=True))
    other = proxy.open_session(_endpoint(upstream), CapturePolicy(top_logprobs=2, disable_thinking=True))
    for _ in range(3):
        r = await client.post("/chat/completions", json=_continued(stream), headers={"authorization": f"Bearer {hostile.key}"})
        assert r.status_code == 400 and "float_parsing" in r.text  # the agent gets its own error, as the engine sent it
    for session in (other, hostile):  # another rollout, and the same one's next call
        n = len(policy.requests)
        r = await client.post("/chat/completions", json=_body(stream, max_tokens=100), headers={"authorization": f"Bearer {session.key}"})
        assert r.status_code == 200 and len(policy.requests) == n + 1  # asked once, with everything
        assert policy.requests[-1].items() >= CAPTURE_FIELDS.items() and policy.requests[-1]["max_tokens"] == 100
        assert session.turns[-1].capture_level == "tokens" and session.turns[-1].completion_token_ids
        assert not session.dropped_fields & {"logprobs", "top_logprobs", "return_token_ids", "chat_template_kwargs", "max_tokens"}
    # What the rejections cost the endpoint: one probe request of the proxy's own, not one per rejection.
    probes = [b for b in policy.requests if not b.get("tools")]
    assert len(probes) == 1 and probes[0]["messages"] != _continued(stream)["messages"]


async def test_upstream_errors_are_passed_through_and_recorded(proxy_env):
    proxy, policy, upstream, client = proxy_env
    policy.scripts["m"] = [{"status": 503}]
    session = proxy.open_session(_endpoint(upstream), CapturePolicy())
    r = await client.post("/chat/completions", json=_body(True), headers={"authorization": f"Bearer {session.key}"})
    assert r.status_code == 503 and "scripted failure" in r.json()["error"]["message"]
    [turn] = session.turns
    assert turn.upstream_status == 503 and "scripted failure" in turn.upstream_error


async def test_unreachable_upstream_gives_502_and_marks_session(proxy_env):
    proxy, policy, upstream, client = proxy_env
    dead = Endpoint(base_url="http://127.0.0.1:9/v1", api_key=UPSTREAM_KEY, model="m")
    session = proxy.open_session(dead, CapturePolicy())
    r = await client.post("/chat/completions", json=_body(False), headers={"authorization": f"Bearer {session.key}"})
    assert r.status_code == 502 and "unreachable" in r.json()["error"]["message"]
    assert session.last_failure_infra and session.turns[0].upstream_status is None
    assert UPSTREAM_KEY not in session.log_tail() + json.dumps([t.model_dump() for t in session.sorted_turns()])


async def test_auxiliary_calls_are_tagged_and_not_counted(proxy_env):
    proxy, policy, upstream, client = proxy_env
    session = proxy.open_session(_endpoint(upstream), CapturePolicy(max_turns=1))
    h = {"authorization": f"Bearer {session.key}"}
    r = await client.post("/chat/completions", json={"messages": [{"role": "user", "content": "title?"}]}, headers=h)
    assert r.status_code == 200
    assert (await client.post("/chat/completions", json=_body(False), headers=h)).status_code == 200
    assert [t.purpose for t in session.turns] == ["auxiliary", "policy"]


# -- budgets: calls without tools and recorded bytes (issue 25 item 6) ----------------------------
async def test_auxiliary_calls_past_their_limit_are_refused_with_the_option_named(proxy_env):
    proxy, policy, upstream, client = proxy_env
    session = proxy.open_session(_endpoint(upstream), CapturePolicy(max_turns=1, max_auxiliary_calls=2))
    h = {"authorization": f"Bearer {session.key}"}

    def title(i):  # each a new call: an equal one would be a retry, answered again without a call
        return {"messages": [{"role": "user", "content": f"title {i}?"}]}

    assert [(await client.post("/chat/completions", json=title(i), headers=h)).status_code for i in range(2)] == [200, 200]
    r = await client.post("/chat/completions", json=title(2), headers=h)
    assert r.status_code == 429 and r.json()["error"]["code"] == "auxiliary_call_limit"
    assert "max_auxiliary_calls" in r.json()["error"]["message"] and len(policy.requests) == 2 and len(session.turns) == 2
    assert (await client.post("/chat/completions", json=_body(False), headers=h)).status_code == 200  # policy calls go on
    assert session.limit_reached and not session.turn_limit_hit and "max_auxiliary_calls" in session.log_tail()
    assert len(session.limits_hit) == 1 and "2 model calls without tools" in session.limits_hit[0]


@pytest.mark.parametrize("tools", [True, False])
async def test_recorded_bytes_past_the_budget_are_refused_and_nothing_more_is_held(proxy_env, tools):
    """Distinct 1 MB histories (what 8 MB calls did at scale): each is recorded whole (the
    messages, and the prompt's ids, which here take more), until the budget."""
    proxy, policy, upstream, client = proxy_env
    session = proxy.open_session(_endpoint(upstream), CapturePolicy(max_recorded_bytes=6 * 1024 * 1024))
    h = {"authorization": f"Bearer {session.key}"}
    statuses = []
    for i in range(5):
        big = {"messages": [{"role": "user", "content": f"{i} " + "x" * 1_000_000}], **({"tools": TOOLS} if tools else {})}
        r = await client.post("/chat/completions", json=big, headers=h)
        statuses.append(r.status_code)
    assert statuses == [200, 200, 429, 429, 429] and len(policy.requests) == 2 and len(session.turns) == 2
    assert r.json()["error"]["code"] == "recorded_bytes_limit" and "max_recorded_mb" in r.json()["error"]["message"]
    assert 5 * 1024 * 1024 < session.recorded_bytes <= 6 * 1024 * 1024  # 1 MB of messages and ~1.8 MB of prompt ids a call
    assert session.limit_reached and session.limits_hit == ["this rollout's budget of 6 MiB of recorded model calls is used up"]
    r = await client.post("/chat/completions", json=_body(False), headers=h)  # a small call still fits
    assert r.status_code == 200


async def test_a_long_honest_history_is_counted_once(proxy_env):
    """A harness resends its whole history each call: only what is new counts against the budget."""
    proxy, policy, upstream, client = proxy_env
    policy.scripts["m"] = [{"bash": f"echo {i}"} for i in range(30)]
    session = proxy.open_session(_endpoint(upstream), CapturePolicy(max_recorded_bytes=1024 * 1024))
    h = {"authorization": f"Bearer {session.key}"}
    messages = [{"role": "user", "content": "go " + "y" * 100_000}]  # 100 KB sent again every call: 3 MB in all
    for _ in range(30):
        r = await client.post("/chat/completions", json=_body(False, messages=messages), headers=h)
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        messages = [*messages, message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "ok"}]
    assert 100_000 < session.recorded_bytes < 400_000 and not session.limits_hit


async def test_one_history_resent_unchanged_cannot_inflate_the_result_past_the_budget(proxy_env):
    """The record keeps a resent history once, but a result holds every call's whole request: calls
    without tools that resend one big message again and again are refused once their whole
    requests pass 4x the budget (the expanded result stays bounded), honest growth is not."""
    proxy, policy, upstream, client = proxy_env
    policy.scripts["m"] = [{"text": "ok"}] * 40
    session = proxy.open_session(_endpoint(upstream), CapturePolicy(max_recorded_bytes=2 * 1024 * 1024))
    h = {"authorization": f"Bearer {session.key}"}
    messages = [{"role": "user", "content": "x" * 300_000}]  # 0.3 MB whole a call: 27 fit in 4 x 2 MiB
    codes = []
    for i in range(40):  # each a new call (its seed): an equal one would be a retry, answered again
        r = await client.post("/chat/completions", json={"model": "m", "messages": messages, "seed": i}, headers=h)
        codes.append(r.status_code)
    admitted = codes.count(200)
    assert 20 <= admitted <= 28 and codes == [200] * admitted + [429] * (40 - admitted), (codes, r.text)
    assert "max_recorded_mb" in r.text and "sent whole" in r.text and session.limits_hit
    assert session.recorded_bytes < 1024 * 1024  # the record itself kept the message once
    assert len(policy.requests) == codes.count(200)


@pytest.mark.parametrize("path", ["/messages", "/v1beta/models/m:generateContent"])
async def test_budget_refusals_tell_each_dialects_client_not_to_retry(proxy_env, path):
    proxy, policy, upstream, client = proxy_env
    session = proxy.open_session(_endpoint(upstream), CapturePolicy(max_recorded_bytes=10))
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], "contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    url = str(client.base_url).rstrip("/").removesuffix("/v1") + ("/v1" + path if path == "/messages" else path)
    r = await client.post(url, json=body, headers={"x-api-key": session.key, "x-goog-api-key": session.key})
    assert r.status_code == 429 and "max_recorded_mb" in r.text and policy.requests == []
    assert r.headers.get("x-should-retry") == "false" or "RetryInfo" in r.text


async def test_closed_session_key_is_rejected(proxy_env):
    proxy, policy, upstream, client = proxy_env
    session = proxy.open_session(_endpoint(upstream), CapturePolicy())
    await proxy.close_session(session)
    r = await client.post("/chat/completions", json=_body(False), headers={"authorization": f"Bearer {session.key}"})
    assert r.status_code == 401


@pytest.mark.parametrize("stream", [True, False])
async def test_closing_a_session_aborts_its_calls_in_flight(proxy_env, stream):
    """Waiting for the upstream's answer (hang), or in the middle of relaying its stream (raw chunks
    10 s apart): closing the session ends both at once."""
    proxy, policy, upstream, client = proxy_env
    slow = [{"raw": ['data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n', "data: [DONE]\n\n"], "gap_s": 10}]
    policy.scripts["m"] = slow if stream else [{"hang": 10}]
    session = proxy.open_session(_endpoint(upstream), CapturePolicy())
    call = asyncio.create_task(client.post("/chat/completions", json=_body(stream), headers={"authorization": f"Bearer {session.key}"}))
    while not policy.requests:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)  # the first chunk is relayed (stream), the call waits (hang)
    await proxy.close_session(session)
    r = await asyncio.wait_for(call, 60)  # a hang fails here; the answer below says it was cut, not finished by the upstream
    if stream:
        assert r.status_code == 200 and b'"a"' in r.content and b"[DONE]" not in r.content
        assert "upstream stream broke" in session.turns[0].upstream_error
    else:
        assert r.status_code == 499 and "aborted: the rollout ended" in r.json()["error"]["message"]
        assert session.turns[0].upstream_error == "aborted: the rollout ended"


async def test_a_quiesced_session_refuses_new_calls_and_aborts_those_in_flight(proxy_env):
    """Once the agent's run is over, what it left running in the sandbox gets no more model calls:
    the one in flight is cut (the endpoint's slot freed) and a new one is refused before the upstream."""
    proxy, policy, upstream, client = proxy_env
    policy.scripts["m"] = [{"hang": 30}]
    session = proxy.open_session(_endpoint(upstream), CapturePolicy())
    h = {"authorization": f"Bearer {session.key}"}
    call = asyncio.create_task(client.post("/chat/completions", json=_body(False), headers=h))
    while not policy.requests:
        await asyncio.sleep(0.02)
    session.quiesce()
    r = await asyncio.wait_for(call, 60)
    assert r.status_code == 499 and session.turns[0].upstream_error == "aborted: the rollout ended"
    sent = len(policy.requests)
    again = await client.post("/chat/completions", json=_body(False), headers=h)
    assert again.status_code == 409 and "run is over" in again.json()["error"]["message"]
    assert len(policy.requests) == sent and len(session.turns) == 1


async def test_request_bytes_held_at_once_are_bounded_per_rollout_and_in_all():
    """Bodies are read whole before any budget is checked: one rollout's connections cannot make
    the proxy hold more than its share of request bytes at once (429), nor all rollouts together
    more than the proxy's (503); what was held is given back when each call ends."""
    from harness_env.core.capture.request_bytes import RequestBytes

    policy = FakePolicy(scripts={"m": [{"hang": 3}] * 3})
    with FakePolicyServer(policy) as upstream:
        proxy = CaptureProxy(request_bytes=RequestBytes(per_session=1024 * 1024, total=1100 * 1024))
        async with serve_on_loopback(proxy.app) as url, httpx.AsyncClient(base_url=url + "/v1", timeout=60) as client:
            a, b = (proxy.open_session(_endpoint(upstream), CapturePolicy()) for _ in range(2))
            big = [{"role": "user", "content": "z" * 400_000}]

            def call(session, seed=0):  # calls with one seed are retries of one another: `seed` tells them apart
                return asyncio.create_task(
                    client.post(
                        "/chat/completions",
                        json={"model": "m", "messages": big, "tools": TOOLS, "seed": seed},
                        headers={"authorization": f"Bearer {session.key}"},
                    )
                )

            first = [call(a), call(a, 1)]
            while len(policy.requests) < 2:  # both read and waiting for the engine: 0.8 MB of a's 1 MiB held
                await asyncio.sleep(0.02)
            third = await call(a, 2)
            assert third.status_code == 429 and "at once" in third.json()["error"]["message"]
            other = await call(b)  # b's own share is free, the proxy's 1.1 MB is not
            assert other.status_code == 503 and "retry" in other.json()["error"]["message"]
            assert [r.status_code for r in await asyncio.gather(*first)] == [200, 200]
            again = await call(a, 3)  # given back when the calls ended
            assert again.status_code == 200 and len(policy.requests) == 3
        await proxy.aclose()


async def test_malformed_stream_is_relayed_as_is_and_recorded(proxy_env):
    proxy, policy, upstream, client = proxy_env
    policy.scripts["m"] = [{"malformed": True}]
    session = proxy.open_session(_endpoint(upstream), CapturePolicy())
    r = await client.post("/chat/completions", json=_body(True), headers={"authorization": f"Bearer {session.key}"})
    assert r.status_code == 200 and b"this is not json" in r.content  # the harness sees what upstream sent
    [turn] = session.turns
    assert turn.completion_text == "partial" and turn.finish_reason == "stop"
    assert "malformed stream chunk" in turn.upstream_error


# -- secrets never come back (issue 18 item 7) -----------------------------------------------
LONG_KEY = "sk-proj-Q7xv9LmN2pRt8ZkW4yHc6JdB3sFg5TaE"


def _nowhere(session, *texts):
    """Everything the harness and the result can see, as one string."""
    return "\n".join([*texts, session.log_tail(), json.dumps([t.model_dump(mode="json") for t in session.sorted_turns()])])


@pytest.mark.parametrize("stream", [True, False])
async def test_key_echoed_in_a_401_never_reaches_the_harness_or_the_record(proxy_env, stream):
    proxy, policy, upstream, client = proxy_env
    policy.scripts["m"] = [{"status": 401, "echo_auth": True}]
    session = proxy.open_session(_endpoint(upstream, LONG_KEY), CapturePolicy())
    r = await client.post("/chat/completions", json=_body(stream), headers={"authorization": f"Bearer {session.key}"})
    assert policy.headers[0]["authorization"] == f"Bearer {LONG_KEY}"  # the upstream did get the key, and echoed it
    assert r.status_code == 401 and r.json()["error"]["message"].startswith("Incorrect API key provided: [redacted].")
    [turn] = session.turns
    assert turn.upstream_status == 401 and "Incorrect API key provided: [redacted]." in turn.upstream_error
    assert LONG_KEY[:20] not in _nowhere(session, r.text, str(r.headers))


@pytest.mark.parametrize("stream", [True, False])
async def test_key_written_as_json_escapes_in_an_error_is_masked_as_the_harness_decodes_it(proxy_env, stream):
    proxy, policy, upstream, client = proxy_env
    escaped = "".join(f"\\u{ord(c):04X}" if i % 2 else f"\\u{ord(c):04x}" for i, c in enumerate(LONG_KEY))
    policy.scripts["m"] = [{"raw": '{"error": {"message": "Incorrect API key provided: ' + escaped + '", "code": "invalid_api_key"}}', "status": 401}]
    session = proxy.open_session(_endpoint(upstream, LONG_KEY), CapturePolicy())
    r = await client.post("/chat/completions", json=_body(stream), headers={"authorization": f"Bearer {session.key}"})
    assert r.status_code == 401
    message = json.loads(r.content)["error"]["message"]  # what a harness shows the agent
    assert message == "Incorrect API key provided: [redacted]"
    assert json.loads(json.dumps(session.turns[0].upstream_error)) == session.turns[0].upstream_error
    assert LONG_KEY[:12] not in json.loads(session.turns[0].upstream_error)["error"]["message"]
    assert LONG_KEY[:12] not in _nowhere(session, message)


async def test_key_in_a_streamed_answer_split_across_chunks_is_masked(proxy_env):
    proxy, policy, upstream, client = proxy_env
    head = 'data: {"choices": [{"index": 0, "delta": {"content": "see {key}'
    # The key straddles two chunks, cut where neither piece is long enough to be masked alone.
    chunks = [head.replace("{key}", LONG_KEY[:12]), LONG_KEY[12:] + '"}, "finish_reason": "stop"}]}\n\n', "data: [DONE]\n\n"]
    policy.scripts["m"] = [{"raw": chunks, "gap_s": 0.05}]
    session = proxy.open_session(_endpoint(upstream, LONG_KEY), CapturePolicy())
    r = await client.post("/chat/completions", json=_body(True), headers={"authorization": f"Bearer {session.key}"})
    assert r.status_code == 200
    [event, done] = SSEDecoder().feed(r.content)
    assert json.loads(event)["choices"][0]["delta"]["content"] == "see [redacted]" and done == "[DONE]"
    [turn] = session.turns
    assert turn.completion_text == "see [redacted]" and turn.finish_reason == "stop"
    assert LONG_KEY[:12] not in _nowhere(session, r.text) and LONG_KEY[12:] not in _nowhere(session, r.text)


async def test_key_in_a_plain_answer_and_in_the_harness_history_is_masked(proxy_env):
    proxy, policy, upstream, client = proxy_env
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "the key is {key}"}, "finish_reason": "stop"}]}
    policy.scripts["m"] = [{"raw": json.dumps(answer)}]
    session = proxy.open_session(_endpoint(upstream, LONG_KEY), CapturePolicy())
    h = {"authorization": f"Bearer {session.key}"}
    r = await client.post("/chat/completions", json=_body(False), headers=h)
    assert r.json()["choices"][0]["message"]["content"] == "the key is [redacted]"
    # A harness that was somehow shown the key sends it back: the upstream gets the request as
    # sent (it owns the key), the record does not keep it.
    leaked = _body(False, messages=[{"role": "user", "content": f"go {LONG_KEY}"}])
    await client.post("/chat/completions", json=leaked, headers=h)
    assert LONG_KEY in policy.requests[-1]["messages"][0]["content"]
    assert session.turns[-1].request_messages == [{"role": "user", "content": "go [redacted]"}]
    assert session.turns[0].completion_text == "the key is [redacted]"
    assert LONG_KEY[:20] not in _nowhere(session, r.text)


async def test_registered_secrets_are_masked_too(proxy_env):
    proxy, policy, upstream, client = proxy_env
    judge = "judge-secret-0123456789abcdef"
    policy.scripts["m"] = [{"raw": json.dumps({"error": {"message": f"bad judge key {judge}"}}), "status": 500}]
    session = proxy.open_session(_endpoint(upstream, LONG_KEY), CapturePolicy())
    register_secret(judge)
    try:
        r = await client.post("/chat/completions", json=_body(False), headers={"authorization": f"Bearer {session.key}"})
    finally:
        unregister_secret(judge)
    assert r.status_code == 500 and r.json()["error"]["message"] == "bad judge key [redacted]"
    assert judge not in _nowhere(session, r.text)


async def test_key_echoed_in_a_401_is_nowhere_in_a_rollout_result():
    """Through the engine: the agent's view of the error, result.error, the log tails, the turns."""
    with FakePolicyServer(FakePolicy(scripts={"m": [{"status": 401, "echo_auth": True}]})) as upstream:
        req = RolloutRequest(
            task=Task(instruction="x", verify=["true"]), harness="whitebox", endpoint=Endpoint(base_url=upstream.base_url, model="m", api_key=LONG_KEY)
        )
        res = await run_rollout(req)
    assert "Incorrect API key provided: [redacted]." in res.error and "[redacted]" in res.agent_log_tail
    assert LONG_KEY[:20] not in res.model_dump_json() and LONG_KEY[-20:] not in res.model_dump_json()


async def test_a_rollout_past_its_recorded_bytes_budget_is_graded_and_says_so():
    """Through the engine: the refused call ends the agent's run, verify still grades the
    workspace (an end the agent caused, not the endpoint's), and the result names the budget."""
    script = [{"bash": "touch a; head -c 900000 /dev/zero | tr '\\0' x"}, {"bash": "echo more"}, {"text": "never asked"}]
    with FakePolicyServer(FakePolicy(scripts={"m": script})) as upstream:
        req = RolloutRequest(
            task=Task(instruction="x", verify=["test -f a"]),
            harness="whitebox",
            max_recorded_mb=1,
            harness_config={"max_tool_output_bytes": 1_000_000},
            endpoint=Endpoint(base_url=upstream.base_url, model="m"),
        )
        res = await run_rollout(req)
    assert res.reward == 1.0 and res.error is None and res.error_kind is None
    assert res.limits_hit == ["this rollout's budget of 1 MiB of recorded model calls is used up"]
    assert "max_recorded_mb raises it" in res.proxy_log_tail and "max_recorded_mb" in res.agent_log_tail
    assert [t.upstream_status for t in res.proxy_turns] == [200, 200]  # the refused calls were not recorded


async def test_structured_outputs_constrain_only_the_first_policy_calls(proxy_env):
    """`structured_calls` counts policy calls (with tools); a call without tools is never constrained."""
    proxy, policy, upstream, client = proxy_env
    policy.scripts["m"] = [{"bash": "echo 1"}, {"bash": "echo 2"}, {"text": "done"}, {"text": "a title"}]
    session = proxy.open_session(_endpoint(upstream), CapturePolicy(structured_regex="x+", structured_calls=2))
    h = {"authorization": f"Bearer {session.key}"}
    for body in (_body(False), _body(False, seed=1), {"model": "m", "messages": [{"role": "user", "content": "title?"}]}, _body(False, seed=3)):
        r = await client.post("/chat/completions", json=body, headers=h)
        assert r.status_code == 200, r.text
    sent = [s.request.get("structured_outputs") for s in policy.sent]
    assert sent == [{"regex": "x+"}, {"regex": "x+"}, None, None]
    # and each turn says whether it was: its logprobs are then the constrained sampler's
    assert [(t.purpose, t.constrained) for t in session.turns] == [("policy", True), ("policy", True), ("auxiliary", False), ("policy", False)]
    assert [t.to_turn().constrained for t in session.turns] == [True, True, False, False]


@pytest.mark.parametrize("mask", [False, True])
async def test_constrained_turns_are_left_out_of_the_loss_when_the_rollout_asks(proxy_env, mask):
    """`mask_constrained`: loss_mask 0 on a constrained turn's completion in the rows, TRL's entries
    and the export's sidecar (read back the same); off (the default), trained as sampled."""
    from harness_env.evals.sidecar import rows_from_sidecar, token_sidecar
    from harness_env.models import RolloutResult

    proxy, policy, upstream, client = proxy_env
    policy.scripts["m"] = [{"bash": "echo 1"}, {"text": "done"}]
    session = proxy.open_session(_endpoint(upstream), CapturePolicy(structured_regex="x+", structured_calls=1, mask_constrained=mask))
    h = {"authorization": f"Bearer {session.key}"}
    first = _body(False)
    r = await client.post("/chat/completions", json=first, headers=h)
    assert r.status_code == 200, r.text
    answer = r.json()["choices"][0]["message"]
    r = await client.post(
        "/chat/completions",
        json={**first, "messages": [*first["messages"], answer, {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": "1"}]},
        headers=h,
    )
    assert r.status_code == 200, r.text
    turns = [t.to_turn() for t in session.turns]
    for i, t in enumerate(turns):
        t.branch = 0 if i == 0 or t.continues(turns[i - 1]) else i
    assert [(t.constrained, t.masked) for t in turns] == [(True, mask), (False, False)]
    assert turns[0].completion_mask() == [0 if mask else 1] * len(turns[0].completion_token_ids) and turns[0].completion_token_ids
    result = RolloutResult(rollout_id="r", reward=1.0, proxy_turns=turns)
    rows = [row for row in result.training_rows() if row.trainable]
    assert rows, [row.untrainable_reason for row in result.training_rows()]
    assert all(len(row.loss_mask) == len(row.token_ids) for row in rows)
    assert sum(sum(row.loss_mask) for row in rows) == sum(len(t.completion_token_ids) for t in turns if not (mask and t.constrained))
    sidecar = token_sidecar(result)
    assert [rec["masked"] for rec in sidecar] == [mask, False]
    back = rows_from_sidecar(sidecar, task_id=None, attempt=0, rollout_id="r", reward=1.0, mask_sample=False)
    assert sum(sum(row["loss_mask"]) for row in back) == sum(sum(row.loss_mask) for row in rows)
