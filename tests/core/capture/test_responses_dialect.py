"""The OpenAI Responses dialect: requests translated to chat completions, the engine's chunks to
Responses events as they arrive, replayed histories that extend, and errors in the Responses shape.
Pure translation first, then through a real proxy against the scripted fake policy."""

import json
import time

import pytest

from harness_env.core.capture.assemble import TurnDraft
from harness_env.core.capture.dialects.responses import Responses
from harness_env.core.capture.dialects.responses_request import REASONING_PREFIX, decode_reasoning, encode_reasoning
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.errors import InvalidRequestError
from tests.core.capture.dialect_streams import (
    CUT_BY_LENGTH,
    ENGINE_ERROR,
    HELLO_WITH_IDS,
    NAMELESS_CALL,
    NO_FINISH,
    NOT_JSON,
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
from tests.core.capture.test_proxy import _endpoint, proxy_env  # noqa: F401 - the fixture responses_env builds on

DIALECT = Responses()
EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "run",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
PATCH = {"type": "custom", "name": "apply_patch", "description": "patch", "format": {"type": "grammar", "syntax": "lark", "definition": "..."}}
AGENTS = {
    "type": "namespace",
    "name": "agents_v1",
    "description": "sub-agents",
    "tools": [{"type": "function", "name": "close_agent", "parameters": {"type": "object", "properties": {"target": {"type": "string"}}}}],
}


def _msg(role, text, kind="input_text"):
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def _request(**body):
    body.setdefault("model", "gpt-x")
    return DIALECT.read_request(body, {})


def _events(raw: bytes) -> list[dict]:
    """The events of a Responses stream, numbered in order."""
    out = named_events(raw)
    assert [e["sequence_number"] for e in out] == list(range(1, len(out) + 1))
    return out


def _translate(request, raw: bytes, *, split: int = 7):
    """Feed the engine's SSE bytes in awkward pieces; return the events and the turn draft."""
    out, draft = translate(DIALECT, request, raw, split=split)
    return _events(out), draft


# -- requests -------------------------------------------------------------------------------------
def test_instructions_and_leading_developer_messages_become_one_system_message():
    req = _request(
        instructions="Be brief.", input=[_msg("developer", "Rules."), _msg("user", "<env/>"), _msg("user", "Do it."), _msg("developer", "Later note.")]
    )
    assert req.messages == [
        {"role": "system", "content": "Be brief.\n\nRules."},
        {"role": "user", "content": "<env/>"},
        {"role": "user", "content": "Do it."},
        {"role": "system", "content": "Later note."},
    ]
    assert _request(input="hello").messages == [{"role": "user", "content": "hello"}]
    assert req.purpose == "auxiliary" and _request(input="x", tools=[EXEC]).purpose == "policy"


def test_a_turn_of_reasoning_text_and_calls_is_one_assistant_message_and_outputs_are_tool_messages():
    items = [
        _msg("user", "go"),
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": encode_reasoning("think")},
        _msg("assistant", "Running it.", "output_text"),
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd": "ls"}'},
        {"type": "function_call", "call_id": "c2", "name": "close_agent", "namespace": "agents_v1", "arguments": "{}"},
        {"type": "custom_tool_call", "call_id": "c3", "name": "apply_patch", "input": "*** Begin Patch\n*** End Patch"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt\n"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "closed"}]},
        {"type": "custom_tool_call_output", "call_id": "c3", "output": "applied"},
        _msg("assistant", "Done.", "output_text"),
        _msg("user", "thanks"),
    ]
    req = _request(input=items, tools=[EXEC, PATCH, AGENTS])
    assert req.messages[1] == {
        "role": "assistant",
        "content": "Running it.",
        "reasoning_content": "think",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "exec_command", "arguments": '{"cmd": "ls"}'}},
            {"id": "c2", "type": "function", "function": {"name": "agents_v1__close_agent", "arguments": "{}"}},
            {"id": "c3", "type": "function", "function": {"name": "apply_patch", "arguments": json.dumps({"input": "*** Begin Patch\n*** End Patch"})}},
        ],
    }
    assert req.messages[2:] == [
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt\n"},
        {"role": "tool", "tool_call_id": "c2", "content": "closed"},
        {"role": "tool", "tool_call_id": "c3", "content": "applied"},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "thanks"},
    ]


def test_tools_function_custom_and_namespaced_become_chat_functions_hosted_ones_are_left_out():
    req = _request(input="x", tools=[EXEC, PATCH, AGENTS, {"type": "web_search", "external_web_access": True}, {"type": "local_shell"}])
    assert [t["function"]["name"] for t in req.tools] == ["exec_command", "apply_patch", "agents_v1__close_agent"]
    assert req.tools[0]["function"]["parameters"] == EXEC["parameters"] and req.tools[0]["function"]["strict"] is False
    assert req.tools[1]["function"]["parameters"]["required"] == ["input"]
    assert req.tool_names["agents_v1__close_agent"].namespace == "agents_v1" and req.tool_names["apply_patch"].kind == "custom"


