"""Token continuity (core/capture/continuity.py): a call that continues a thread is sent to the
engine as the earlier prompt + sampled ids + the new messages' ids, so the thread stays one branch
whatever the chat template re-renders. Shown against the real vLLM (SmolLM2's tool template
re-renders a tool call), with the scripted fake only for what vLLM will not do on demand."""

import json

import httpx
import pytest

from harness_env import RolloutRequest, Task, run_rollout
from harness_env.core.capture.continuity import as_chunks, continued_turn, cut_trailer, engine_weight_version, generate_body, spliced_ids
from harness_env.core.capture.graph import link_turns
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.capture.serve import serve_on_loopback
from harness_env.core.capture.sse import SSEDecoder
from harness_env.models import Endpoint
from tests.fakes.policy import FakePolicy, FakePolicyServer, render_prompt

PARAMS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a shell command", "parameters": PARAMS}}]
# SmolLM2's hermes format, with the arguments written as the template would not write them again
# (no space after the colons): the template's rendering of the call differs from what was sampled.
CALL_REGEX = r'<tool_call>\n\{"name":"bash","arguments":\{"command":"ls"\}\}\n</tool_call>'


async def _conversation(endpoint: Endpoint, continuity: str, stream: bool) -> tuple[CaptureProxy, list, list]:
    """Two calls of one thread: a tool call, then (its answer as the proxy returned it, and the
    tool's result) a second call. The proxy's session turns, and what the harness was given."""
    proxy = CaptureProxy()
    session = proxy.open_session(
        endpoint, CapturePolicy(top_logprobs=1, temperature=0.0, continuity=continuity, structured_regex=CALL_REGEX, structured_calls=1)
    )
    given = []
    async with serve_on_loopback(proxy.app) as url, httpx.AsyncClient(base_url=url + "/v1", timeout=300) as client:
        headers = {"authorization": f"Bearer {session.key}"}
        messages = [{"role": "system", "content": "You run shell commands."}, {"role": "user", "content": "List the files."}]
        for _ in range(2):
            body = {"model": "m", "messages": messages, "tools": TOOLS, "max_tokens": 80, "stream": stream}
            r = await client.post("/chat/completions", json=body, headers=headers)
            assert r.status_code == 200, r.text
            message = _streamed_message(r.content) if stream else r.json()["choices"][0]["message"]
            given.append(message)
            messages = [
                *messages,
                {"role": "assistant", "content": message.get("content"), "tool_calls": message.get("tool_calls")},
                {"role": "tool", "tool_call_id": (message.get("tool_calls") or [{}])[0].get("id"), "content": "a.txt\nb.txt"},
            ]
    await proxy.aclose()
    return proxy, session.sorted_turns(), given


