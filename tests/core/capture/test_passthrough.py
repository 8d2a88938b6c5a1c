"""Pass-through to an upstream that speaks the harness's own dialect (black_box only): the body goes
on unchanged with the upstream key in that dialect's header, the answer comes back unchanged (the
key masked), a turn is still recorded and the turn limit still applies; the refusals up front."""

import json

import httpx
import pytest

from harness_env import Endpoint, RolloutRequest, Task
from harness_env.core.capture.assemble import TurnDraft
from harness_env.core.capture.dialects.gemini import Gemini
from harness_env.core.capture.dialects.messages import Messages
from harness_env.core.capture.dialects.responses import Responses
from harness_env.core.capture.passthrough import NativeReader, NativeStream, check_wire_api, upstream_headers, upstream_url, with_model
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.rewrite import MAX_TOKENS_CEILING, CapturePolicy
from harness_env.core.capture.serve import serve_on_loopback
from harness_env.core.capture.sse import SSEDecoder
from harness_env.core.errors import InvalidRequestError
from harness_env.core.pipeline import prepare
from harness_env.envs import HARNESSES  # the harness registry prepare() looks names up in
from tests.fakes.gemini_upstream import FakeGeminiServer, FakeGeminiUpstream
from tests.fakes.messages_upstream import FakeMessagesServer, FakeMessagesUpstream
from tests.fakes.responses_upstream import FakeResponsesServer, FakeResponsesUpstream

KEY = "sk-ant-native-4b3c2a1"
BASH = {"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


def _native(url: str, wire_api: str = "messages") -> Endpoint:
    return Endpoint(base_url=url, api_key=KEY, model="claude-x", wire_api=wire_api)


def _request(harness: str, wire_api: str, mode: str = "black_box", **kw) -> RolloutRequest:
    return RolloutRequest(task=Task(instruction="hi"), endpoint=_native("http://127.0.0.1:9/v1", wire_api), harness=harness, mode=mode, **kw)


# -- refusals, before anything starts ----------------------------------------------------------------
def test_a_native_endpoint_is_refused_in_transparent_proxy_mode():
    with pytest.raises(InvalidRequestError, match="only in black_box mode.*token ids"):
        prepare(_request("claude-code", "messages", mode="transparent_proxy"), trusted=True)


@pytest.mark.parametrize(
    "harness,wire_api,speaks",
    [
        ("claude-code", "responses", "messages"),
        ("codex", "messages", "responses"),
        ("gemini-cli", "messages", "gemini"),
        ("pi", "messages", "chat_completions"),
        ("opencode", "gemini", "chat_completions"),
    ],
)
def test_a_native_endpoint_in_another_dialect_than_the_harness_is_refused(harness, wire_api, speaks):
    with pytest.raises(InvalidRequestError, match=f"harness {harness!r} speaks {speaks}, but the endpoint's wire_api is {wire_api!r}"):
        prepare(_request(harness, wire_api), trusted=True)


@pytest.mark.parametrize("harness,wire_api", [("claude-code", "messages"), ("codex", "responses"), ("gemini-cli", "gemini"), ("pi", "chat")])
def test_a_native_endpoint_in_the_harness_dialect_is_accepted(harness, wire_api):
    assert harness in HARNESSES
    assert prepare(_request(harness, wire_api), trusted=True).request.endpoint.wire_api == wire_api


def test_harbor_agents_are_checked_by_the_dialect_they_are_pointed_at_the_proxy_with():
    harbor = {"agent": "codex", "sandbox": "local"}
    with pytest.raises(InvalidRequestError, match="harness 'harbor' speaks responses, but the endpoint's wire_api is 'messages'"):
        prepare(_request("harbor", "messages", harness_options=harbor), trusted=True)
    ok = prepare(_request("harbor", "messages", harness_options={"agent": "claude-code", "sandbox": "local"}), trusted=True)
    assert ok.request.endpoint.wire_api == "messages"


def test_the_wire_api_is_one_of_the_served_dialects():
    with pytest.raises(ValueError, match="wire_api"):  # the form, checked by the wire types
        Endpoint(base_url="http://h/v1", model="m", wire_api="Not An API!")
    assert Endpoint(base_url="http://h/v1", model="m").wire_api == "chat"
    # A well-formed name no registered dialect declares: refused when the rollout is prepared.
    with pytest.raises(InvalidRequestError, match="unknown endpoint wire_api 'grpc'; choose one of: chat, responses, messages, gemini"):
        prepare(_request("claude-code", "grpc"), trusted=True)
    check_wire_api(_request("claude-code", "chat", mode="transparent_proxy").model_copy(), "messages")  # chat: anything goes


# -- pure parts ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "base,path,query,url",
    [
        ("https://api.example/v1", "/v1/messages", b"beta=true", "https://api.example/v1/messages?beta=true"),
        ("https://api.example", "/v1/messages", b"", "https://api.example/v1/messages"),
        (
            "https://g.example/v1",
            "/v1beta/models/m:streamGenerateContent",
            b"alt=sse&key=hecap-x",
            "https://g.example/v1beta/models/m:streamGenerateContent?alt=sse",
        ),
        ("http://h:1/openai/v1", "/v1/responses", b"", "http://h:1/openai/v1/responses"),
    ],
)
def test_upstream_url_is_the_native_route_without_the_capture_key(base, path, query, url):
    assert upstream_url(base, path, query) == url