def test_engine_body_carries_what_chat_completions_can_say():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    req = _request(
        input=[_msg("user", "x")],
        tools=[EXEC, AGENTS],
        stream=True,
        tool_choice={"type": "function", "name": "close_agent", "namespace": "agents_v1"},
        parallel_tool_calls=False,
        max_output_tokens=77,
        temperature=0.5,
        top_p=0.9,
        store=False,
        include=["reasoning.encrypted_content"],
        reasoning={"effort": "high", "summary": "auto"},
        prompt_cache_key="k",
        text={"format": {"type": "json_schema", "name": "out", "schema": schema}},
    )
    body = DIALECT.engine_body(req)
    assert body == {
        "model": "gpt-x",
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": req.tools,
        "tool_choice": {"type": "function", "function": {"name": "agents_v1__close_agent"}},
        "parallel_tool_calls": False,
        "max_tokens": 77,
        "temperature": 0.5,
        "top_p": 0.9,
        "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}},
    }
    assert "tools" not in DIALECT.engine_body(_request(input="x")) and "stream_options" not in DIALECT.engine_body(_request(input="x"))


@pytest.mark.parametrize(
    "body, says",
    [
        ({"previous_response_id": "resp_1", "input": "x"}, "previous_response_id is not supported: this proxy stores no responses"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference needs stored responses"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input items of type 'web_search_call' are not supported"),
        ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "'input_file' is not supported"),
        ({"input": [{"type": "message", "role": "wizard", "content": "x"}]}, "unknown role 'wizard'"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "needs 'name' and 'call_id'"),
        ({"input": 3}, "'input' must be a string or a list"),
        ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": REASONING_PREFIX + "%%%"}]}, "damaged"),
    ],
)
def test_what_cannot_be_translated_is_refused_by_name(body, says):
    with pytest.raises(InvalidRequestError, match=says):
        _request(**body)


def test_reasoning_round_trips_through_our_encrypted_content_only():
    assert decode_reasoning({"encrypted_content": encode_reasoning("x ü\n")}) == "x ü\n"
    assert decode_reasoning({"encrypted_content": "gAAAAB-foreign", "summary": []}) == ""  # another server's: unreadable
    assert decode_reasoning({"content": [{"type": "reasoning_text", "text": "given back"}]}) == "given back"


# -- answers: the engine's chunks become events as they come -------------------------------------------
def test_text_streams_as_output_text_deltas_and_completes_with_usage():
    req = _request(input="hi", stream=True)
    events, draft = _translate(req, HELLO_WITH_IDS)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == ["Hel", "lo"]
    done = events[-1]["response"]
    assert done["status"] == "completed" and done["id"].startswith("resp_") and done["id"] == events[0]["response"]["id"]
    assert done["output"] == [
        {
            "type": "message",
            "id": events[2]["item"]["id"],
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hello", "annotations": []}],
        }
    ]
    assert done["usage"] == {
        "input_tokens": 3,
        "input_tokens_details": {"cached_tokens": 1},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 5,
    }
    # The turn is assembled from the engine's own ids, as for chat completions.
    assert draft.prompt_token_ids == [1, 2, 3] and draft.completion_token_ids == [7, 8] and draft.per_token_logps == [-0.5, -0.25]