def _streamed_message(content: bytes) -> dict:
    """The assistant message a client assembles from chat-completion chunks."""
    text, calls = "", {}
    events = SSEDecoder().feed(content)
    assert events[-1] == "[DONE]"
    for event in events[:-1]:
        for choice in json.loads(event)["choices"]:
            delta = choice["delta"]
            text += delta.get("content") or ""
            for call in delta.get("tool_calls") or ():
                slot = calls.setdefault(call["index"], {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                slot["id"] = call.get("id") or slot["id"]
                for k in ("name", "arguments"):
                    slot["function"][k] += (call.get("function") or {}).get(k) or ""
    return {"role": "assistant", "content": text or None, "tool_calls": [calls[i] for i in sorted(calls)] or None}


@pytest.mark.parametrize("stream", [False, True])
async def test_with_the_real_vllm_a_tool_calling_thread_is_one_branch_only_with_token_continuity(vllm_server, stream):
    endpoint = Endpoint(base_url=vllm_server.base_url, api_key="", model=vllm_server.model)

    proxy, turns, given = await _conversation(endpoint, "messages", stream)
    first, second = turns
    assert json.loads(given[0]["tool_calls"][0]["function"]["arguments"]) == {"command": "ls"}
    # The template re-renders the tool call: the next prompt does not extend prompt + completion.
    assert not second.continues(first)
    assert link_turns(turns).branches == 2 and second.link == "template_rerender"

    proxy, turns, given = await _conversation(endpoint, "tokens", stream)
    first, second = turns
    assert second.prompt_token_ids[: len(first.prompt_token_ids) + len(first.completion_token_ids)] == (first.prompt_token_ids + first.completion_token_ids)
    assert second.continues(first) and second.capture_level == "tokens" and second.stream is stream
    summary = link_turns(turns)
    assert summary.branches == 1 and second.link == "extends" and second.parent == first.index
    assert second.completion_token_ids and len(second.per_token_logps) == len(second.completion_token_ids)
    assert given[1] is not None  # the harness got the second answer in the shape it asked for


def test_spliced_ids_put_the_templates_trailer_after_the_sampled_end_and_refuse_a_rewritten_prefix():
    prompt, completion = [1, 5, 6, 9], [7, 7, 2]  # 2: the end-of-turn token the model sampled
    before = [1, 5, 6, 9, 8, 8, 2, 198]  # the template's rendering of the answer (8 8), then its trailer
    full = [*before, 1, 4, 2, 198, 1, 3]  # + a tool message + the generation prompt
    assert spliced_ids(prompt, completion, before, full) == [1, 5, 6, 9, 7, 7, 2, 198, 1, 4, 2, 198, 1, 3]
    assert spliced_ids(prompt, completion, before, [1, 5, 6, 0, 8, 8, 2, 198, 1, 4]) is None  # earlier turns rendered otherwise
    assert spliced_ids(prompt, [7, 7, 3], before, full) is None  # no end-of-turn where the answer ends
    # Cut at max_tokens (no end-of-turn sampled): the template's end of an answer goes after the cut ids.
    trailer = cut_trailer([1, 5, 6, 9], [1, 5, 6, 9, 2, 198])  # the prompt opening an answer, and it closing an empty one
    assert trailer == [2, 198]
    assert spliced_ids(prompt, [7, 7], before, full, trailer) == [1, 5, 6, 9, 7, 7, 2, 198, 1, 4, 2, 198, 1, 3]
    assert spliced_ids(prompt, [7, 7], before, full, [3, 198]) is None  # `before` does not end so
    assert cut_trailer([1, 5, 6, 9], [1, 5, 0, 9, 2, 198]) is None  # the template opens an answer otherwise


def test_max_tokens_is_sized_for_the_spliced_prompt_and_the_engines_weight_version_kept_when_it_is_a_number():
    rendered = {"token_ids": [1, 2], "sampling_params": {"max_tokens": 98, "temperature": 0.5}}  # sized for its own 2 ids
    assert generate_body(rendered, [1] * 60, 80, 100)["sampling_params"] == {"max_tokens": 40, "temperature": 0.5}
    assert generate_body(rendered, [1] * 60, 10, 100)["sampling_params"]["max_tokens"] == 10
    assert "max_tokens" not in generate_body(rendered, [1] * 60, None, 100)["sampling_params"]  # the engine's: what is left
    assert generate_body(rendered, [1] * 100, 10, 100) is None  # no room: the normal way (and its error)

    def versions(*names):
        return {"choices": [{"weight_versions": [{"version": v, "start": 0, "end": 4} for v in names]}]}

    assert engine_weight_version(versions("7")) == 7 and engine_weight_version(versions(7)) == 7
    assert engine_weight_version(versions("default")) is None and engine_weight_version(versions("7", "8")) is None


def test_a_thread_is_continued_only_from_its_own_messages_answer_and_tools():
    class Turn:  # what continued_turn reads of a recorded turn
        def __init__(self, messages, answer, tools=TOOLS):
            self.request_messages, self.request_tools, self.completion_text, self.tool_calls = messages, tools, answer, []
            self.upstream_status, self.upstream_error, self.prompt, self.completion, self.finish_reason = 200, None, object(), [1, 2], "stop"

    user = {"role": "user", "content": "hi"}
    earlier = Turn([user], "hello")
    follow = [user, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    assert continued_turn(follow, TOOLS, [earlier]) is earlier
    assert continued_turn([user, {"role": "assistant", "content": "bye"}, follow[2]], TOOLS, [earlier]) is None  # another answer
    assert continued_turn(follow, [], [earlier]) is None  # other tools: another system prompt
    assert continued_turn(follow[:2], TOOLS, [earlier]) is None  # nothing new to send
    assert continued_turn(follow[:2], TOOLS, [earlier], continues_final=True) is None  # an ended answer is not gone on with
    earlier.finish_reason = "length"  # cut at max_tokens: continued too (the template's end of turn after the cut ids)
    assert continued_turn(follow, TOOLS, [earlier]) is earlier
    assert continued_turn(follow[:2], TOOLS, [earlier]) is None  # the same message, but not asked to go on with it
    assert continued_turn(follow[:2], TOOLS, [earlier], continues_final=True) is earlier
    earlier.finish_reason = "abort"  # no answer the engine finished
    assert continued_turn(follow, TOOLS, [earlier]) is None


def test_a_whole_answer_streams_as_chunks_a_client_reassembles():
    answer = {
        "id": "x",
        "created": 1,
        "model": "m",
        "prompt_token_ids": [1, 2],
        "usage": {"completion_tokens": 3},
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "token_ids": [5, 6, 2],
                "logprobs": None,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}],
                },
            }
        ],
    }
    assert _streamed_message(as_chunks(answer))["tool_calls"] == answer["choices"][0]["message"]["tool_calls"]