def test_upstream_headers_swap_the_capture_key_for_the_upstream_key_in_the_dialect_header():
    scope = {
        "headers": [
            (b"x-api-key", b"hecap-1"),
            (b"authorization", b"Bearer hecap-1"),
            (b"anthropic-version", b"2023-06-01"),
            (b"anthropic-beta", b"tools-1"),
            (b"host", b"proxy"),
            (b"content-length", b"9"),
        ]
    }
    assert upstream_headers(Messages.native, scope, KEY) == {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "tools-1",
        "accept-encoding": "identity",
        "x-api-key": KEY,
    }
    assert upstream_headers(Gemini.native, scope, KEY)["x-goog-api-key"] == KEY
    assert upstream_headers(Responses.native, scope, KEY)["authorization"] == f"Bearer {KEY}"


def test_a_native_stream_goes_on_unchanged_and_is_read_into_the_turn():
    events = [
        {"type": "message_start", "message": {"content": [], "usage": {"input_tokens": 12}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me"}},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"comm'}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": 'and": "ls"}'}},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 7}},
    ]
    raw = b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)
    draft = TurnDraft()
    stream = NativeStream(Messages.native, draft, "text/event-stream")
    out = b"".join(stream.feed(raw[i : i + 5]) for i in range(0, len(raw), 5)) + stream.close(None)
    stream.finish()
    assert out == raw
    fields = draft.fields()
    assert fields["completion_text"] == "Let me" and fields["finish_reason"] == "tool_use"
    assert fields["tool_calls"] == [{"id": "t1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}]
    assert fields["usage"] == {"input_tokens": 12, "output_tokens": 7} and fields["capture_level"] == "text"


# -- through a real proxy, against a scripted native Messages upstream ---------------------------------
@pytest.fixture
async def native_env():
    upstream = FakeMessagesUpstream(key=KEY, scripts={"claude-x": [{"bash": "echo hi"}, {"text": "your key is {key}"}]})
    with FakeMessagesServer(upstream) as server:
        proxy = CaptureProxy()
        async with serve_on_loopback(proxy.app) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                yield proxy, upstream, server, client
        await proxy.aclose()


def _body(stream: bool, messages: list | None = None) -> dict:
    return {
        "model": "claude-x",
        "max_tokens": 512,
        "stream": stream,
        "tools": [BASH],
        "system": "Be brief.",
        "messages": messages or [{"role": "user", "content": "go"}],
        "metadata": {"user_id": "u1"},
        "top_k": 5,
    }


@pytest.mark.parametrize("stream", [True, False])
async def test_messages_pass_through_relays_the_body_and_answer_unchanged_and_records_the_turn(native_env, stream):
    proxy, upstream, server, client = native_env
    session = proxy.open_session(_native(server.base_url), CapturePolicy(capture=False))
    headers = {"x-api-key": session.key, "anthropic-version": "2023-06-01", "anthropic-beta": "fine-grained-tool-streaming-2025-05-14"}
    body = _body(stream)
    r = await client.post("/v1/messages?beta=true", json=body, headers=headers)
    assert r.status_code == 200
    # The upstream got the harness's body as sent (fields the translation would drop included), the
    # harness's own headers, and the real key in x-api-key; never the capture key.
    assert upstream.requests == [body] and upstream.paths == ["/v1/messages?beta=true"]
    sent = upstream.headers[0]
    assert sent["x-api-key"] == KEY and sent["anthropic-beta"] == headers["anthropic-beta"] and "authorization" not in sent
    assert session.key not in json.dumps(sent)
    if stream:
        events = [json.loads(e) for e in SSEDecoder().feed(r.content)]
        assert [e["type"] for e in events][:2] == ["message_start", "content_block_start"] and events[-1]["type"] == "message_stop"
        assert r.headers["content-type"].startswith("text/event-stream")
    else:
        assert r.json()["content"][0]["name"] == "Bash" and r.json()["stop_reason"] == "tool_use"
    [turn] = session.sorted_turns()
    assert turn.upstream_status == 200 and turn.stream is stream and turn.purpose == "policy"
    assert turn.tool_calls[0]["function"]["name"] == "Bash" and json.loads(turn.tool_calls[0]["function"]["arguments"])["command"] == "echo hi"
    assert turn.finish_reason == "tool_use" and turn.usage["input_tokens"] > 0 and turn.latency_s > 0
    assert turn.request_messages[-1] == {"role": "user", "content": "go"}  # read for the record, not for the upstream
    assert turn.completion_token_ids == [] and turn.capture_level == "text"  # a native upstream gives no token ids


async def test_the_upstream_key_an_answer_echoes_is_masked_and_never_recorded(native_env):
    proxy, upstream, server, client = native_env
    session = proxy.open_session(_native(server.base_url), CapturePolicy(capture=False))
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": {"command": "echo hi"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "hi"}]},
    ]
    r = await client.post("/v1/messages", json=_body(True, history), headers={"x-api-key": session.key})
    assert r.status_code == 200 and KEY not in r.text
    [turn] = session.sorted_turns()
    assert turn.completion_text.startswith("your key is ") and KEY not in turn.model_dump_json()


async def test_the_upstream_error_is_relayed_in_its_own_shape_without_the_key(native_env):
    proxy, upstream, server, client = native_env
    wrong = Endpoint(base_url=server.base_url, api_key="sk-ant-wrong-77aa", model="claude-x", wire_api="messages")
    session = proxy.open_session(wrong, CapturePolicy(capture=False))
    r = await client.post("/v1/messages", json=_body(False), headers={"x-api-key": session.key})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"  # Anthropic's own error shape
    assert "sk-ant-wrong-77aa" not in r.text  # the fake echoes the key it was given: masked
    [turn] = session.sorted_turns()
    assert turn.upstream_status == 401 and "sk-ant-wrong-77aa" not in (turn.upstream_error or "")


async def test_the_turn_limit_applies_and_count_tokens_passes_through_as_auxiliary(native_env):
    proxy, upstream, server, client = native_env
    session = proxy.open_session(_native(server.base_url), CapturePolicy(capture=False, max_turns=1))
    headers = {"x-api-key": session.key}
    assert (await client.post("/v1/messages", json=_body(False), headers=headers)).status_code == 200
    r = await client.post("/v1/messages/count_tokens", json={"model": "claude-x", "messages": [{"role": "user", "content": "go"}]}, headers=headers)
    assert r.status_code == 200 and r.json()["input_tokens"] > 0
    r = await client.post("/v1/messages", json=_body(False), headers=headers)
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error" and "turn limit of 1" in r.text
    assert len(upstream.requests) == 2 and session.turn_limit_hit
    assert [t.purpose for t in session.sorted_turns()] == ["policy", "auxiliary"]


async def test_a_call_in_another_dialect_is_refused_and_an_unreachable_upstream_is_502(native_env):
    proxy, upstream, server, client = native_env
    session = proxy.open_session(_native(server.base_url), CapturePolicy(capture=False))
    chat = {"model": "m", "messages": [{"role": "user", "content": "go"}]}
    r = await client.post("/v1/chat/completions", json=chat, headers={"authorization": f"Bearer {session.key}"})
    assert r.status_code == 400 and "speaks 'messages'" in r.text and upstream.requests == []
    gone = proxy.open_session(_native("http://127.0.0.1:9/v1"), CapturePolicy(capture=False))
    r = await client.post("/v1/messages", json=_body(False), headers={"x-api-key": gone.key})
    assert r.status_code == 502 and r.json()["type"] == "error" and "unreachable" in r.text
    assert gone.last_failure_infra and gone.sorted_turns()[0].upstream_status is None


# -- declared once -----------------------------------------------------------------------------------
def test_wire_api_is_declared_once_and_reaches_the_endpoint_from_every_surface():
    import argparse

    from harness_env import cli
    from harness_env.core.catalog import to_request
    from harness_env.models import RolloutArgs
    from harness_env.server.mcp.rollout import run_rollout_schema
    from harness_env.server.web.form import option_controls

    described = Endpoint.model_fields["wire_api"].description
    assert RolloutArgs.model_fields["wire_api"].description == described
    assert run_rollout_schema()["properties"]["wire_api"]["description"] == described
    assert next(c for c in option_controls() if c.name == "wire_api").info == described
    run = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    flag = next(a for a in run._actions if "--wire-api" in a.option_strings)
    assert described in flag.help and flag.choices == ["chat", "responses", "messages", "gemini"]
    args = RolloutArgs(instruction="hi", base_url="https://api.example", model="claude-x", wire_api="messages", harness="claude-code", mode="black_box")
    assert to_request(args, env={}).endpoint.wire_api == "messages"


@pytest.mark.parametrize(
    "dialect,answer",
    [
        (
            Responses,
            {
                "status": "completed",
                "usage": {"input_tokens": 3},
                "output": [
                    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
                    {"type": "message", "content": [{"type": "output_text", "text": "Let me"}]},
                    {"type": "function_call", "call_id": "t1", "name": "Bash", "arguments": '{"command": "ls"}'},
                ],
            },
        ),
        (
            Gemini,
            [
                {"candidates": [{"content": {"parts": [{"text": "think", "thought": True}, {"text": "Let me"}]}}]},
                {
                    "candidates": [{"content": {"parts": [{"functionCall": {"id": "t1", "name": "Bash", "args": {"command": "ls"}}}]}, "finishReason": "STOP"}],
                    "usageMetadata": {"promptTokenCount": 3},
                },
            ],
        ),
    ],
)
def test_whole_native_answers_of_the_other_dialects_are_read_into_the_turn(dialect, answer):
    draft = TurnDraft()
    NativeReader(dialect.native, draft).whole(json.dumps(answer).encode())
    fields = draft.fields()
    assert fields["completion_text"] == "Let me" and fields["reasoning_text"] == "think"
    assert fields["tool_calls"] == [{"id": "t1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}]
    assert fields["finish_reason"] in ("completed", "STOP") and fields["usage"]


async def test_a_redirect_is_not_followed_with_the_key(native_env):
    proxy, upstream, server, client = native_env
    elsewhere = FakeMessagesUpstream(key="other")
    with FakeMessagesServer(elsewhere) as other:
        upstream.scripts["claude-x"] = [{"redirect": other.base_url.removesuffix("/v1") + "/v1/messages"}]
        session = proxy.open_session(_native(server.base_url), CapturePolicy(capture=False))
        r = await client.post("/v1/messages", json=_body(False), headers={"x-api-key": session.key}, follow_redirects=False)
    assert r.status_code == 307 and elsewhere.requests == []  # the key went nowhere else
    assert session.sorted_turns()[0].upstream_status == 307


def test_the_upstream_is_asked_for_the_endpoints_model_whatever_the_harness_calls_it():

    raw = b'{"model":"harness-env/claude-x","max_tokens":5}'
    path, sent = with_model(Messages(), "/v1/messages", raw, json.loads(raw), "claude-x")
    assert path == "/v1/messages" and json.loads(sent) == {"model": "claude-x", "max_tokens": 5}
    same = b'{"model": "claude-x"}'
    assert with_model(Messages(), "/v1/messages", same, json.loads(same), "claude-x") == ("/v1/messages", same)  # untouched bytes
    path, sent = with_model(Gemini(), "/v1beta/models/org--gem:streamGenerateContent", b"{}", {}, "org/gem")
    assert path == "/v1beta/models/org/gem:streamGenerateContent" and sent == b"{}"


def test_an_eval_sent_to_a_server_keeps_the_wire_api():
    from harness_env.evals.run import to_args
    from harness_env.models import RolloutArgs

    request = _request("claude-code", "messages")
    assert RolloutArgs(**to_args(request)).wire_api == "messages"


# -- what pass-through bounds: the answer's length, one answer, nothing to fetch --------------------
# dialect -> (fake upstream, its server, the route, a good body, where its max-tokens field is)
NATIVE = {
    "messages": (
        FakeMessagesUpstream,
        FakeMessagesServer,
        "/v1/messages",
        {"model": "claude-x", "max_tokens": 512, "messages": [{"role": "user", "content": "go"}]},
        ("max_tokens",),
    ),
    "responses": (
        FakeResponsesUpstream,
        FakeResponsesServer,
        "/v1/responses",
        {"model": "claude-x", "max_output_tokens": 512, "input": [{"role": "user", "content": "go"}]},
        ("max_output_tokens",),
    ),
    "gemini": (
        FakeGeminiUpstream,
        FakeGeminiServer,
        "/v1beta/models/claude-x:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "go"}]}], "generationConfig": {"maxOutputTokens": 512, "candidateCount": 4}},
        ("generationConfig", "maxOutputTokens"),
    ),
}
AUTH = {"messages": "x-api-key", "responses": "authorization", "gemini": "x-goog-api-key"}
# dialect -> bodies naming something the upstream would fetch, or a file of the operator's account
REMOTE_NATIVE = {
    "messages": [
        {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x.example/a.png"}}]}]},
        {"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "url", "url": "http://10.0.0.1/"}}]}]},
        {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "file_01"}}]}]},
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {"type": "url", "url": "https://x.example/b"}}]}
                    ],
                }
            ]
        },
        {"mcp_servers": [{"type": "url", "url": "https://x.example/mcp", "name": "m"}]},
    ],
    "responses": [
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x.example/a.png"}]}]},
        {"input": [{"role": "user", "content": [{"type": "input_file", "file_url": "https://x.example/a.pdf"}]}]},
        {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-abc"}]}]},
        {"tools": [{"type": "mcp", "server_label": "x", "server_url": "https://x.example/mcp"}]},
    ],
    "gemini": [
        {"contents": [{"role": "user", "parts": [{"fileData": {"mimeType": "image/png", "fileUri": "gs://bucket/o"}}]}]},
        {"contents": [{"role": "user", "parts": [{"fileData": {"mimeType": "image/png", "fileUri": "https://x.example/o"}}]}]},
    ],
}


