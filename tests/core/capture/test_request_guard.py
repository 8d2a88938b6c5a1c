"""Hostile request bodies at every model-call route of the capture proxy, over real HTTP: each is
one clear 400 in the route's own error shape, none reaches the engine, none is a 500, and the proxy
answers the next good request."""

import copy
import json
from typing import Any

import httpx
import pytest

from harness_env.core.capture import fastjson
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.capture.serve import serve_on_loopback
from harness_env.models import Endpoint
from tests.fakes.policy import FakePolicy, FakePolicyServer

# route -> (path, a good body whose model call the fake policy answers)
ROUTES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": (
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        },
    ),
    "responses": (
        "/v1/responses",
        {"model": "m", "input": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]},
    ),
    "messages": (
        "/v1/messages",
        {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "f", "input_schema": {"type": "object"}}]},
    ),
    "count_tokens": ("/v1/messages/count_tokens", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    "gemini": (
        "/v1beta/models/m:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": "OBJECT"}}]}]},
    ),
    "gemini_count": ("/v1beta/models/m:countTokens", {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
}
HOSTILE_VALUES: list[Any] = ["x", 1, -1, 1.5, True, None, [], {}, ["x"], [1], [None], [[]], [{}], {"a": "x"}, {"a": [1]}]


def _message(route: str, r: httpx.Response) -> str:
    """The error message, read the way the route's own clients read it."""
    err = r.json()["error"]
    assert isinstance(err, dict)
    if route in ("messages", "count_tokens"):
        assert r.json()["type"] == "error" and err["type"] == "invalid_request_error"
    if route.startswith("gemini"):
        assert err["code"] == 400 and err["status"] == "INVALID_ARGUMENT"
    return err["message"]


@pytest.fixture
async def proxy_client():
    policy = FakePolicy(scripts={"m": [{"text": "ok"}] * 1000})
    with FakePolicyServer(policy) as upstream:
        proxy = CaptureProxy()
        session = proxy.open_session(Endpoint(base_url=upstream.base_url, api_key="k", model="m"), CapturePolicy())
        async with serve_on_loopback(proxy.app) as url:
            headers = {"authorization": f"Bearer {session.key}", "content-type": "application/json"}
            async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as client:
                yield client, policy, session
        await proxy.aclose()


async def _still_answers(client: httpx.AsyncClient, route: str) -> None:
    path, good = ROUTES[route]
    r = await client.post(path, content=json.dumps(good))
    assert r.status_code == 200, r.text


def _paths(value: Any, at: tuple = ()) -> list[tuple]:
    """Every place in `value` (keys of objects, items of lists), the root excluded."""
    out = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, item in items:
        out.append((*at, key))
        out += _paths(item, (*at, key))
    return out


def _with(body: dict[str, Any], at: tuple, value: Any) -> dict[str, Any]:
    body = copy.deepcopy(body)
    target = body
    for key in at[:-1]:
        target = target[key]
    target[at[-1]] = value
    return body


@pytest.mark.parametrize("route", ROUTES)
async def test_a_lone_surrogate_anywhere_is_a_400_naming_it(proxy_client, route):
    client, policy, session = proxy_client
    path, good = ROUTES[route]
    bodies = [
        _with(good, ("model",), "\udfff"),
        {**good, "metadata": {"\ud800": 1}},  # in a key
        {**good, "seed": float("nan"), "metadata": "\udfff"},  # after what orjson refuses: found by the stdlib's fallback
        *(_with(good, at, "\udfff") for at in _paths(good) if isinstance(at[-1], str)),
    ]
    if "tools" in good:
        tool = json.loads(json.dumps(good["tools"][0]).replace('"f"', '"\\udfff"'))  # a tool named "\udfff"
        bodies.append({**good, "tools": [tool]})
    for body in bodies:
        r = await client.post(path, content=json.dumps(body))  # json.dumps writes the surrogate as its \\u escape
        assert r.status_code == 400, (body, r.text)
        assert "lone UTF-16 surrogate" in _message(route, r)
    assert policy.requests == [] and session.turns == []  # nothing went upstream, nothing recorded
    await _still_answers(client, route)


@pytest.mark.parametrize("route", ROUTES)
async def test_deep_nesting_and_non_objects_are_400s(proxy_client, route):
    client, policy, _ = proxy_client
    path, good = ROUTES[route]
    deep = "[" * 100_000 + "]" * 100_000
    for raw, says in [
        (json.dumps(good)[:-1] + ', "x": ' + deep + "}", "nested deeper than"),
        ('{"a": NaN, "x": ' + "[" * 3000 + "]" * 3000 + "}", "nested deeper than"),  # orjson refuses NaN: the stdlib's fallback
        (deep, "nested deeper than"),
        # under the parser's bound, over what a stored result can hold: it would fail the job's store write
        (json.dumps({**good, "metadata": json.loads("[" * 300 + "]" * 300)}), "levels a turn's record can hold"),
        ("[1]", "must be a JSON object"),
        ("{", "not JSON"),
        (b"\xff\xfe", "not JSON"),
    ]:
        r = await client.post(path, content=raw)
        assert r.status_code == 400, r.text
        assert says in _message(route, r)
    assert policy.requests == []
    await _still_answers(client, route)


@pytest.mark.parametrize("route", ROUTES)
async def test_a_wrong_type_at_any_field_is_a_4xx_never_a_5xx(proxy_client, route):
    """Every place of the good body, each hostile value: the proxy refuses it or serves it, and
    stays up; a refusal of a top-level field names the field."""
    client, _, _ = proxy_client
    path, good = ROUTES[route]
    for at in _paths(good) + [("stream",), ("max_tokens",), ("temperature",), ("chat_template_kwargs",), ("logprobs",)]:
        for value in HOSTILE_VALUES:
            r = await client.post(path, content=fastjson.dumps(_with(good, at, value)))
            assert r.status_code < 500, (at, value, r.text)
            if r.status_code >= 400:
                message = _message(route, r)
                assert r.status_code == 400 and message, (at, value, r.text)
    await _still_answers(client, route)


@pytest.mark.parametrize(
    ("route", "field", "value", "says"),
    [
        ("chat", "messages", "x", "field 'messages' must be a list, not a string"),
        ("chat", "messages", 1, "field 'messages' must be a list, not an integer"),
        ("chat", "messages", ["x"], "messages[0] must be an object, not a string"),
        ("chat", "tools", "x", "field 'tools' must be a list, not a string"),
        ("chat", "max_tokens", "x", "field 'max_tokens' must be an integer, not a string"),
        ("chat", "stream", "yes", "field 'stream' must be true or false, not a string"),
        ("responses", "tools", "x", "field 'tools' must be a list, not a string"),
        ("messages", "messages", "x", "field 'messages' must be a list, not a string"),
        ("gemini", "generationConfig", "x", "field 'generationConfig' must be an object, not a string"),
        ("gemini", "contents", {"a": 1}, "field 'contents' must be a list, not an object"),
    ],
)
async def test_the_400_says_which_field_is_wrong(proxy_client, route, field, value, says):
    client, policy, _ = proxy_client
    path, good = ROUTES[route]
    r = await client.post(path, content=json.dumps({**good, field: value}))
    assert r.status_code == 400 and says in _message(route, r), r.text
    assert policy.requests == []


def test_a_body_just_deep_enough_to_record_is_taken_and_one_level_more_is_refused():
    # The bound is the record's, to the level, whatever brackets the body's strings also hold.
    from harness_env.core.capture import request_guard
    from harness_env.core.errors import InvalidRequestError

    for padding in ("", "[{" * 300):
        depth = request_guard.MAX_RECORDED_DEPTH - 1  # with the body's own object: the deepest a record holds
        ok = ('{"s": "' + padding + '", "x": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}").encode()
        assert request_guard.parse_body(ok)["s"] == padding
        with pytest.raises(InvalidRequestError, match="deeper than"):
            request_guard.parse_body(('{"s": "' + padding + '", "x": ' + "[" * depth + "]" * depth + "}").encode())


def test_lenient_parsing_keeps_data_and_makes_it_valid():
    """An engine's answer with an escaped lone surrogate is kept, the surrogate made U+FFFD, so the
    turn it goes into serialises; a pair stays its character."""
    parsed = fastjson.loads(b'{"text": "a\\udfffb", "\\ud800": ["\\ud83d\\ude00", 1e400]}')
    assert parsed == {"text": "a\ufffdb", "\ufffd": ["\U0001f600", float("inf")]}
    json.dumps(parsed, ensure_ascii=False).encode()
    with pytest.raises(fastjson.JSONDepthError):  # a surrogate makes orjson give up early: the fallback is bounded too
        fastjson.loads('["\\udfff", ' + "[" * 100_000 + "]" * 100_000 + "]")


# -- content the engine would fetch ------------------------------------------------------------------
PNG = "iVBORw0KGgo="  # base64: what an inline image carries
REMOTE = ["https://attacker.example/x?d=secret", "http://169.254.169.254/latest/", "file:///etc/passwd", "gs://b/o", "ftp://h/f"]


def _remote_parts(route: str, url: str) -> list[dict[str, Any]]:
    """One user message per way the route's dialect can name `url` as content."""
    if route == "chat":
        return [
            {"role": "user", "content": [part]}
            for part in [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "image_url", "image_url": url},
                {"type": "video_url", "video_url": {"url": url}},
                {"type": "audio_url", "audio_url": {"url": url}},
                {"type": "input_audio", "input_audio": {"data": url, "format": "wav"}},
                {"type": "file", "file": {"file_data": url}},
                {"type": "file", "file": {"file_id": "file-abc"}},
                {"type": "input_image", "image_url": url},
                {"type": "image_embeds", "image_embeds": url},
            ]
        ] + [{"role": "tool", "tool_call_id": "c", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    if route == "responses":
        return [{"role": "user", "content": [{"type": "input_image", "image_url": url}]}]
    if route in ("messages", "count_tokens"):
        image = {"type": "image", "source": {"type": "url", "url": url}}
        return [{"role": "user", "content": [image]}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [image]}]}]
    return [{"role": "user", "parts": [{"fileData": {"mimeType": "image/png", "fileUri": url}}]}]


