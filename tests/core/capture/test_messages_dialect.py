"""The Anthropic Messages dialect: requests translated to chat completions, the engine's chunks to
Messages events as they arrive, thinking round-tripped, replayed histories that extend, count_tokens
and probes, and errors in Anthropic's shape. Pure translation first, then through a real proxy
against the scripted fake policy."""

import json
import time

import pytest

from harness_env.core.capture.assemble import TurnDraft
from harness_env.core.capture.dialects.messages import Messages
from harness_env.core.capture.dialects.messages_request import BILLING_HEADER, thinking_signature
from harness_env.core.capture.dialects.sampled import SampledArguments
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.errors import InvalidRequestError
from tests.core.capture.dialect_streams import (
    CUT_BY_LENGTH,
    ENGINE_ERROR,
    HELLO_WITH_IDS,
    NAMELESS_CALL,
    NO_FINISH,
    NOT_JSON,
    as_javascript_sends,
    assert_exact_tokens_one_branch,
    assert_replay_extends,
    broken_stream,
    call_stream,
    chunk,
    named_events,
    replayed_call,
    slow_words,
    sse,
    translate,
    whole_chat,
)
from tests.core.capture.test_proxy import _endpoint, proxy_env  # noqa: F401 - the fixture messages_env builds on
from tests.fakes.policy import compact_arguments

DIALECT = Messages()
BASH = {
    "name": "Bash",
    "description": "run",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    "cache_control": {"type": "ephemeral"},
}
READ = {"name": "Read", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}}


def _request(path="/v1/messages", **body):
    body.setdefault("model", "claude-x")
    body.setdefault("max_tokens", 1000)
    return DIALECT.read_request(body, {"path": path})


_events = named_events


def _translate(request, raw: bytes, *, split: int = 7):
    """Feed the engine's SSE bytes in awkward pieces; return the events and the turn draft."""
    out, draft = translate(DIALECT, request, raw, split=split)
    return _events(out), draft


