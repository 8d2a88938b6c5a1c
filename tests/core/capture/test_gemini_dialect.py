"""The Gemini dialect: requests translated to chat completions, the engine's chunks to
GenerateContentResponse chunks as they arrive, reasoning carried in thought signatures, replayed
histories that extend, countTokens, and errors in Google's shape. Pure translation first, then
through a real proxy against the scripted fake policy."""

import json
import time

import pytest

from harness_env.core.capture.assemble import TurnDraft
from harness_env.core.capture.dialects.gemini import Gemini
from harness_env.core.capture.dialects.gemini_request import json_schema
from harness_env.core.capture.dialects.responses_request import decode_reasoning, encode_reasoning
from harness_env.core.capture.dialects.sampled import SampledArguments
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.errors import InvalidRequestError
from tests.core.capture.dialect_streams import (
    CUT_BY_LENGTH,
    NAMELESS_CALL,
    NO_FINISH,
    NOT_JSON,
    as_javascript_sends,
    assert_exact_tokens_one_branch,
    assert_replay_extends,
    chunk,
    replayed_call,
    slow_words,
    sse,
    translate,
    whole_chat,
)
from tests.core.capture.test_proxy import _endpoint, proxy_env  # noqa: F401 - the fixture gemini_env builds on
from tests.fakes.policy import compact_arguments

DIALECT = Gemini()
SHELL = {
    "name": "run_shell_command",
    "description": "run",
    "parametersJsonSchema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}
STREAM = "/v1beta/models/gemini-x:streamGenerateContent"


def _request(path=STREAM, query=b"alt=sse", **body):
    return DIALECT.read_request(body, {"path": path, "query_string": query})


def _user(*parts):
    return {"role": "user", "parts": list(parts)}


def _chunks(raw: bytes) -> list[dict]:
    """The GenerateContentResponse chunks of an SSE stream."""
    return [json.loads(block.removeprefix("data: ")) for block in raw.decode().split("\r\n\r\n") if block.strip()]


def _translate(request, raw: bytes, *, split: int = 7):
    out, draft = translate(DIALECT, request, raw, split=split)
    return _chunks(out), draft


def _parts(chunks: list[dict]) -> list[dict]:
    return [p for c in chunks if "candidates" in c for p in c["candidates"][0]["content"]["parts"]]


def _history(chunks: list[dict]) -> list[dict]:
    """The model content Gemini CLI keeps from a stream: thoughts dropped, text parts merged."""
    kept: list[dict] = []
    for p in _parts(chunks):
        if p.get("thought"):
            continue
        if kept and set(p) == {"text"} and set(kept[-1]) == {"text"}:
            kept[-1] = {"text": kept[-1]["text"] + p["text"]}
        elif p.get("text") != "" or "thoughtSignature" in p:
            kept.append(dict(p))
    return kept


# -- requests -------------------------------------------------------------------------------------
def test_contents_with_calls_and_responses_become_chat_messages_in_order():
    contents = [
        _user({"text": "<session_context/>"}, {"text": "Do it."}),
        {
            "role": "model",
            "parts": [
                {"text": "Running."},
                {
                    "functionCall": {"name": "run_shell_command", "args": {"command": "ls ü"}, "id": "run_shell_command__call_0"},
                    "thoughtSignature": encode_reasoning("plan"),
                },
                {"functionCall": {"name": "read_file", "args": {}}},
            ],
        },
        _user(
            {"functionResponse": {"name": "run_shell_command", "id": "run_shell_command__call_0", "response": {"output": "a.txt\n"}}},
            {"functionResponse": {"name": "read_file", "response": {"error": "no such file"}}},
            {"inlineData": {"mimeType": "image/png", "data": "iVBOR"}},
        ),
        {"role": "model", "parts": [{"text": "Done."}]},
    ]
    req = _request(
        systemInstruction={"parts": [{"text": "You are Gemini CLI."}, {"text": "Be brief."}]}, contents=contents, tools=[{"functionDeclarations": [SHELL]}]
    )
    assert req.messages == [
        {"role": "system", "content": "You are Gemini CLI.\nBe brief."},
        {"role": "user", "content": [{"type": "text", "text": "<session_context/>"}, {"type": "text", "text": "Do it."}]},
        {
            "role": "assistant",
            "content": "Running.",
            "reasoning_content": "plan",
            "tool_calls": [
                {"id": "call_0", "type": "function", "function": {"name": "run_shell_command", "arguments": '{"command": "ls ü"}'}},
                {"id": "read_file_1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": "a.txt\n"},
        {"role": "tool", "tool_call_id": "read_file_1", "content": '{"error": "no such file"}'},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}}]},
        {"role": "assistant", "content": "Done."},
    ]
    assert req.purpose == "policy" and req.stream and req.sse
    # Thought parts, when a client keeps them, are the reasoning; a foreign signature says nothing.
    thoughts = _request(contents=[{"role": "model", "parts": [{"text": "hm", "thought": True}, {"text": "ok", "thoughtSignature": "c2ln"}]}])
    assert thoughts.messages == [{"role": "assistant", "content": "ok", "reasoning_content": "hm"}]
    assert _request(contents=[_user({"text": "x"})]).purpose == "auxiliary"


