"""Cost of the training data: what the capture holds while a rollout runs, turn graph + training
rows, and the size of a stored rollout.

    .venv/bin/python bench/capture.py [--turns 10,20,40] [--repeats 5] [--held-turns 40] [--first-prompt 30000]

Memory while the rollout runs: a rollout of --held-turns calls whose first prompt has
--first-prompt tokens, each later prompt extending the one before by a 150-token completion and a
300-token tool result; the harness's request (its whole history, 4 characters a token) and the
engine's answer (vLLM's compact JSON: prompt ids, completion ids, logprobs) go through the
capture's own code (TurnDraft, CaptureSession.record), side by side with what the capture held
before (each turn a Turn with Python lists, as parsed, and its own copy of the history). Printed:
bytes held (tracemalloc, after the rollout), bytes per captured token (prompt + completion tokens
over all turns), the CPU per recorded turn, and the time to make the wire's Turns at the end.

A synthetic agent conversation as a harness sends it: a 2,000-token system prompt + task, then per
turn a 150-token completion (with a tool call) and a 300-token tool result, every prompt extending
the previous one (one branch), with the request messages growing the same way. For each length it
prints the time and peak memory to link the graph and build the rows, and the stored size whole
(RolloutResult JSON) and compact (storage.pack: each turn's new tokens once). Ratios between
lengths show the growth: compact storage grows linearly, the whole result quadratically.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable

from harness_env.core.capture import fastjson
from harness_env.core.capture.assemble import TurnDraft
from harness_env.core.capture.graph import link_turns, summarise_rows
from harness_env.core.capture.record import CallOutcome, CallRequest
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.capture.session import CaptureSession
from harness_env.models import Endpoint, RolloutResult, Turn
from harness_env.storage import pack, unpack

SYSTEM_TOKENS, COMPLETION_TOKENS, TOOL_TOKENS = 2000, 150, 300


def conversation(turns: int, seed: int = 0) -> RolloutResult:
    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(150_000) for _ in range(n)]  # noqa: E731
    prompt = ids(SYSTEM_TOKENS)
    messages = [{"role": "system", "content": "x" * 8000}, {"role": "user", "content": "task " * 50}]
    out = []
    for i in range(turns):
        completion = ids(COMPLETION_TOKENS)
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": "ls -la " + "x" * 40})}}
        out.append(
            Turn(
                index=i,
                prompt_token_ids=list(prompt),
                completion_token_ids=completion,
                per_token_logps=[-rng.random() for _ in completion],
                upstream_status=200,
                capture_level="tokens",
                request_messages=list(messages),
                tool_calls=[call],
                completion_text="thinking " * 20,
            )
        )
        messages = messages + [
            {"role": "assistant", "content": "thinking " * 20, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": "output line\n" * 100},
        ]
        prompt = prompt + completion + ids(TOOL_TOKENS)
    return RolloutResult(proxy_turns=out, reward=1.0)


def measure(turns: int, repeats: int) -> dict[str, float]:
    res = conversation(turns)
    times = []
    for _ in range(repeats):
        fresh = res.model_copy(deep=True)
        t0 = time.perf_counter()
        summarise_rows(link_turns(fresh.proxy_turns), fresh.training_rows())
        times.append(time.perf_counter() - t0)
    fresh = res.model_copy(deep=True)
    tracemalloc.start()
    summarise_rows(link_turns(fresh.proxy_turns), fresh.training_rows())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    whole = len(fresh.model_dump_json().encode())
    packed = pack(fresh)
    compact = len(json.dumps(packed, separators=(",", ":")).encode())
    assert unpack(packed) == fresh, "compact storage must round-trip exactly"
    return {"turns": turns, "rows_ms": statistics.median(times) * 1000, "peak_mb": peak / 2**20, "whole_mb": whole / 2**20, "compact_mb": compact / 2**20}


def wire_calls(turns: int, first_prompt: int, seed: int = 1) -> list[tuple[bytes, bytes]]:
    """(the harness's request body, the engine's answer body) per call, as bytes on the wire."""
    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(150_000) for _ in range(n)]  # noqa: E731
    dumps = lambda obj: json.dumps(obj, separators=(",", ":")).encode()  # noqa: E731 - vLLM's compact JSON
    prompt = ids(first_prompt)
    messages = [{"role": "system", "content": "x" * (first_prompt * 4 - 200)}, {"role": "user", "content": "task " * 40}]
    calls = []
    for i in range(turns):
        completion = ids(COMPLETION_TOKENS)
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": "ls " + "x" * 580})}}
        request = dumps({"model": "m", "messages": messages, "tools": [{"type": "function", "function": {"name": "bash"}}], "stream": False})
        answer = dumps(
            {
                "id": f"chatcmpl-{i}",
                "object": "chat.completion",
                "prompt_token_ids": prompt,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                        "finish_reason": "tool_calls",
                        "token_ids": completion,
                        "logprobs": {"content": [{"token": "t", "logprob": -rng.random(), "top_logprobs": []} for _ in completion]},
                    }
                ],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(completion)},
            }
        )
        calls.append((request, answer))
        messages = messages + [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "output line\n" * 100},
        ]
        prompt = prompt + completion + ids(TOOL_TOKENS)
    return calls


def _session() -> CaptureSession:
    return CaptureSession(key="bench", endpoint=Endpoint(base_url="http://127.0.0.1:9/v1", api_key="sk-bench-0123456789", model="m"), policy=CapturePolicy())


def record_packed(session: CaptureSession, i: int, request: bytes, answer: bytes) -> None:
    """One call as the proxy records it now (core/capture/proxy.py)."""
    body = fastjson.loads(request)
    draft = TurnDraft()
    draft.add_response_body(answer)
    session.record(CallRequest(i, "policy", False, body["messages"], body["tools"]), CallOutcome(200, None, 0.0), draft)


def record_lists(held: list[Turn], i: int, request: bytes, answer: bytes) -> None:
    """One call as the capture recorded it before: the answer parsed whole, a Turn with its lists."""
    body = fastjson.loads(request)
    parsed = fastjson.loads(answer)
    choice = parsed["choices"][0]
    held.append(
        Turn(
            index=i,
            request_messages=body["messages"],
            request_tools=body["tools"],
            upstream_status=200,
            prompt_token_ids=parsed["prompt_token_ids"],
            completion_token_ids=choice["token_ids"],
            per_token_logps=[float(c["logprob"]) for c in choice["logprobs"]["content"]],
            capture_level="tokens",
        )
    )


def held(calls: list[tuple[bytes, bytes]], record: Callable[[int, bytes, bytes], None]) -> tuple[int, float]:
    """Bytes still allocated after recording every call, and the median CPU seconds per call."""
    gc.collect()
    tracemalloc.start()
    for i, (request, answer) in enumerate(calls):
        record(i, request, answer)
    gc.collect()
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    times = []
    for i, (request, answer) in enumerate(calls):  # again, untraced, for the time
        t0 = time.process_time()
        record(i, request, answer)
        times.append(time.process_time() - t0)
    return size, statistics.median(times)


def memory(turns: int, first_prompt: int) -> None:
    calls = wire_calls(turns, first_prompt)
    captured = sum(len(fastjson.loads(a)["prompt_token_ids"]) + COMPLETION_TOKENS for _, a in calls)
    session, lists = _session(), []
    packed_bytes, packed_s = held(calls, lambda i, r, a: record_packed(session, i, r, a))
    lists_bytes, lists_s = held(calls, lambda i, r, a: record_lists(lists, i, r, a))
    session.turns = session.turns[:turns]
    t0 = time.perf_counter()
    wire = session.sorted_turns()
    build_s = time.perf_counter() - t0
    assert [(t.prompt_token_ids, t.completion_token_ids, t.per_token_logps) for t in wire] == [
        (t.prompt_token_ids, t.completion_token_ids, t.per_token_logps) for t in lists[:turns]
    ], "packed turns must give the same lists"
    last = len(fastjson.loads(calls[-1][1])["prompt_token_ids"])
    print(
        f"Memory while a rollout runs: {turns} turns, prompts {first_prompt:,} -> {last:,} tokens, {captured:,} captured tokens "
        f"(prompt + completion over all turns)"
    )
    print(f"{'held as':<34}{'MB held':>9}{'bytes/captured token':>22}{'CPU per recorded turn':>23}")
    for name, size, cpu in (("lists (before)", lists_bytes, lists_s), ("packed, shared prefixes (now)", packed_bytes, packed_s)):
        print(f"{name:<34}{size / 2**20:>9.2f}{size / captured:>22.3f}{cpu * 1000:>20.3f} ms")
    unique = last + COMPLETION_TOKENS  # every token of the rollout once: its last prompt + completion
    pieces = {id(p): len(p) for t in session.turns if t.prompt is not None for p in t.prompt.pieces}
    arrays = sum(t.completion.itemsize * len(t.completion) + t.logps.itemsize * len(t.logps) for t in session.turns)
    tokens_only = sum(pieces.values()) + arrays
    print(
        f"packed: the token storage alone (prompt id text, completion id and logprob arrays) {tokens_only / 2**20:.2f} MB, "
        f"{tokens_only / captured:.3f} bytes per captured token, {tokens_only / unique:.2f} per distinct token; "
        f"everything held (the history too) {packed_bytes / unique:.2f} bytes per distinct token ({unique:,})"
    )
    print(
        f"lists/packed: memory x{lists_bytes / packed_bytes:.1f}, CPU per turn x{lists_s / packed_s:.2f}; "
        f"the wire's Turns for the result made in {build_s * 1000:.0f} ms\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", default="10,20,40")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--held-turns", type=int, default=40, help="turns of the rollout whose held memory is measured")
    ap.add_argument("--first-prompt", type=int, default=30_000, help="tokens in that rollout's first prompt")
    args = ap.parse_args()
    memory(args.held_turns, args.first_prompt)
    rows = [measure(int(n), args.repeats) for n in args.turns.split(",")]
    print(f"{'turns':>6} {'graph+rows ms':>14} {'peak MB':>8} {'whole MB':>9} {'compact MB':>11} {'whole/compact':>14}")
    for r in rows:
        print(
            f"{r['turns']:>6} {r['rows_ms']:>14.2f} {r['peak_mb']:>8.2f} {r['whole_mb']:>9.2f} {r['compact_mb']:>11.3f} "
            f"{r['whole_mb'] / r['compact_mb']:>14.1f}"
        )
    for a, b in zip(rows, rows[1:]):
        k = b["turns"] / a["turns"]
        print(
            f"{a['turns']}->{b['turns']} turns (x{k:g}): whole x{b['whole_mb'] / a['whole_mb']:.2f}, compact x{b['compact_mb'] / a['compact_mb']:.2f}, "
            f"graph+rows time x{b['rows_ms'] / a['rows_ms']:.2f}"
        )


if __name__ == "__main__":
    main()
