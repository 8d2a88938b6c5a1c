"""The CPU stand-in for vLLM (tests/cpu_policy/, the CPU training example's policy server) answers
like vLLM: template-exact prompt ids, sampled ids whose logprobs are the model's processed logprobs
(checked by teacher forcing), the same answer streamed or not, Hermes tool calls parsed. Streams are
assembled with the capture proxy's own assembler. (The token contract against a real vLLM is
tests/envs/test_vllm_contract.py.)"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from harness_env.core.capture.assemble import TurnDraft
from harness_env.core.capture.sse import SSEDecoder
from tests.cpu_policy import CHAT_TEMPLATE, MODEL_NAME, Answer, ChatCompletionsApp, ChatModel, load_smollm2, parse_tool_calls
from tests.fakes.loopback import LoopbackServer

pytestmark = pytest.mark.real_model

TOL = 1e-3
MESSAGES = [{"role": "user", "content": "Name three colours."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]
TOOL_TEXT = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'


# torch threads. 1 by default: on this 2-core machine, while other tests or harness processes
# run, 2 OpenMP threads spin against each other and decode 3-5x slower than 1 (measured 2.4 vs
# 11 tokens/s at load average 3.5); override with HARNESS_ENV_TEST_MODEL_THREADS.
NUM_THREADS = int(os.environ.get("HARNESS_ENV_TEST_MODEL_THREADS") or 1)
RealModel = ChatModel


class RealModelServer(LoopbackServer):
    """The stand-in's ChatCompletionsApp on a loopback port, from a background thread."""

    def __init__(self, model: ChatModel, *, max_tokens_cap: int = 64, force: Callable[[dict[str, Any]], str | None] | None = None) -> None:
        self.policy = ChatCompletionsApp(model, MODEL_NAME, max_tokens_cap, 0, force)
        super().__init__(self.policy.app(), join_timeout_s=30)  # a generation in progress finishes first

    @property
    def answers(self) -> list[Answer]:
        return self.policy.answers


@pytest.fixture(scope="module")
def model() -> RealModel:
    started = time.monotonic()
    m = load_smollm2(threads=NUM_THREADS, prefix_cache_entries=0)  # no prefix cache: every answer computed whole
    print(f"\nmodel ready in {time.monotonic() - started:.1f}s (load {m.load_seconds:.1f}s from {m.loaded_from})")
    return m


@pytest.fixture
def server(model: RealModel) -> Iterator[RealModelServer]:
    with RealModelServer(model, max_tokens_cap=24) as srv:
        yield srv