def _replayed(events: list[dict]) -> list[dict]:
    """The assistant content a client builds from the stream, as the Anthropic SDK does."""
    blocks: dict[int, dict] = {}
    for e in events:
        if e["type"] == "content_block_start":
            blocks[e["index"]] = dict(e["content_block"], _json="")
        elif e["type"] == "content_block_delta":
            b, d = blocks[e["index"]], e["delta"]
            if d["type"] == "text_delta":
                b["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                b["thinking"] += d["thinking"]
            elif d["type"] == "signature_delta":
                b["signature"] = d["signature"]
            elif d["type"] == "input_json_delta":
                b["_json"] += d["partial_json"]
    out = []
    for _, b in sorted(blocks.items()):
        raw = b.pop("_json")
        if b["type"] == "tool_use":
            b["input"] = json.loads(raw) if raw else {}
        out.append(b)
    return out


# -- requests -------------------------------------------------------------------------------------
def test_system_as_string_or_blocks_is_the_first_system_message_without_the_billing_block():
    blocks = [
        {"type": "text", "text": f"{BILLING_HEADER} cc_version=2.1; cc_entrypoint=sdk-cli;"},
        {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "\nBe brief."},
    ]
    req = _request(system=blocks, messages=[{"role": "user", "content": "hi"}])
    assert req.messages == [{"role": "system", "content": "You are an agent.\n\nBe brief."}, {"role": "user", "content": "hi"}]
    assert _request(system="Rules.", messages=[{"role": "user", "content": "hi"}]).messages[0] == {"role": "system", "content": "Rules."}
    assert _request(messages=[{"role": "user", "content": "hi"}]).messages == [{"role": "user", "content": "hi"}]
    assert req.purpose == "auxiliary" and _request(messages=[{"role": "user", "content": "x"}], tools=[BASH]).purpose == "policy"


def test_a_conversation_of_blocks_becomes_chat_messages_in_order():
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}}
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>x</system-reminder>"},
                {"type": "text", "text": "go", "cache_control": {"type": "ephemeral"}},
            ],
        },
        {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},  # Claude Code's mid-conversation system turn
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I should look.", "signature": "sig-anything"},
                {"type": "redacted_thinking", "data": "EncryptedByAnotherServer"},
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls", "description": "list ü"}},
                {"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt\n", "is_error": False},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "line"}, image]},
                {"type": "text", "text": "<system-reminder>y</system-reminder>"},
            ],
        },
        {"role": "assistant", "content": "Done."},
    ]
    req = _request(messages=messages, tools=[BASH, READ])
    assert req.messages == [
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"}, {"type": "text", "text": "go"}]},
        {"role": "system", "content": "# Environment"},
        {
            "role": "assistant",
            "content": "Looking.",
            "reasoning_content": "I should look.",
            "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls", "description": "list ü"}'}},
                {"id": "toolu_2", "type": "function", "function": {"name": "Read", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt\n"},
        {
            "role": "tool",
            "tool_call_id": "toolu_2",
            "content": [{"type": "text", "text": "line"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}}],
        },
        {"role": "user", "content": "<system-reminder>y</system-reminder>"},
        {"role": "assistant", "content": "Done."},
    ]


def test_tools_become_chat_functions_server_and_unloaded_deferred_tools_are_left_out():
    deferred = {"name": "WebFetch", "input_schema": {"type": "object"}, "defer_loading": True}
    tools = [
        BASH,
        READ,
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        {"type": "bash_20250124", "name": "bash"},
        deferred,
        {"type": "custom", "name": "Edit", "input_schema": {"type": "object"}, "strict": True},
    ]
    req = _request(messages=[{"role": "user", "content": "x"}], tools=tools)
    assert [t["function"]["name"] for t in req.tools] == ["Bash", "Read", "Edit"]
    assert req.tools[0] == {"type": "function", "function": {"name": "Bash", "description": "run", "parameters": BASH["input_schema"]}}
    assert req.tools[2]["function"]["strict"] is True
    # A tool_reference (Anthropic's tool search) loads the deferred tool.
    loaded = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ToolSearch", "input": {"query": "fetch"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "tool_reference", "tool_name": "WebFetch"}]}]},
    ]
    req = _request(messages=loaded, tools=tools)
    assert "WebFetch" in [t["function"]["name"] for t in req.tools] and req.messages[-1] == {
        "role": "tool",
        "tool_call_id": "t1",
        "content": "Tool WebFetch loaded.",
    }


def test_engine_body_carries_what_chat_completions_can_say():
    req = _request(
        messages=[{"role": "user", "content": "x"}],
        tools=[BASH],
        stream=True,
        max_tokens=32000,
        temperature=0.5,
        top_p=0.9,
        top_k=5,
        tool_choice={"type": "tool", "name": "Bash", "disable_parallel_tool_use": True},
        stop_sequences=["END"],
        thinking={"type": "adaptive"},
        metadata={"user_id": "u"},
        context_management={"edits": []},
        output_config={"effort": "high"},
    )
    assert DIALECT.engine_body(req) == {
        "model": "claude-x",
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": req.tools,
        "tool_choice": {"type": "function", "function": {"name": "Bash"}},
        "parallel_tool_calls": False,
        "max_tokens": 32000,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["END"],
    }
    for choice, chat in (({"type": "any"}, "required"), ({"type": "auto"}, "auto"), ({"type": "none"}, "none")):
        assert DIALECT.engine_body(_request(messages=[{"role": "user", "content": "x"}], tools=[BASH], tool_choice=choice))["tool_choice"] == chat
    plain = DIALECT.engine_body(_request(messages=[{"role": "user", "content": "x"}]))
    assert "tools" not in plain and "stream_options" not in plain