async def _fake_thread(policy: FakePolicy, continuity: str = "tokens") -> tuple[object, list, list[str]]:
    """Two calls of one thread through the proxy to the fake: the session, its turns, and the
    scale-out routes the second call asked."""
    policy.scripts["m"] = [{"bash": "ls"}, {"text": "done"}]
    with FakePolicyServer(policy) as upstream:
        proxy = CaptureProxy()
        session = proxy.open_session(Endpoint(base_url=upstream.base_url, api_key="", model="m"), CapturePolicy(continuity=continuity))
        async with serve_on_loopback(proxy.app) as url, httpx.AsyncClient(base_url=url + "/v1", timeout=30) as client:
            headers = {"authorization": f"Bearer {session.key}"}
            messages = [{"role": "user", "content": "list"}]
            r = await client.post("/chat/completions", json={"model": "m", "messages": messages, "tools": TOOLS}, headers=headers)
            message = r.json()["choices"][0]["message"]
            messages += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "a.txt"}]
            asked = len(policy.routes_hit)
            r = await client.post("/chat/completions", json={"model": "m", "messages": messages, "tools": TOOLS}, headers=headers)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "done"  # the harness is answered either way
        await proxy.aclose()
    return session, session.sorted_turns(), policy.routes_hit[asked:]


async def test_a_template_that_rewrites_earlier_turns_sends_the_messages_as_they_are():
    session, turns, asked = await _fake_thread(FakePolicy(scale_out=True, render_rewrites_history=True))
    assert asked == ["render", "render"]  # the prefix check failed: nothing generated from token ids
    assert session.continuity == "tokens" and turns[1].prompt_token_ids == render_prompt({"tools": TOOLS, "messages": turns[1].request_messages})
    assert "renders the earlier turns otherwise" in session.log_tail()


async def test_an_engine_error_on_generate_sends_the_messages_as_they_are():
    session, turns, asked = await _fake_thread(FakePolicy(scale_out=True))
    assert asked == ["render", "render", "/inference/v1/generate"]
    assert [t.upstream_status for t in turns] == [200, 200] and turns[1].capture_level == "tokens"


async def test_an_engine_without_the_render_route_continues_in_messages():
    session, turns, asked = await _fake_thread(FakePolicy())
    assert asked == [] and session.continuity == "messages" and len(turns) == 2


async def test_the_result_says_which_continuity_a_rollout_used():
    script = [{"bash": "touch a"}, {"text": "done"}]
    for scale_out, option, used in [(True, "tokens", "tokens"), (True, "messages", "messages"), (False, "tokens", "messages")]:
        with FakePolicyServer(FakePolicy(scripts={"m": script}, scale_out=scale_out)) as upstream:
            req = RolloutRequest(
                task=Task(instruction="x", verify=["test -f a"]),
                harness="whitebox",
                continuity=option,
                endpoint=Endpoint(base_url=upstream.base_url, model="m"),
            )
            res = await run_rollout(req)
        assert res.reward == 1.0 and res.continuity == used, (scale_out, option, res.error)