def _at(body: dict, path: tuple) -> object:
    for key in path:
        body = body[key]
    return body


@pytest.fixture(params=list(NATIVE))
async def any_native(request):
    dialect = request.param
    make, server_of, *_ = NATIVE[dialect]
    upstream = make(key=KEY)
    with server_of(upstream) as server:
        proxy = CaptureProxy()
        async with serve_on_loopback(proxy.app) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                yield dialect, proxy, upstream, server, client
        await proxy.aclose()


def _open(proxy: CaptureProxy, dialect: str, server, cap: int | None) -> tuple:
    session = proxy.open_session(_native(server.base_url, dialect), CapturePolicy(capture=False, max_tokens_cap=cap))
    value = f"Bearer {session.key}" if dialect == "responses" else session.key
    return session, {AUTH[dialect]: value}


async def test_pass_through_caps_the_answer_length_and_asks_for_one_answer(any_native):
    dialect, proxy, upstream, server, client = any_native
    _, _, route, good, field_at = NATIVE[dialect]
    _, headers = _open(proxy, dialect, server, cap=100)
    r = await client.post(route, json=good, headers=headers)
    assert r.status_code == 200, r.text
    no_field = json.loads(json.dumps(good))
    del _at(no_field, field_at[:-1])[field_at[-1]]
    assert (await client.post(route, json=no_field, headers=headers)).status_code == 200
    _, headers = _open(proxy, dialect, server, cap=None)
    huge = json.loads(json.dumps(good))
    _at(huge, field_at[:-1])[field_at[-1]] = 2**40
    assert (await client.post(route, json=huge, headers=headers)).status_code == 200
    assert [_at(b, field_at) for b in upstream.requests] == [100, 100, MAX_TOKENS_CEILING]
    if dialect == "gemini":
        assert [b["generationConfig"]["candidateCount"] for b in upstream.requests] == [1, 1, 1]
    for bad in ["512", True, 0, -1, 1.5]:
        body = json.loads(json.dumps(good))
        _at(body, field_at[:-1])[field_at[-1]] = bad
        r = await client.post(route, json=body, headers=headers)
        assert r.status_code == 400 and "must be a positive integer" in r.text, (bad, r.text)
    assert len(upstream.requests) == 3