def test_count_tokens_asks_the_engine_for_one_token_as_an_auxiliary_call():
    req = _request("/v1/messages/count_tokens", messages=[{"role": "user", "content": "x"}], tools=[BASH], tool_choice={"type": "any"})
    assert req.count_only and req.purpose == "auxiliary" and not req.stream
    body = DIALECT.engine_body(req)
    assert body["max_tokens"] == 1 and body["tools"] == req.tools and "tool_choice" not in body and body["stream"] is False
    answer = json.dumps(
        {"choices": [{"index": 0, "message": {"content": "a"}, "finish_reason": "length"}], "usage": {"prompt_tokens": 321, "completion_tokens": 1}}
    )
    assert json.loads(DIALECT.answer(req, answer.encode(), "application/json", TurnDraft())[0]) == {"input_tokens": 321, "count_source": "engine"}
    ids_only = json.dumps({"choices": [], "prompt_token_ids": [1, 2, 3]}).encode()
    assert json.loads(DIALECT.answer(req, ids_only, "application/json", TurnDraft())[0])["input_tokens"] == 3
    estimate = json.loads(DIALECT.answer(req, b"{}", "application/json", TurnDraft())[0])
    assert estimate["count_source"] == "estimate" and estimate["input_tokens"] > 0


@pytest.mark.parametrize(
    "messages, says",
    [
        ("hi", "'messages' must be a list"),
        ([{"role": "wizard", "content": "x"}], "unknown role 'wizard'"),
        ([{"role": "user", "content": [{"type": "search_result", "source": "s"}]}], "blocks of type 'search_result' are not supported"),
        ([{"role": "assistant", "content": [{"type": "server_tool_use", "id": "s", "name": "web_search"}]}], "assistant blocks of type 'server_tool_use'"),
        ([{"role": "assistant", "content": [{"type": "tool_use", "name": "Bash", "input": {}}]}], "needs 'id' and 'name'"),
        ([{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}], "needs 'tool_use_id'"),
        ([{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}], "file ids need the Files API"),
        (
            [{"role": "user", "content": [{"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "x"}}]}],
            "source type 'base64'",
        ),
        ([{"role": "user", "content": 3}], "content must be a string or a list of blocks"),
    ],
)
def test_what_cannot_be_translated_is_refused_by_name(messages, says):
    with pytest.raises(InvalidRequestError, match=says):
        _request(messages=messages)


# -- answers: the engine's chunks become events as they come -------------------------------------------
def test_text_streams_as_text_deltas_and_ends_with_the_stop_reason_and_usage():
    req = _request(messages=[{"role": "user", "content": "hi"}], stream=True)
    events, draft = _translate(req, HELLO_WITH_IDS)
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0]["message"]
    assert start["id"].startswith("msg_") and start["role"] == "assistant" and start["model"] == "claude-x" and start["content"] == []
    assert start["usage"]["input_tokens"] == 3  # known from the engine's first chunk
    assert [e["delta"] for e in events if e["type"] == "content_block_delta"] == [{"type": "text_delta", "text": "Hel"}, {"type": "text_delta", "text": "lo"}]
    assert events[-2]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert events[-2]["usage"] == {"input_tokens": 2, "output_tokens": 2, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 1}
    assert _replayed(events) == [{"type": "text", "text": "Hello"}]
    # The turn is assembled from the engine's own ids, as for chat completions.
    assert draft.prompt_token_ids == [1, 2, 3] and draft.completion_token_ids == [7, 8] and draft.per_token_logps == [-0.5, -0.25]


def test_thinking_text_and_tool_calls_stream_as_their_blocks():
    req = _request(messages=[{"role": "user", "content": "hi"}], tools=[BASH, READ], stream=True)
    events, draft = _translate(
        req,
        sse(
            chunk({"role": "assistant", "reasoning_content": "I should"}),
            chunk({"reasoning_content": " look."}),
            chunk({"content": "Looking."}),
            chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "Bash", "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"command": '}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"ls"}'}}]}),
            chunk({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),  # its name comes later
            chunk({"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "Read"}}]}),
            chunk(finish="tool_calls"),
        ),
    )
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use", "tool_use"]
    assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1, 2, 3]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert deltas[:2] == [{"type": "thinking_delta", "thinking": "I should"}, {"type": "thinking_delta", "thinking": " look."}]
    assert deltas[2] == {"type": "signature_delta", "signature": thinking_signature("I should look.")}
    assert [d["partial_json"] for d in deltas if d["type"] == "input_json_delta"] == ['{"command": ', '"ls"}', "{}"]
    assert _replayed(events) == [
        {"type": "thinking", "thinking": "I should look.", "signature": thinking_signature("I should look.")},
        {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "call_a", "name": "Bash", "input": {"command": "ls"}},
        {"type": "tool_use", "id": "call_b", "name": "Read", "input": {}},
    ]
    assert events[-2]["delta"]["stop_reason"] == "tool_use" and events[-1]["type"] == "message_stop"
    assert draft.reasoning_parts == ["I should", " look."] and len(draft.tool_calls) == 2


def test_max_tokens_a_stop_sequence_and_broken_streams():
    req = _request(messages=[{"role": "user", "content": "hi"}], stream=True, stop_sequences=["END"])
    events, _ = _translate(req, CUT_BY_LENGTH)
    assert events[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    events, _ = _translate(req, sse(chunk({"content": "x"}), {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "END"}]}))
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    out, draft = broken_stream(DIALECT, req)
    events = _events(out)
    assert [e["type"] for e in events[-2:]] == ["content_block_stop", "error"]
    assert events[-1]["error"] == {"type": "api_error", "message": "upstream stream broke: ClientPayloadError: cut"}
    assert draft.errors and "malformed stream chunk" in draft.errors[0]
    events, _ = _translate(req, NO_FINISH)
    assert events[-1]["type"] == "error" and "without a finish reason" in events[-1]["error"]["message"]
    events, _ = _translate(req, ENGINE_ERROR)
    assert events[-1]["error"]["message"] == "engine overloaded"
    events, _ = _translate(req, NAMELESS_CALL)
    assert events[-1]["type"] == "error" and "without a name" in events[-1]["error"]["message"]


def test_a_whole_engine_answer_is_a_message_object_or_one_burst_of_events():
    chat = whole_chat("Bash", '{"command": "pwd"}', "hm", prompt_token_ids=[5, 6])
    req = _request(messages=[{"role": "user", "content": "hi"}], tools=[BASH])
    draft = TurnDraft()
    body, content_type = DIALECT.answer(req, chat, "application/json", draft)
    msg = json.loads(body)
    assert content_type == "application/json" and msg["type"] == "message" and msg["stop_reason"] == "tool_use" and msg["stop_sequence"] is None
    assert msg["content"] == [
        {"type": "thinking", "thinking": "hm", "signature": thinking_signature("hm")},
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "call_z", "name": "Bash", "input": {"command": "pwd"}},
    ]
    assert msg["usage"]["input_tokens"] == 9 and msg["usage"]["output_tokens"] == 4 and draft.prompt_token_ids == [5, 6]
    streamed, content_type = DIALECT.answer(
        _request(messages=[{"role": "user", "content": "hi"}], tools=[BASH], stream=True), chat, "application/json", TurnDraft()
    )
    events = _events(streamed)
    assert content_type == "text/event-stream" and events[-1]["type"] == "message_stop" and _replayed(events) == msg["content"]
    failed = json.loads(DIALECT.answer(req, NOT_JSON, "text/html", TurnDraft())[0])
    assert failed["type"] == "error" and "not a JSON object" in failed["error"]["message"]


def test_a_replayed_history_translates_to_the_previous_messages_plus_the_new_ones():
    """As Claude Code does: call 2's messages are call 1's plus the assistant content it built from
    the stream (thinking with its signature, text, tool_use with a parsed input) and the tool's
    result, with cache_control moved to the last block. The chat messages of call 2 extend call 1's,
    and the assistant message is what the engine produced (its text, reasoning and arguments)."""
    system = [{"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}]
    messages1 = [{"role": "user", "content": [{"type": "text", "text": "Do it.", "cache_control": {"type": "ephemeral"}}]}]
    req1 = _request(system=system, messages=messages1, tools=[BASH], stream=True)
    events, _ = _translate(req1, call_stream("Bash", '{"command": "ls ü"}'))
    messages2 = [
        {"role": "user", "content": [{"type": "text", "text": "Do it."}]},
        {"role": "assistant", "content": _replayed(events)},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "a\n", "cache_control": {"type": "ephemeral"}}]},
    ]
    req2 = _request(system=system, messages=messages2, tools=[BASH], stream=True)
    assert_replay_extends(req1, req2, replayed_call("Bash", '{"command": "ls ü"}'))


# What models write that json.dumps would write otherwise: compact, raw UTF-8, keys unsorted, numbers
# as spelled (issue 26, item 2: each re-serialised call split the rollout into one more branch).
SAMPLED = ['{"command":"ls"}', '{"file_path":"é.txt"}', '{"z":1,"a":[1.0,1e5],"b":true}']


@pytest.mark.parametrize("stream", [True, False])
def test_tool_inputs_claude_code_replays_reach_the_engine_as_it_wrote_them(stream):
    """The engine's argument texts come back byte for byte from the objects Claude Code was handed
    (as JavaScript sends them back: 1.0 is 1); an input it changed is written fresh, and another
    session's history is no business of this one's."""
    sampled = SampledArguments()
    body1 = {"model": "claude-x", "max_tokens": 100, "messages": [{"role": "user", "content": "Do it."}], "tools": [BASH, READ], "stream": stream}
    req1 = DIALECT.read_request(body1, {"path": "/v1/messages"}, sampled)
    calls = [{"index": i, "id": f"call_{i}", "function": {"name": "Read" if i else "Bash", "arguments": text}} for i, text in enumerate(SAMPLED)]
    if stream:
        content = _replayed(_translate(req1, sse(chunk({"tool_calls": calls}), chunk(finish="tool_calls")))[0])
    else:
        whole = {"choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": calls}, "finish_reason": "tool_calls"}]}
        content = json.loads(DIALECT.answer(req1, json.dumps(whole).encode(), "application/json", TurnDraft())[0])["content"]
    assert [c["input"] for c in content] == [json.loads(t) for t in SAMPLED]
    results = [{"type": "tool_result", "tool_use_id": f"call_{i}", "content": "ok"} for i in range(len(SAMPLED))]
    body2 = {**body1, "messages": [*body1["messages"], {"role": "assistant", "content": as_javascript_sends(content)}, {"role": "user", "content": results}]}

    def replayed(request) -> list[str]:
        return [c["function"]["arguments"] for c in request.messages[1]["tool_calls"]]

    assert replayed(DIALECT.read_request(body2, {"path": "/v1/messages"}, sampled)) == SAMPLED
    assert replayed(DIALECT.read_request(body2, {"path": "/v1/messages"}, SampledArguments())) == [
        '{"command": "ls"}',
        '{"file_path": "é.txt"}',
        '{"z": 1, "a": [1, 100000], "b": true}',
    ]
    body2["messages"][1]["content"][1]["input"]["file_path"] = "b.txt"
    assert replayed(DIALECT.read_request(body2, {"path": "/v1/messages"}, sampled)) == [SAMPLED[0], '{"file_path": "b.txt"}', SAMPLED[2]]