def test_tools_from_json_schema_or_geminis_schema_google_tools_left_out():
    legacy = {
        "name": "read_file",
        "parameters": {"type": "OBJECT", "properties": {"path": {"type": "STRING"}, "lines": {"type": "ARRAY", "items": {"type": "INTEGER"}}}},
    }
    req = _request(contents=[_user({"text": "x"})], tools=[{"functionDeclarations": [SHELL, legacy]}, {"googleSearch": {}}, {"codeExecution": {}}])
    assert [t["function"]["name"] for t in req.tools] == ["run_shell_command", "read_file"]
    assert req.tools[0]["function"] == {"name": "run_shell_command", "description": "run", "parameters": SHELL["parametersJsonSchema"]}
    assert req.tools[1]["function"]["parameters"] == {
        "type": "object",
        "properties": {"path": {"type": "string"}, "lines": {"type": "array", "items": {"type": "integer"}}},
    }
    assert json_schema({"enum": ["STRING"], "type": "STRING"}) == {"enum": ["STRING"], "type": "string"}  # only types change


def test_engine_body_carries_what_chat_completions_can_say():
    config = {
        "temperature": 1,
        "topP": 0.95,
        "topK": 64,
        "maxOutputTokens": 500,
        "stopSequences": ["END"],
        "seed": 3,
        "thinkingConfig": {"includeThoughts": True},
    }
    req = _request(
        contents=[_user({"text": "x"})],
        tools=[{"functionDeclarations": [SHELL]}],
        generationConfig=config,
        toolConfig={"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["run_shell_command"]}},
    )
    assert DIALECT.engine_body(req) == {
        "model": None,
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": req.tools,
        "tool_choice": {"type": "function", "function": {"name": "run_shell_command"}},
        "max_tokens": 500,
        "temperature": 1,
        "top_p": 0.95,
        "stop": ["END"],
        "seed": 3,
    }
    schema = {"type": "object", "properties": {"next": {"type": "string"}}}
    whole = _request(
        "/v1beta/models/m:generateContent",
        b"",
        contents=[_user({"text": "x"})],
        generationConfig={"responseMimeType": "application/json", "responseJsonSchema": schema},
    )
    body = DIALECT.engine_body(whole)
    assert body["stream"] is False and body["response_format"] == {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    for mode, choice in (("AUTO", "auto"), ("NONE", "none"), ("ANY", "required")):
        req = _request(contents=[_user({"text": "x"})], tools=[{"functionDeclarations": [SHELL]}], toolConfig={"functionCallingConfig": {"mode": mode}})
        assert DIALECT.engine_body(req)["tool_choice"] == choice


@pytest.mark.parametrize(
    "body, says",
    [
        ({"contents": "hi"}, "'contents' must be a list"),
        ({"contents": [{"role": "wizard", "parts": [{"text": "x"}]}]}, "unknown role 'wizard'"),
        ({"contents": [{"role": "user", "parts": "x"}]}, "'parts' must be a list"),
        ({"contents": [_user({"inlineData": {"mimeType": "application/pdf", "data": "x"}})]}, "only images"),
        ({"contents": [_user({"executableCode": {"code": "print(1)"}})]}, "parts of kind executableCode are not supported"),
        ({"contents": [{"role": "model", "parts": [{"codeExecutionResult": {"output": "1"}}]}]}, "model parts of kind codeExecutionResult"),
        ({"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]}, "needs 'name'"),
    ],
)
def test_what_cannot_be_translated_is_refused_by_name(body, says):
    with pytest.raises(InvalidRequestError, match=says):
        _request(**body)


# -- answers --------------------------------------------------------------------------------------
def test_thoughts_and_text_stream_as_they_come_and_the_last_chunk_ends_the_answer():
    req = _request(contents=[_user({"text": "hi"})])
    chunks, draft = _translate(
        req,
        sse(
            chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1, 2, 3]),
            chunk({"reasoning_content": "hm"}),
            {"choices": [{"index": 0, "delta": {"content": "Hel"}, "token_ids": [7], "logprobs": {"content": [{"token": "Hel", "logprob": -0.5}]}}]},
            {"choices": [{"index": 0, "delta": {"content": "lo"}, "token_ids": [8], "logprobs": {"content": [{"token": "lo", "logprob": -0.25}]}}]},
            chunk(finish="stop"),
            {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6, "completion_tokens_details": {"reasoning_tokens": 1}}},
        ),
    )
    assert _parts(chunks) == [{"text": "hm", "thought": True}, {"text": "Hel"}, {"text": "lo"}, {"text": "", "thoughtSignature": encode_reasoning("hm")}]
    last = chunks[-1]
    assert last["candidates"][0]["finishReason"] == "STOP" and all("finishReason" not in c["candidates"][0] for c in chunks[:-1])
    assert last["usageMetadata"] == {"promptTokenCount": 3, "candidatesTokenCount": 3, "totalTokenCount": 6, "thoughtsTokenCount": 1}
    assert draft.prompt_token_ids == [1, 2, 3] and draft.completion_token_ids == [7, 8] and draft.per_token_logps == [-0.5, -0.25]


def test_a_function_call_goes_whole_with_the_reasoning_in_its_signature():
    req = _request(contents=[_user({"text": "hi"})], tools=[{"functionDeclarations": [SHELL]}])
    chunks, draft = _translate(
        req,
        sse(
            chunk({"reasoning_content": "I should look."}),
            chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "run_shell_command", "arguments": '{"command": '}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"ls"}'}}]}),
            chunk({"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "run_shell_command", "arguments": '{"command": "pwd"}'}}]}),
            chunk(finish="tool_calls"),
        ),
    )
    assert _parts(chunks)[1:] == [
        {"functionCall": {"name": "run_shell_command", "args": {"command": "ls"}, "id": "call_a"}, "thoughtSignature": encode_reasoning("I should look.")},
        {"functionCall": {"name": "run_shell_command", "args": {"command": "pwd"}, "id": "call_b"}},
    ]
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP" and chunks[-1]["candidates"][0]["content"]["parts"] == []
    assert len(draft.tool_calls) == 2


def test_max_tokens_broken_streams_and_a_json_array_stream():
    req = _request(contents=[_user({"text": "hi"})])
    chunks, _ = _translate(req, CUT_BY_LENGTH)
    assert chunks[-1]["candidates"][0]["finishReason"] == "MAX_TOKENS"
    chunks, _ = _translate(req, NO_FINISH)
    assert chunks[-1] == {"error": {"code": 500, "message": "the engine's stream ended without a finish reason", "status": "INTERNAL"}}
    chunks, _ = _translate(req, NAMELESS_CALL)
    assert "without a name" in chunks[-1]["error"]["message"]
    array = _request(query=b"", contents=[_user({"text": "hi"})])
    out, _ = translate(DIALECT, array, sse(chunk({"content": "a"}), chunk({"content": "b"}), chunk(finish="stop")))
    assert [p for c in json.loads(out) for p in c["candidates"][0]["content"]["parts"]] == [{"text": "a"}, {"text": "b"}]
    assert DIALECT.stream(array, TurnDraft()).content_type == "application/json"


def test_a_whole_engine_answer_is_one_response_and_count_tokens_asks_the_engine():
    chat = whole_chat("run_shell_command", '{"command": "pwd"}', "hm")
    req = _request("/v1beta/models/m:generateContent", b"", contents=[_user({"text": "hi"})], tools=[{"functionDeclarations": [SHELL]}])
    body, content_type = DIALECT.answer(req, chat, "application/json", TurnDraft())
    resp = json.loads(body)
    assert content_type == "application/json" and resp["candidates"][0]["finishReason"] == "STOP"
    assert resp["candidates"][0]["content"]["parts"] == [
        {"text": "hm", "thought": True},
        {"text": "Let me look."},
        {"functionCall": {"name": "run_shell_command", "args": {"command": "pwd"}, "id": "call_z"}, "thoughtSignature": encode_reasoning("hm")},
    ]
    assert resp["usageMetadata"]["totalTokenCount"] == 13
    failed = json.loads(DIALECT.answer(req, NOT_JSON, "text/html", TurnDraft())[0])
    assert failed["error"]["status"] == "INTERNAL" and "not a JSON object" in failed["error"]["message"]
    count = _request(
        "/v1beta/models/m:countTokens", b"", generateContentRequest={"contents": [_user({"text": "x"})], "tools": [{"functionDeclarations": [SHELL]}]}
    )
    assert count.count_only and count.purpose == "auxiliary" and DIALECT.engine_body(count)["max_tokens"] == 1
    answer = json.dumps({"choices": [], "usage": {"prompt_tokens": 77}}).encode()
    assert json.loads(DIALECT.answer(count, answer, "application/json", TurnDraft())[0]) == {"totalTokens": 77}


def test_a_replayed_history_translates_to_the_previous_messages_plus_the_new_ones():
    """As Gemini CLI does: call 2's contents are call 1's plus the model content it kept (thoughts
    dropped, text merged, the call's id prefixed with its name, its signature kept) and the
    function's response. The chat messages of call 2 extend call 1's, the reasoning included."""
    contents1 = [_user({"text": "<session_context/>"}, {"text": "Do it."})]
    system = {"parts": [{"text": "You are Gemini CLI."}]}
    req1 = _request(systemInstruction=system, contents=contents1, tools=[{"functionDeclarations": [SHELL]}])
    chunks, _ = _translate(
        req1,
        sse(
            chunk({"reasoning_content": "plan"}),
            chunk({"content": "On "}),
            chunk({"content": "it."}),
            chunk({"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "run_shell_command", "arguments": '{"command": "ls ü"}'}}]}),
            chunk(finish="tool_calls"),
        ),
    )
    kept = _history(chunks)
    kept[1]["functionCall"]["id"] = "run_shell_command__call_1"
    response = {"functionResponse": {"name": "run_shell_command", "id": "run_shell_command__call_1", "response": {"output": "a\n"}}}
    contents2 = [*contents1, {"role": "model", "parts": kept}, _user(response)]
    req2 = _request(systemInstruction=system, contents=contents2, tools=[{"functionDeclarations": [SHELL]}])
    assert_replay_extends(req1, req2, replayed_call("run_shell_command", '{"command": "ls ü"}'))
    assert decode_reasoning({"encrypted_content": kept[1]["thoughtSignature"]}) == "plan"


# What models write that json.dumps would write otherwise: compact, raw UTF-8, keys unsorted, numbers
# as spelled (issue 26, item 2: each re-serialised call split the rollout into one more branch).
SAMPLED = ['{"command":"ls"}', '{"command":"cat é.txt"}', '{"z":1,"a":[1.0,1e5],"command":"true"}']


@pytest.mark.parametrize("stream", [True, False])
def test_call_args_gemini_cli_replays_reach_the_engine_as_it_wrote_them(stream):
    """The engine's argument texts come back byte for byte from the args Gemini CLI was handed (as
    JavaScript sends them back, its ids prefixed with the tool's name); a call the engine gave no
    id goes out with one of ours and is found by it; args Gemini CLI changed are written fresh."""
    sampled = SampledArguments()
    path = STREAM if stream else "/v1beta/models/gemini-x:generateContent"
    body1 = {"contents": [_user({"text": "Do it."})], "tools": [{"functionDeclarations": [SHELL]}]}
    req1 = DIALECT.read_request(body1, {"path": path, "query_string": b"alt=sse"}, sampled)
    calls = [
        {"index": i, **({"id": f"call_{i}"} if i < 2 else {}), "function": {"name": "run_shell_command", "arguments": text}} for i, text in enumerate(SAMPLED)
    ]
    if stream:
        parts = _history(_translate(req1, sse(chunk({"tool_calls": calls}), chunk(finish="tool_calls")))[0])
    else:
        whole = {"choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": calls}, "finish_reason": "tool_calls"}]}
        parts = json.loads(DIALECT.answer(req1, json.dumps(whole).encode(), "application/json", TurnDraft())[0])["candidates"][0]["content"]["parts"]
    assert [p["functionCall"]["args"] for p in parts] == [json.loads(t) for t in SAMPLED]
    ids = [p["functionCall"]["id"] for p in parts]
    assert ids[:2] == ["call_0", "call_1"] and ids[2].startswith("call_")
    for p in parts:
        p["functionCall"]["id"] = "run_shell_command__" + p["functionCall"]["id"]
    responses = [{"functionResponse": {"name": "run_shell_command", "id": p["functionCall"]["id"], "response": {"output": "ok"}}} for p in parts]
    body2 = {**body1, "contents": [*body1["contents"], {"role": "model", "parts": as_javascript_sends(parts)}, _user(*responses)]}

    def replayed(request) -> list[str]:
        return [c["function"]["arguments"] for c in request.messages[1]["tool_calls"]]

    scope = {"path": path, "query_string": b"alt=sse"}
    assert replayed(DIALECT.read_request(body2, scope, sampled)) == SAMPLED
    assert replayed(DIALECT.read_request(body2, scope, SampledArguments())) == [
        '{"command": "ls"}',
        '{"command": "cat é.txt"}',
        '{"z": 1, "a": [1, 100000], "command": "true"}',
    ]
    body2["contents"][1]["parts"][2]["functionCall"]["args"]["command"] = "false"
    assert replayed(DIALECT.read_request(body2, scope, sampled)) == [*SAMPLED[:2], '{"z": 1, "a": [1, 100000], "command": "false"}']