async def test_pass_through_refuses_a_body_naming_anything_to_fetch(any_native):
    dialect, proxy, upstream, server, client = any_native
    _, _, route, good, _ = NATIVE[dialect]
    session, headers = _open(proxy, dialect, server, cap=None)
    for extra in REMOTE_NATIVE[dialect]:
        r = await client.post(route, json={**good, **extra}, headers=headers)
        assert r.status_code == 400 and "inline" in r.text and "x.example" not in r.text, (extra, r.text)
    assert upstream.requests == [] and session.sorted_turns() == []
    # a call in the history whose arguments hold a URL is the harness's own tool, not a fetch
    history = {
        "messages": {
            "messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "WebFetch", "input": {"url": "https://x.example/"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "page"}]},
            ]
        },
        "responses": {
            "input": [
                {"role": "user", "content": "go"},
                {"type": "function_call", "call_id": "c", "name": "fetch", "arguments": '{"url": "https://x.example/"}'},
                {"type": "function_call_output", "call_id": "c", "output": "page"},
            ]
        },
        "gemini": {
            "contents": [
                {"role": "user", "parts": [{"text": "go"}]},
                {"role": "model", "parts": [{"functionCall": {"name": "fetch", "args": {"url": "https://x.example/"}}}]},
                {"role": "user", "parts": [{"functionResponse": {"name": "fetch", "response": {"url": "https://x.example/"}}}]},
            ]
        },
    }
    r = await client.post(route, json={**good, **history[dialect]}, headers=headers)
    assert r.status_code == 200, r.text