def test_errors_are_in_anthropics_shape():
    r = DIALECT.error(401, "unknown or expired capture key", "invalid_api_key")
    assert r.status == 401 and json.loads(r.body) == {"type": "error", "error": {"type": "authentication_error", "message": "unknown or expired capture key"}}
    limit = DIALECT.error(429, "the turn limit is reached", "turn_limit")
    assert json.loads(limit.body)["error"]["type"] == "rate_limit_error" and (b"x-should-retry", b"false") in limit.headers
    assert DIALECT.error(429, "slow", "rate").headers == []
    assert json.loads(DIALECT.error(502, "upstream unreachable", "upstream_error").body)["error"]["type"] == "api_error"
    assert json.loads(DIALECT.error(504, "upstream timeout", "upstream_error").body)["error"]["type"] == "timeout_error"
    vllm = DIALECT.upstream_error(400, b'{"object": "error", "message": "too long", "type": "BadRequestError", "code": 400}', "application/json")
    assert json.loads(vllm.body) == {"type": "error", "error": {"type": "invalid_request_error", "message": "too long"}}
    openai = DIALECT.upstream_error(429, b'{"error": {"message": "slow down", "type": "rate_limit", "code": "rate_limit_exceeded"}}', "application/json")
    assert json.loads(openai.body)["error"] == {"type": "rate_limit_error", "message": "slow down"}
    text = DIALECT.upstream_error(503, b"Service Unavailable", "text/plain")
    assert text.status == 503 and json.loads(text.body)["error"] == {"type": "api_error", "message": "Service Unavailable"}