def test_reasoning_then_tool_calls_stream_as_their_items():
    req = _request(input="hi", tools=[EXEC, PATCH, AGENTS], stream=True)
    events, draft = _translate(
        req,
        sse(
            chunk({"role": "assistant", "reasoning_content": "I should"}),
            chunk({"reasoning_content": " look."}),
            chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "exec_command", "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"cmd": '}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"ls"}'}}]}),
            chunk({"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "agents_v1__close_agent", "arguments": "{}"}}]}),
            chunk({"tool_calls": [{"index": 2, "id": "call_c", "function": {"name": "apply_patch", "arguments": '{"input": "*** Begin'}}]}),
            chunk({"tool_calls": [{"index": 2, "function": {"arguments": ' Patch"}'}}]}),
            chunk(finish="tool_calls"),
        ),
    )
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.reasoning_text.delta"]
    assert [e["delta"] for e in events if e["type"] == "response.reasoning_text.delta"] == ["I should", " look."]
    assert [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta" and e["output_index"] == 1] == ['{"cmd": ', '"ls"}']
    assert kinds[-1] == "response.completed"
    reasoning, call, namespaced, custom = events[-1]["response"]["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"] == [{"type": "reasoning_text", "text": "I should look."}]
    assert decode_reasoning({"encrypted_content": reasoning["encrypted_content"]}) == "I should look."
    assert {k: call[k] for k in ("type", "call_id", "name", "arguments", "status")} == {
        "type": "function_call",
        "call_id": "call_a",
        "name": "exec_command",
        "arguments": '{"cmd": "ls"}',
        "status": "completed",
    }
    assert (namespaced["name"], namespaced["namespace"], namespaced["arguments"]) == ("close_agent", "agents_v1", "{}")
    assert (custom["type"], custom["name"], custom["input"]) == ("custom_tool_call", "apply_patch", "*** Begin Patch")
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [0, 1, 2, 3]
    done_args = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [(e["name"], e["arguments"]) for e in done_args] == [("exec_command", '{"cmd": "ls"}'), ("close_agent", "{}")]
    assert draft.reasoning_parts == ["I should", " look."] and len(draft.tool_calls) == 3


def test_an_answer_cut_by_max_tokens_is_incomplete_and_a_broken_stream_failed():
    req = _request(input="hi", stream=True)
    events, _ = _translate(req, CUT_BY_LENGTH)
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    out, draft = broken_stream(DIALECT, req)
    events = _events(out)
    assert events[-2]["type"] == "response.output_item.done" and events[-2]["item"]["content"][0]["text"] == "par"
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"] == {"code": "server_error", "message": "upstream stream broke: ClientPayloadError: cut"}
    assert draft.errors and "malformed stream chunk" in draft.errors[0]
    events, _ = _translate(req, NO_FINISH)
    assert events[-1]["type"] == "response.failed" and "without a finish reason" in events[-1]["response"]["error"]["message"]
    events, _ = _translate(req, ENGINE_ERROR)
    assert events[-1]["type"] == "response.failed" and events[-1]["response"]["error"]["message"] == "engine overloaded"
    events, _ = _translate(req, NAMELESS_CALL)
    assert events[-1]["type"] == "response.failed" and "without a name" in events[-1]["response"]["error"]["message"]


def test_a_whole_engine_answer_is_a_response_object_or_one_burst_of_events():
    chat = whole_chat("exec_command", '{"cmd": "pwd"}', prompt_token_ids=[5, 6])
    req = _request(input="hi", tools=[EXEC])
    draft = TurnDraft()
    body, content_type = DIALECT.answer(req, chat, "application/json", draft)
    resp = json.loads(body)
    assert content_type == "application/json" and resp["object"] == "response" and resp["status"] == "completed"
    assert [(o["type"], o.get("name")) for o in resp["output"]] == [("message", None), ("function_call", "exec_command")]
    assert resp["output"][1]["arguments"] == '{"cmd": "pwd"}' and resp["usage"]["total_tokens"] == 13
    assert draft.prompt_token_ids == [5, 6]
    streamed, content_type = DIALECT.answer(_request(input="hi", tools=[EXEC], stream=True), chat, "application/json", TurnDraft())
    events = _events(streamed)
    assert content_type == "text/event-stream" and events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][1]["call_id"] == "call_z"
    failed = json.loads(DIALECT.answer(req, NOT_JSON, "text/html", TurnDraft())[0])
    assert failed["status"] == "failed" and "not a JSON object" in failed["error"]["message"]


def test_a_replayed_history_translates_to_the_previous_messages_plus_the_new_ones():
    """As Codex does: call 2's input is call 1's plus the output items (reasoning text dropped, only
    encrypted_content kept) and the tool's output. The chat messages of call 2 extend call 1's, and
    the assistant message is what the engine produced (its text, reasoning and exact arguments)."""
    input1 = [_msg("developer", "Rules."), _msg("user", "Do it.")]
    req1 = _request(input=input1, tools=[EXEC], stream=True, instructions="Be brief.")
    events, _ = _translate(req1, call_stream("exec_command", '{"cmd":  "ls" }'))
    replayed = []
    for item in events[-1]["response"]["output"]:
        item = {k: v for k, v in item.items() if not (item["type"] == "reasoning" and k == "content")}
        replayed.append(item)
    input2 = [*input1, *replayed, {"type": "function_call_output", "call_id": "call_1", "output": "a\n"}]
    req2 = _request(input=input2, tools=[EXEC], stream=True, instructions="Be brief.")
    assert_replay_extends(req1, req2, replayed_call("exec_command", '{"cmd":  "ls" }'))


def test_errors_are_in_the_responses_shape():
    r = DIALECT.error(401, "unknown or expired capture key", "invalid_api_key")
    assert r.status == 401 and json.loads(r.body) == {
        "error": {"message": "unknown or expired capture key", "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
    }
    vllm = DIALECT.upstream_error(400, b'{"object": "error", "message": "too long", "type": "BadRequestError", "param": null, "code": 400}', "application/json")
    assert json.loads(vllm.body) == {"error": {"message": "too long", "type": "BadRequestError", "param": None, "code": None}}
    openai = DIALECT.upstream_error(429, b'{"error": {"message": "slow down", "type": "rate_limit", "code": "rate_limit_exceeded"}}', "application/json")
    assert json.loads(openai.body)["error"]["code"] == "rate_limit_exceeded"
    text = DIALECT.upstream_error(502, b"Bad Gateway", "text/plain")
    assert text.status == 502 and json.loads(text.body)["error"] == {"message": "Bad Gateway", "type": "server_error", "param": None, "code": "upstream_error"}


# -- through the proxy, against the scripted fake policy ---------------------------------------------
@pytest.fixture
async def responses_env(proxy_env):  # noqa: F811 - an imported fixture
    """test_proxy's proxy and fake policy ({"bash": "echo hi"}, then "all done"), one session open."""
    proxy, policy, upstream, client = proxy_env
    yield policy, proxy.open_session(_endpoint(upstream), CapturePolicy(top_logprobs=2)), client


def _auth(session):
    return {"authorization": f"Bearer {session.key}"}


@pytest.mark.parametrize("stream", [True, False])
async def test_a_codex_like_conversation_through_the_proxy_is_one_branch_of_exact_tokens(responses_env, stream):
    policy, session, client = responses_env
    base = {"model": "gpt-5", "instructions": "Be brief.", "tools": [EXEC], "stream": stream, "store": False}
    input1 = [_msg("developer", "Rules."), _msg("user", "List files.")]
    r = await client.post("/responses", json={**base, "input": input1}, headers=_auth(session))
    assert r.status_code == 200
    output = _events(r.content)[-1]["response"]["output"] if stream else r.json()["output"]
    [call] = output
    assert call["type"] == "function_call" and call["name"] == "exec_command" and json.loads(call["arguments"]) == {"cmd": "echo hi"}
    input2 = [*input1, call, {"type": "function_call_output", "call_id": call["call_id"], "output": "hi\n"}]
    r = await client.post("/responses", json={**base, "input": input2}, headers=_auth(session))
    output = _events(r.content)[-1]["response"]["output"] if stream else r.json()["output"]
    assert [o["content"][0]["text"] for o in output] == ["all done"]
    assert policy.sent[0].request["messages"][0] == {"role": "system", "content": "Be brief.\n\nRules."}
    assert_exact_tokens_one_branch(policy, session, stream, "exec_command")


async def test_events_leave_the_proxy_while_the_engine_is_still_generating(responses_env):
    policy, session, client = responses_env
    step = slow_words("one", "two", "three")
    policy.scripts["m"] = [step]
    events = []
    body = {"model": "x", "input": "go", "tools": [EXEC], "stream": True}
    started = time.monotonic()
    async with client.stream("POST", "/responses", json=body, headers=_auth(session)) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if events[-1]["type"] == "response.output_text.delta":
                    step["raw"].word_seen()  # the engine's end is held until then
    assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == ["one ", "two ", "three "]
    assert events[-1]["type"] == "response.completed" and events[-1]["response"]["output"][0]["content"][0]["text"] == "one two three "
    [turn] = session.turns
    assert turn.completion_text == "one two three " and started + turn.ttft_s < step["raw"].released_at  # timed at the first token, not the end


async def test_proxy_errors_speak_the_responses_shape(responses_env):
    policy, session, client = responses_env
    r = await client.post("/responses", json={"input": "x"}, headers={"authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key" and r.json()["error"]["type"] == "invalid_request_error"
    r = await client.post("/responses", json={"input": "x", "previous_response_id": "resp_9"}, headers=_auth(session))
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    assert "previous_response_id is not supported" in r.json()["error"]["message"] and policy.requests == []
    policy.scripts["m"] = [{"status": 503}]
    r = await client.post("/responses", json={"input": "x", "tools": [EXEC], "stream": True}, headers=_auth(session))
    assert r.status_code == 503 and r.json()["error"]["message"] == "scripted failure 503" and r.json()["error"]["type"] == "server_error"
    assert session.turns[-1].upstream_status == 503
    # A whole JSON answer to a streamed request still reaches the client as a stream.
    chat = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "whole"}, "finish_reason": "stop"}]}
    policy.scripts["m"] = [{"raw": json.dumps(chat)}]
    r = await client.post("/responses", json={"input": "x", "tools": [EXEC], "stream": True}, headers=_auth(session))
    assert r.headers["content-type"] == "text/event-stream" and _events(r.content)[-1]["response"]["output"][0]["content"][0]["text"] == "whole"


async def test_a_request_without_tools_is_auxiliary(responses_env):
    policy, session, client = responses_env
    r = await client.post("/responses", json={"model": "x", "input": [_msg("user", "Summarise.")]}, headers=_auth(session))
    assert r.status_code == 200 and r.json()["output"][0]["content"][0]["text"] == "Fake title"
    assert [t.purpose for t in session.turns] == ["auxiliary"]