def test_errors_are_in_googles_shape():
    r = DIALECT.error(401, "unknown or expired capture key", "invalid_api_key")
    assert r.status == 401 and json.loads(r.body) == {"error": {"code": 401, "message": "unknown or expired capture key", "status": "UNAUTHENTICATED"}}
    limit = json.loads(DIALECT.error(429, "the turn limit is reached", "turn_limit").body)["error"]
    assert limit["status"] == "RESOURCE_EXHAUSTED" and limit["details"][0]["retryDelay"] == "86400s"
    vllm = DIALECT.upstream_error(400, b'{"object": "error", "message": "too long", "type": "BadRequestError", "code": 400}', "application/json")
    assert json.loads(vllm.body) == {"error": {"code": 400, "message": "too long", "status": "INVALID_ARGUMENT"}}
    assert json.loads(DIALECT.upstream_error(503, b"Service Unavailable", "text/plain").body)["error"]["status"] == "UNAVAILABLE"


# -- through the proxy, against the scripted fake policy ---------------------------------------------
@pytest.fixture
async def gemini_env(proxy_env):  # noqa: F811 - an imported fixture
    """test_proxy's proxy and fake policy ({"bash": "echo hi"}, then "all done"), one session open."""
    proxy, policy, upstream, client = proxy_env
    client.base_url = str(client.base_url).removesuffix("/").removesuffix("/v1")  # Gemini's clients add /v1beta themselves
    yield policy, proxy.open_session(_endpoint(upstream), CapturePolicy(top_logprobs=2)), client