def _with_messages(route: str, good: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    key = {"chat": "messages", "responses": "input", "messages": "messages", "count_tokens": "messages"}.get(route, "contents")
    return {**good, key: messages}


@pytest.mark.parametrize("route", ROUTES)
async def test_content_naming_a_remote_url_is_a_400_and_never_reaches_the_engine(proxy_client, route):
    """vLLM (and any hosted API) fetches a media URL it is given: the agent could make the engine
    fetch anything, out of a sandbox whose network is cut. Every way a dialect names one is refused."""
    client, policy, session = proxy_client
    path, good = ROUTES[route]
    for url in REMOTE:
        for message in _remote_parts(route, url):
            r = await client.post(path, content=json.dumps(_with_messages(route, good, [message])))
            assert r.status_code == 400, (message, r.text)
            text = _message(route, r)
            assert "inline" in text and url not in text, text
    assert policy.requests == [] and session.turns == []
    await _still_answers(client, route)


INLINE_IMAGES: dict[str, dict[str, Any]] = {
    "chat": {"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]},
    "responses": {"role": "user", "content": [{"type": "input_text", "text": "see"}, {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"}]},
    "messages": {
        "role": "user",
        "content": [{"type": "text", "text": "see"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}],
    },
    "gemini": {"role": "user", "parts": [{"text": "see"}, {"inlineData": {"mimeType": "image/png", "data": PNG}}]},
}


@pytest.mark.parametrize("route", INLINE_IMAGES)
async def test_inline_media_reaches_the_engine_as_sent(proxy_client, route):
    client, policy, _ = proxy_client
    path, good = ROUTES[route]
    r = await client.post(path, content=json.dumps(_with_messages(route, good, [INLINE_IMAGES[route]])))
    assert r.status_code == 200, r.text
    [sent] = [m for m in policy.requests[-1]["messages"] if m["role"] == "user"]
    assert sent["content"] == [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]


async def test_a_content_part_reaches_the_engine_with_its_own_fields_only(proxy_client):
    """A text part that also carries a media field (which an engine may read by key) goes on as
    text alone; an inline image keeps only its url and detail."""
    client, policy, _ = proxy_client
    path, good = ROUTES["chat"]
    parts = [
        {"type": "text", "text": "see", "image_url": {"url": "https://x.example/"}, "video_url": "https://x.example/v"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}", "detail": "low", "uuid": "u"}, "audio_url": "https://x.example/"},
    ]
    r = await client.post(path, content=json.dumps({**good, "messages": [{"role": "user", "content": parts}]}))
    assert r.status_code == 200, r.text
    assert policy.requests[-1]["messages"][0]["content"] == [
        {"type": "text", "text": "see"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}", "detail": "low"}},
    ]
