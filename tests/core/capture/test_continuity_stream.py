"""Token continuity, streamed (core/capture/continuity_stream.py), and answers cut at max_tokens
continued in tokens (core/capture/continuity.py), against the scripted scale-out engine
(tests/fakes/scale_out.py): the order of events a harness relies on (its first chunk before the
engine's last), and the turn recorded as the whole way records it. The real vLLM's side is in
test_continuity_vllm.py."""

import json
import threading

import httpx
import pytest

from harness_env.core.capture.graph import link_turns
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.capture.serve import serve_on_loopback
from harness_env.core.capture.sse import SSEDecoder
from harness_env.models import Endpoint
from tests.fakes.loopback import LoopbackServer
from tests.fakes.scale_out import ScaleOutPolicy

PARAMS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a shell command", "parameters": PARAMS}}]
MESSAGES_TOOLS = [{"name": "bash", "description": "run a shell command", "input_schema": PARAMS}]
LONG = "a streamed answer in many small pieces, long enough to stream"
RECORDED = ("prompt_token_ids", "completion_token_ids", "per_token_logps", "completion_tokens", "completion_text", "tool_calls", "finish_reason")


def recorded(turn) -> dict:
    return {k: getattr(turn, k) for k in RECORDED}


class Run:
    """A proxy session in front of a scale-out fake, and a client of it."""

    def __init__(self, policy: ScaleOutPolicy, **policy_options) -> None:
        self.policy, self.options = policy, policy_options

    async def __aenter__(self):
        self.upstream = LoopbackServer(self.policy.app()).__enter__()
        self.proxy = CaptureProxy()
        self.session = self.proxy.open_session(
            Endpoint(base_url=self.upstream.base_url, api_key="", model="m"), CapturePolicy(top_logprobs=2, continuity="tokens", **self.options)
        )
        self._serve = serve_on_loopback(self.proxy.app)
        url = await self._serve.__aenter__()
        self.client = httpx.AsyncClient(base_url=url, timeout=60, headers={"authorization": f"Bearer {self.session.key}", "x-api-key": self.session.key})
        return self

    async def __aexit__(self, *exc):
        await self.client.aclose()
        await self._serve.__aexit__(*exc)
        await self.proxy.aclose()
        self.upstream.__exit__(*exc)

    async def chat(self, messages, stream=False, on_first_content=None, **body) -> dict:
        """The assistant message the client got (assembled from the chunks when streamed)."""
        body = {"model": "m", "messages": messages, "tools": TOOLS, "stream": stream, **body}
        if not stream:
            r = await self.client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]
        text, calls, decoder = "", {}, SSEDecoder()
        async with self.client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            async for data in r.aiter_bytes():
                for payload in decoder.feed(data):
                    if payload == "[DONE]":
                        continue
                    for choice in json.loads(payload).get("choices") or ():
                        delta = choice["delta"]
                        if delta.get("content") and not text and on_first_content:
                            on_first_content()
                        text += delta.get("content") or ""
                        for call in delta.get("tool_calls") or ():
                            if not calls and on_first_content:
                                on_first_content()
                            slot = calls.setdefault(call["index"], {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                            slot["id"] = call.get("id") or slot["id"]
                            for k in ("name", "arguments"):
                                slot["function"][k] += (call.get("function") or {}).get(k) or ""
        return {"role": "assistant", "content": text or None, "tool_calls": [calls[i] for i in sorted(calls)] or None}

    async def anthropic(self, messages, stream=False, on_first_delta=None) -> list:
        """The Messages dialect: the content blocks (streamed: the events' types in order)."""
        body = {"model": "m", "max_tokens": 500, "messages": messages, "tools": MESSAGES_TOOLS, "stream": stream}
        if not stream:
            r = await self.client.post("/v1/messages", json=body)
            assert r.status_code == 200, r.text
            return r.json()["content"]
        types, decoder = [], SSEDecoder()
        async with self.client.stream("POST", "/v1/messages", json=body) as r:
            assert r.status_code == 200
            async for data in r.aiter_bytes():
                for payload in decoder.feed(data):
                    kind = json.loads(payload)["type"]
                    if kind == "content_block_delta" and "content_block_delta" not in types and on_first_delta:
                        on_first_delta()
                    types.append(kind)
        return types


def gated_policy(script) -> tuple[ScaleOutPolicy, callable]:
    """A fake whose streamed generate waits after its first chunk until the client saw one."""
    gate = threading.Event()
    policy = ScaleOutPolicy(scripts={"m": script}, gate=gate)

    def seen() -> None:
        policy.timeline.append("client: first chunk")
        gate.set()

    return policy, seen


def assert_streamed_in_order(timeline: list[str]) -> None:
    assert "engine: gate timed out" not in timeline, timeline  # the proxy held the first chunk back
    events = ("engine: first chunk sent", "client: first chunk", "engine: released", "engine: last chunk sent")
    assert all(e in timeline for e in events), timeline  # (no first chunk: the engine was not asked to stream)
    order = [timeline.index(e) for e in events]
    assert order == sorted(order), timeline


async def _chat_thread(policy: ScaleOutPolicy, stream: bool, on_first=None) -> tuple[list, list]:
    async with Run(policy) as run:
        messages = [{"role": "user", "content": "hello"}]
        first = await run.chat(messages)
        messages += [{"role": "assistant", "content": first.get("content"), "tool_calls": first.get("tool_calls")}]
        if first.get("tool_calls"):
            messages.append({"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "a.txt"})
        else:
            messages.append({"role": "user", "content": "and then?"})
        second = await run.chat(messages, stream=stream, on_first_content=on_first)
    return run.session.sorted_turns(), [first, second]


@pytest.mark.parametrize("answer", [{"text": LONG}, {"bash": "ls -la /tmp/somewhere"}], ids=["text", "tool_call"])
async def test_a_streamed_chat_call_continued_in_tokens_streams_and_records_what_the_whole_way_does(answer):
    policy, seen = gated_policy([{"text": "hi there"}, answer])
    turns, given = await _chat_thread(policy, stream=True, on_first=seen)
    assert_streamed_in_order(policy.timeline)
    assert policy.generated[-1]["stream"] is True and policy.derender_calls > 1  # derendered chunk by chunk
    whole_turns, whole_given = await _chat_thread(ScaleOutPolicy(scripts={"m": [{"text": "hi there"}, answer]}), stream=False)
    assert recorded(turns[1]) == recorded(whole_turns[1])
    assert turns[1].stream and turns[1].ttft_s is not None and turns[1].capture_level == "tokens"
    assert link_turns(turns).branches == 1
    got, want = given[1], whole_given[1]
    assert got["content"] == want["content"]
    assert [c["function"] for c in got["tool_calls"] or ()] == [c["function"] for c in want["tool_calls"] or ()]


async def _messages_thread(policy: ScaleOutPolicy, stream: bool, on_first=None) -> tuple[list, list]:
    async with Run(policy) as run:
        messages = [{"role": "user", "content": "hello"}]
        first = await run.anthropic(messages)
        messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "and then?"}]
        second = await run.anthropic(messages, stream=stream, on_first_delta=on_first)
    return run.session.sorted_turns(), second


async def test_a_translating_dialect_gets_its_events_as_the_engine_sends_them_when_continued_in_tokens():
    policy, seen = gated_policy([{"text": "hi there"}, {"text": LONG}])
    turns, events = await _messages_thread(policy, stream=True, on_first=seen)
    assert_streamed_in_order(policy.timeline)
    assert events[0] == "message_start" and events[-1] == "message_stop" and events.count("content_block_delta") > 1
    whole_turns, content = await _messages_thread(ScaleOutPolicy(scripts={"m": [{"text": "hi there"}, {"text": LONG}]}), stream=False)
    assert content[0]["text"] == LONG
    assert recorded(turns[1]) == recorded(whole_turns[1]) and turns[1].prompt_token_ids == whole_turns[1].prompt_token_ids


async def test_an_engine_whose_derender_cannot_stream_answers_whole_and_is_not_asked_again():
    policy = ScaleOutPolicy(scripts={"m": [{"text": "hi there"}, {"text": LONG}, {"text": "third"}]}, stream_derender=False)
    async with Run(policy) as run:
        messages = [{"role": "user", "content": "hello"}]
        for _ in range(3):
            msg = await run.chat(messages, stream=True)
            messages += [{"role": "assistant", "content": msg["content"]}, {"role": "user", "content": "more"}]
    turns = run.session.sorted_turns()
    assert [t.completion_text for t in turns] == ["hi there", LONG, "third"] and all(not t.upstream_error for t in turns)
    assert [b.get("stream") for b in policy.generated] == [True, False, False]  # refused once, then whole
    assert link_turns(turns).branches == 1
    assert "answered whole" in run.session.log_tail()


# -- an answer cut at max_tokens, continued ------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
async def test_an_answer_cut_at_max_tokens_that_the_harness_continues_stays_one_branch_in_tokens(stream):
    policy = ScaleOutPolicy(scripts={"m": [{"text": LONG}, {"text": "the rest"}]}, honor_max_tokens=True)
    async with Run(policy) as run:
        messages = [{"role": "user", "content": "hello"}]
        cut = await run.chat(messages, max_tokens=3)
        messages += [{"role": "assistant", "content": cut["content"]}, {"role": "user", "content": "Continue."}]
        await run.chat(messages, stream=stream)
    first, second = run.session.sorted_turns()
    assert first.finish_reason == "length" and cut["content"] == LONG[:12]
    assert "/inference/v1/generate" in policy.routes_hit  # continued in tokens, not by its messages
    n = len(first.prompt_token_ids) + len(first.completion_token_ids)
    assert second.prompt_token_ids[:n] == first.prompt_token_ids + first.completion_token_ids
    summary = link_turns(turns := [first, second])
    assert summary.branches == 1 and turns[1].link == "extends" and turns[1].parent == 0


async def test_a_cut_answer_the_harness_asks_to_continue_in_place_goes_on_from_its_sampled_ids():
    policy = ScaleOutPolicy(scripts={"m": [{"text": LONG}, {"text": " and on"}]}, honor_max_tokens=True)
    async with Run(policy) as run:
        messages = [{"role": "user", "content": "hello"}]
        cut = await run.chat(messages, max_tokens=3)
        messages.append({"role": "assistant", "content": cut["content"]})
        await run.chat(messages, continue_final_message=True, add_generation_prompt=False)
    first, second = run.session.sorted_turns()
    assert policy.generated[-1]["token_ids"] == first.prompt_token_ids + first.completion_token_ids
    assert second.prompt_token_ids == first.prompt_token_ids + first.completion_token_ids
    assert link_turns([first, second]).branches == 1


async def test_a_cut_answer_followed_by_nothing_new_and_no_ask_to_continue_goes_the_normal_way():
    policy = ScaleOutPolicy(scripts={"m": [{"text": LONG}, {"text": "x"}]}, honor_max_tokens=True)
    async with Run(policy) as run:
        messages = [{"role": "user", "content": "hello"}]
        cut = await run.chat(messages, max_tokens=3)
        await run.chat([*messages, {"role": "assistant", "content": cut["content"]}])
    assert "/inference/v1/generate" not in policy.routes_hit