# -- through the proxy, against the scripted fake policy ---------------------------------------------
@pytest.fixture
async def messages_env(proxy_env):  # noqa: F811 - an imported fixture
    """test_proxy's proxy and fake policy ({"bash": "echo hi"}, then "all done"), one session open."""
    proxy, policy, upstream, client = proxy_env
    client.base_url = str(client.base_url).removesuffix("/").removesuffix("/v1")  # Anthropic's clients add /v1 themselves
    yield policy, proxy.open_session(_endpoint(upstream), CapturePolicy(top_logprobs=2)), client


def _key(session):
    return {"x-api-key": session.key, "anthropic-version": "2023-06-01"}


SHELL = {"name": "bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


@pytest.mark.parametrize("compact", [False, True], ids=["dumps", "compact"])
@pytest.mark.parametrize("stream", [True, False])
async def test_a_claude_code_like_conversation_through_the_proxy_is_one_branch_of_exact_tokens(messages_env, stream, compact):
    policy, session, client = messages_env
    if compact:  # arguments json.dumps would write otherwise: the engine still gets its own back
        policy.dump_arguments = compact_arguments
    base = {"model": "claude-sonnet", "max_tokens": 4096, "system": [{"type": "text", "text": "Be brief."}], "tools": [SHELL], "stream": stream}
    messages1 = [{"role": "user", "content": [{"type": "text", "text": "List files."}]}]
    r = await client.post("/v1/messages?beta=true", json={**base, "messages": messages1}, headers=_key(session))
    assert r.status_code == 200
    content = _replayed(_events(r.content)) if stream else r.json()["content"]
    [call] = content
    assert call["type"] == "tool_use" and call["name"] == "bash" and call["input"] == {"command": "echo hi"}
    messages2 = [
        *messages1,
        {"role": "assistant", "content": content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "hi\n"}]},
    ]
    r = await client.post("/v1/messages?beta=true", json={**base, "messages": messages2}, headers={"authorization": f"Bearer {session.key}"})
    content = _replayed(_events(r.content)) if stream else r.json()["content"]
    assert content == [{"type": "text", "text": "all done"}]
    assert policy.sent[0].request["messages"][0] == {"role": "system", "content": "Be brief."}
    assert_exact_tokens_one_branch(policy, session, stream, "bash")