BASH = {"name": "bash", "parametersJsonSchema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


@pytest.mark.parametrize("compact", [False, True], ids=["dumps", "compact"])
@pytest.mark.parametrize("stream", [True, False])
async def test_a_gemini_cli_like_conversation_through_the_proxy_is_one_branch_of_exact_tokens(gemini_env, stream, compact):
    policy, session, client = gemini_env
    if compact:  # arguments json.dumps would write otherwise: the engine still gets its own back
        policy.dump_arguments = compact_arguments
    path = "/v1beta/models/gemini-x:" + ("streamGenerateContent?alt=sse" if stream else "generateContent")
    base = {"systemInstruction": {"parts": [{"text": "Be brief."}]}, "tools": [{"functionDeclarations": [BASH]}]}
    contents1 = [_user({"text": "List files."})]
    r = await client.post(path, json={**base, "contents": contents1}, headers={"x-goog-api-key": session.key})
    assert r.status_code == 200
    parts = _history(_chunks(r.content)) if stream else r.json()["candidates"][0]["content"]["parts"]
    [call] = parts
    assert call["functionCall"]["name"] == "bash" and call["functionCall"]["args"] == {"command": "echo hi"}
    response = {"functionResponse": {"name": "bash", "id": call["functionCall"]["id"], "response": {"output": "hi\n"}}}
    contents2 = [*contents1, {"role": "model", "parts": parts}, _user(response)]
    r = await client.post(path + ("&" if stream else "?") + f"key={session.key}", json={**base, "contents": contents2})
    parts = _history(_chunks(r.content)) if stream else r.json()["candidates"][0]["content"]["parts"]
    assert parts == [{"text": "all done"}]
    assert policy.sent[0].request["messages"][0] == {"role": "system", "content": "Be brief."}
    assert_exact_tokens_one_branch(policy, session, stream, "bash")


async def test_chunks_leave_the_proxy_while_the_engine_is_still_generating(gemini_env):
    policy, session, client = gemini_env
    step = slow_words("one", "two", "three")
    policy.scripts["m"] = [step]
    chunks = []
    body = {"contents": [_user({"text": "go"})], "tools": [{"functionDeclarations": [BASH]}]}
    started = time.monotonic()
    async with client.stream("POST", STREAM + "?alt=sse", json=body, headers={"x-goog-api-key": session.key}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                chunks.append(json.loads(line[6:]))
                if any("text" in p for p in chunks[-1]["candidates"][0]["content"]["parts"]):
                    step["raw"].word_seen()  # the engine's end is held until then
    assert [p["text"] for c in chunks for p in c["candidates"][0]["content"]["parts"]] == ["one ", "two ", "three "]
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    [turn] = session.turns
    assert turn.completion_text == "one two three " and started + turn.ttft_s < step["raw"].released_at  # timed at the first token, not the end


async def test_proxy_errors_and_the_turn_limit_speak_googles_shape(proxy_env):  # noqa: F811 - an imported fixture
    proxy, policy, upstream, client = proxy_env
    root = str(client.base_url).removesuffix("/").removesuffix("/v1")
    session = proxy.open_session(_endpoint(upstream), CapturePolicy(max_turns=1))
    body = {"contents": [_user({"text": "x"})], "tools": [{"functionDeclarations": [BASH]}]}
    url = root + "/v1beta/models/gemini-x:generateContent"
    r = await client.post(url, json=body, headers={"x-goog-api-key": "nope"})
    assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED"
    r = await client.post(url, json={"contents": [{"role": "wizard", "parts": [{"text": "x"}]}]}, headers={"x-goog-api-key": session.key})
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT" and policy.requests == []
    assert (await client.post(url, json=body, headers={"x-goog-api-key": session.key})).status_code == 200
    again = {**body, "contents": [_user({"text": "y"})]}  # not a retry of the first: a new call
    limited = await client.post(url, json=again, headers={"x-goog-api-key": session.key})
    assert limited.status_code == 429 and limited.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
    count = await client.post(root + "/v1beta/models/gemini-x:countTokens", json={"contents": [_user({"text": "x"})]}, headers={"x-goog-api-key": session.key})
    assert count.status_code == 200 and count.json()["totalTokens"] > 0  # auxiliary: past the turn limit