def post(srv: RealModelServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(srv.base_url + "/chat/completions", json={"model": MODEL_NAME, **body}, timeout=120)


def stream(srv: RealModelServer, body: dict[str, Any]) -> tuple[list[dict[str, Any]], TurnDraft]:
    """The chunks of a streamed answer, and the capture proxy's assembly of them."""
    decoder, draft, chunks = SSEDecoder(), TurnDraft(), []
    with httpx.stream("POST", srv.base_url + "/chat/completions", json={"model": MODEL_NAME, **body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for raw in r.iter_bytes():
            for data in decoder.feed(raw):
                draft.add_chunk_text(data)
                if data != "[DONE]":
                    chunks.append(json.loads(data))
    for data in decoder.flush():
        draft.add_chunk_text(data)
    assert not draft.errors
    return chunks, draft


def max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


# -- the model -----------------------------------------------------------------------------------
def test_chat_template_is_the_ggufs_chatml_extended_with_tools(model: RealModel) -> None:
    assert model.gguf_chat_template and "<|im_start|>" in model.gguf_chat_template
    tok = model.tokenizer
    for messages in (
        MESSAGES,
        [{"role": "system", "content": "Be brief."}, *MESSAGES, {"role": "assistant", "content": "Red."}, {"role": "user", "content": "More?"}],
    ):
        ours = tok.apply_chat_template(messages, chat_template=CHAT_TEMPLATE, add_generation_prompt=True, tokenize=False)
        theirs = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert ours == theirs
    text, ids = model.render(
        [
            *MESSAGES,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls -la"}'}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        ],
        TOOLS,
    )
    assert '<tools>\n{"type": "function", "function": {"name": "bash"' in text
    assert (
        "<|im_start|>assistant\n" + TOOL_TEXT + "<|im_end|>\n<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ) in text
    assert ids == tok.encode(text, add_special_tokens=False)
    assert ids[-4:] == tok.encode("<|im_start|>assistant\n", add_special_tokens=False)


@pytest.mark.parametrize(("temperature", "seed"), [(1.0, 1), (1.0, 2), (0.7, 3), (0.7, 4), (0.0, 5)])
def test_sampled_logprobs_are_the_processed_logprobs(model: RealModel, temperature: float, seed: int) -> None:
    _, prompt = model.render(MESSAGES)
    gen = model.generate(prompt, 32, temperature, top_logprobs=3, seed=seed)
    forced = model.teacher_forced_logprobs(prompt, gen.completion_ids, temperature)
    diff = max_diff(gen.logprobs, forced)
    print(
        f"\nT={temperature} seed={seed}: {len(gen.completion_ids)} tokens in {gen.seconds:.2f}s "
        f"({len(gen.completion_ids) / gen.seconds:.1f} tok/s, prompt {len(prompt)}), max |diff| {diff:.2e}, finish {gen.finish_reason}"
    )
    assert diff < TOL
    assert gen.completion_ids and all(len(t) == 3 for t in gen.top_logprobs)
    for lp, tops in zip(gen.logprobs, gen.top_logprobs):
        assert tops[0][1] >= lp - 1e-6 and tops[0][1] >= tops[1][1] >= tops[2][1]
    if gen.finish_reason == "stop":
        assert gen.completion_ids[-1] == model.tokenizer.eos_token_id
    else:
        assert len(gen.completion_ids) == 32
    if temperature == 0.0:
        assert all(lp == tops[0][1] for lp, tops in zip(gen.logprobs, gen.top_logprobs))  # greedy
    again = model.generate(prompt, 32, temperature, seed=seed)
    assert again.completion_ids == gen.completion_ids  # a seed fixes the sample


def test_logprobs_are_post_temperature(model: RealModel) -> None:
    _, prompt = model.render(MESSAGES)
    gen = model.generate(prompt, 4, 1.0, seed=0)
    hot = model.teacher_forced_logprobs(prompt, gen.completion_ids, 1.0)
    cold = model.teacher_forced_logprobs(prompt, gen.completion_ids, 0.5)
    assert max_diff(hot, cold) > 1e-2


# -- the server ----------------------------------------------------------------------------------
def test_non_stream_answer_is_vllm_shaped_and_exact(server: RealModelServer, model: RealModel) -> None:
    r = post(server, {"messages": MESSAGES, "max_tokens": 16, "temperature": 0.7, "seed": 11, "logprobs": True, "top_logprobs": 2, "return_token_ids": True})
    assert r.status_code == 200, r.text
    body = r.json()
    choice = body["choices"][0]
    _, expected_prompt = model.render(MESSAGES)
    text = model.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)  # the GGUF's own template
    assert body["prompt_token_ids"] == expected_prompt == model.tokenizer.encode(text, add_special_tokens=False)
    ids = choice["token_ids"]
    entries = choice["logprobs"]["content"]
    assert len(entries) == len(ids) and body["usage"] == {
        "prompt_tokens": len(expected_prompt),
        "completion_tokens": len(ids),
        "total_tokens": len(expected_prompt) + len(ids),
    }
    assert all(set(e) == {"token", "logprob", "bytes", "top_logprobs"} and len(e["top_logprobs"]) == 2 for e in entries)
    assert [e["token"] for e in entries] == [model.token_text(i) for i in ids]
    lps = [e["logprob"] for e in entries]
    assert max_diff(lps, model.teacher_forced_logprobs(expected_prompt, ids, 0.7)) < TOL
    assert choice["finish_reason"] in ("stop", "length")
    if choice["finish_reason"] == "stop":
        assert ids[-1] == model.tokenizer.eos_token_id and entries[-1]["token"] == "<|im_end|>"
    assert choice["message"]["content"] == model.text_of(ids) and "<|im_end|>" not in choice["message"]["content"]
    assert choice["message"]["tool_calls"] == []
    [answer] = server.answers
    assert (answer.prompt_token_ids, answer.completion_token_ids, answer.logprobs, answer.temperature, answer.seed) == (expected_prompt, ids, lps, 0.7, 11)
    # the capture proxy's assembler reads it whole
    draft = TurnDraft()
    draft.add_response(body)
    assert draft.capture_level() == "tokens" and draft.final_completion_ids() == ids and draft.per_token_logps == lps


def test_stream_gives_the_same_answer_one_token_per_chunk(server: RealModelServer) -> None:
    req = {"messages": MESSAGES, "max_tokens": 20, "temperature": 1.0, "seed": 7, "logprobs": True, "top_logprobs": 1, "return_token_ids": True}
    whole = post(server, req).json()
    chunks, draft = stream(server, {**req, "stream_options": {"include_usage": True}})
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"] and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    token_chunks = chunks[1:-1]
    assert all(len(c["choices"][0]["token_ids"]) == 1 and len(c["choices"][0]["logprobs"]["content"]) == 1 for c in token_chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert token_chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert draft.prompt_token_ids == whole["prompt_token_ids"]
    assert draft.final_completion_ids() == whole["choices"][0]["token_ids"]
    assert draft.per_token_logps == [e["logprob"] for e in whole["choices"][0]["logprobs"]["content"]]
    assert "".join(draft.text_parts) == whole["choices"][0]["message"]["content"]
    assert draft.finish_reason == whole["choices"][0]["finish_reason"]
    assert [a.stream for a in server.answers] == [False, True]
    assert server.answers[0].completion_token_ids == server.answers[1].completion_token_ids


def test_without_extras_the_answer_has_no_ids_or_logprobs(server: RealModelServer) -> None:
    body = post(server, {"messages": MESSAGES, "max_tokens": 4}).json()
    assert "prompt_token_ids" not in body and "token_ids" not in body["choices"][0] and body["choices"][0]["logprobs"] is None
    body = post(server, {"messages": MESSAGES, "max_tokens": 3, "logprobs": True, "return_tokens_as_token_ids": True, "return_token_ids": True}).json()
    assert [e["token"] for e in body["choices"][0]["logprobs"]["content"]] == [f"token_id:{i}" for i in body["choices"][0]["token_ids"]]


def test_max_tokens_is_capped(server: RealModelServer) -> None:
    body = post(
        server,
        {
            "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
            "max_completion_tokens": 500,
            "temperature": 0,
            "return_token_ids": True,
        },
    ).json()
    assert len(body["choices"][0]["token_ids"]) <= 24
    if len(body["choices"][0]["token_ids"]) == 24:
        assert body["choices"][0]["finish_reason"] == "length"


def test_models_and_refusals(server: RealModelServer) -> None:
    models = httpx.get(server.base_url + "/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL_NAME]
    assert post(server, {"messages": MESSAGES, "n": 2}).status_code == 400
    r = httpx.post(server.base_url + "/chat/completions", json={"model": "gpt-4", "messages": MESSAGES})
    assert r.status_code == 404 and "does not exist" in r.json()["error"]["message"]
    bad = [{"role": "assistant", "content": None, "tool_calls": [{"id": "x", "type": "function", "function": {"name": "bash", "arguments": "{not json"}}]}]
    assert post(server, {"messages": bad, "tools": TOOLS}).status_code == 400


def test_parse_tool_calls_like_vllms_hermes_parser() -> None:
    content, calls = parse_tool_calls('Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>')
    assert content == "Let me look.\n" and [(c["type"], c["function"]) for c in calls] == [("function", {"name": "bash", "arguments": '{"command": "ls"}'})]
    assert parse_tool_calls("<tool_call>{broken</tool_call>") == ("<tool_call>{broken</tool_call>", [])
    assert parse_tool_calls("no call") == ("no call", [])


@pytest.mark.parametrize("streamed", [False, True])
def test_a_tool_call_answer_and_the_next_prompt_extends_it(model: RealModel, streamed: bool) -> None:
    # The 135M model rarely calls tools on its own: force the answer's tokens (their logprobs are
    # still the model's) so the tool-call path is exercised every time.
    force = lambda body: TOOL_TEXT if not any(m["role"] == "tool" for m in body["messages"]) else None  # noqa: E731
    with RealModelServer(model, force=force, max_tokens_cap=48) as srv:
        req = {"messages": MESSAGES, "tools": TOOLS, "temperature": 1.0, "logprobs": True, "return_token_ids": True}
        if streamed:
            chunks, draft = stream(srv, req)
            got = draft.fields()
            prompt, ids, lps, calls, finish, content = (
                got["prompt_token_ids"],
                got["completion_token_ids"],
                got["per_token_logps"],
                got["tool_calls"],
                got["finish_reason"],
                got["completion_text"],
            )
            assert all("<tool_call" not in (c["choices"][0]["delta"].get("content") or "") for c in chunks[1:])
            content = content or None
        else:
            body = post(srv, req).json()
            choice = body["choices"][0]
            prompt, ids, calls, finish, content = (
                body["prompt_token_ids"],
                choice["token_ids"],
                choice["message"]["tool_calls"],
                choice["finish_reason"],
                choice["message"]["content"],
            )
            lps = [e["logprob"] for e in choice["logprobs"]["content"]]
        assert finish == "tool_calls" and content is None
        assert [(c["type"], c["function"]) for c in calls] == [("function", {"name": "bash", "arguments": '{"command": "ls -la"}'})]
        assert calls[0]["id"]
        assert ids == model.tokenizer.encode(TOOL_TEXT, add_special_tokens=False) + [model.tokenizer.eos_token_id]
        assert max_diff(lps, model.teacher_forced_logprobs(prompt, ids, 1.0)) < TOL
        # the harness sends the history back as returned: the next prompt extends prompt + completion
        history = [
            *MESSAGES,
            {"role": "assistant", "content": content, "tool_calls": calls},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "a.txt\nb.txt"},
        ]
        body2 = post(srv, {"messages": history, "tools": TOOLS, "max_tokens": 4, "return_token_ids": True}).json()
        nxt = body2["prompt_token_ids"]
        assert nxt[: len(prompt) + len(ids)] == prompt + ids
        assert srv.answers[1].prompt_token_ids == nxt


def test_generation_does_not_block_the_event_loop(server: RealModelServer) -> None:
    import threading

    done: dict[str, float] = {}

    def slow() -> None:
        assert (
            post(server, {"messages": [{"role": "user", "content": "Write a long story about a dragon."}], "max_tokens": 24, "temperature": 0}).status_code
            == 200
        )
        done["chat"] = time.monotonic()

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.3)
    assert httpx.get(server.base_url + "/models", timeout=10).status_code == 200
    done["models"] = time.monotonic()
    t.join()
    assert done["models"] < done["chat"]  # answered while the model was generating