async def test_events_leave_the_proxy_while_the_engine_is_still_generating(messages_env):
    policy, session, client = messages_env
    step = slow_words("one", "two", "three")
    policy.scripts["m"] = [step]
    events = []
    body = {"model": "x", "max_tokens": 100, "messages": [{"role": "user", "content": "go"}], "tools": [SHELL], "stream": True}
    started = time.monotonic()
    async with client.stream("POST", "/v1/messages", json=body, headers=_key(session)) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if events[-1]["type"] == "content_block_delta":
                    step["raw"].word_seen()  # the engine's end is held until then
    assert [e["delta"]["text"] for e in events if e["type"] == "content_block_delta"] == ["one ", "two ", "three "]
    assert events[-1]["type"] == "message_stop"
    [turn] = session.turns
    assert turn.completion_text == "one two three " and started + turn.ttft_s < step["raw"].released_at  # timed at the first token, not the end


async def test_proxy_errors_speak_anthropics_shape(messages_env):
    policy, session, client = messages_env
    body = {"model": "x", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}], "tools": [SHELL], "stream": True}
    r = await client.post("/v1/messages", json=body, headers={"x-api-key": "nope"})
    assert r.status_code == 401 and r.json() == {"type": "error", "error": {"type": "authentication_error", "message": "unknown or expired capture key"}}
    r = await client.post("/v1/messages", json={**body, "messages": [{"role": "wizard", "content": "x"}]}, headers=_key(session))
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error" and "unknown role" in r.json()["error"]["message"]
    assert policy.requests == []
    policy.scripts["m"] = [{"status": 503}]
    r = await client.post("/v1/messages", json=body, headers=_key(session))
    assert r.status_code == 503 and r.json()["error"] == {"type": "api_error", "message": "scripted failure 503"}
    assert session.turns[-1].upstream_status == 503
    # A whole JSON answer to a streamed request still reaches the client as a stream.
    chat = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "whole"}, "finish_reason": "stop"}]}
    policy.scripts["m"] = [{"raw": json.dumps(chat)}]
    r = await client.post("/v1/messages", json=body, headers=_key(session))
    assert r.headers["content-type"] == "text/event-stream" and _replayed(_events(r.content)) == [{"type": "text", "text": "whole"}]


async def test_the_turn_limit_is_a_429_the_client_is_told_not_to_retry(proxy_env):  # noqa: F811 - an imported fixture
    proxy, policy, upstream, client = proxy_env
    session = proxy.open_session(_endpoint(upstream), CapturePolicy(max_turns=1))
    url = str(client.base_url).removesuffix("/").removesuffix("/v1") + "/v1/messages"
    body = {"model": "x", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}], "tools": [SHELL]}
    assert (await client.post(url, json=body, headers=_key(session))).status_code == 200
    limited = await client.post(url, json={**body, "max_tokens": 11}, headers=_key(session))  # a new call, not a retry of the first
    assert limited.status_code == 429 and limited.headers["x-should-retry"] == "false"
    assert limited.json()["error"]["type"] == "rate_limit_error" and "turn limit" in limited.json()["error"]["message"]


async def test_count_tokens_and_probes_through_the_proxy(messages_env):
    policy, session, client = messages_env
    body = {"model": "x", "messages": [{"role": "user", "content": "count me"}], "tools": [SHELL]}
    r = await client.post("/v1/messages/count_tokens?beta=true", json=body, headers=_key(session))
    assert r.status_code == 200 and r.json() == {"input_tokens": len(policy.sent[-1].prompt_token_ids), "count_source": "engine"}
    assert policy.requests[-1]["max_tokens"] == 1 and [t.purpose for t in session.turns] == ["auxiliary"]
    for method, path in (("HEAD", "/"), ("GET", "/"), ("HEAD", "/api/hello"), ("GET", "/api/hello"), ("HEAD", "/v1/messages")):
        r = await client.request(method, path, headers=_key(session))
        assert r.status_code == 200, (method, path)
    # Claude Code probes without its key: answered too (no model call, nothing but "the proxy is up").
    assert (await client.request("HEAD", "/api/hello")).status_code == 200
    assert (await client.post("/v1/messages", json=body)).status_code == 401  # a model call still needs the key
    assert len(session.turns) == 1  # probes are not model calls
