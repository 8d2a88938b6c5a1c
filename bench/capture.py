"""Cost of the training data: turn graph + training rows, and the size of a stored rollout.

    .venv/bin/python bench/capture.py [--turns 10,20,40] [--repeats 5]

A synthetic agent conversation as a harness sends it: a 2,000-token system prompt + task, then per
turn a 150-token completion (with a tool call) and a 300-token tool result, every prompt extending
the previous one (one branch), with the request messages growing the same way. For each length it
prints the time and peak memory to link the graph and build the rows, and the stored size whole
(RolloutResult JSON) and compact (storage.pack: each turn's new tokens once). Ratios between
lengths show the growth: compact storage grows linearly, the whole result quadratically.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import tracemalloc

from harness_env.core.capture.graph import link_turns, summarise_rows
from harness_env.models import RolloutResult, Turn
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
        out.append(Turn(index=i, prompt_token_ids=list(prompt), completion_token_ids=completion,
                        per_token_logps=[-rng.random() for _ in completion], upstream_status=200, capture_level="tokens",
                        request_messages=list(messages), tool_calls=[call], completion_text="thinking " * 20))
        messages = messages + [{"role": "assistant", "content": "thinking " * 20, "tool_calls": [call]},
                               {"role": "tool", "tool_call_id": f"call_{i}", "content": "output line\n" * 100}]
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
    return {"turns": turns, "rows_ms": statistics.median(times) * 1000, "peak_mb": peak / 2**20,
            "whole_mb": whole / 2**20, "compact_mb": compact / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", default="10,20,40")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    rows = [measure(int(n), args.repeats) for n in args.turns.split(",")]
    print(f"{'turns':>6} {'graph+rows ms':>14} {'peak MB':>8} {'whole MB':>9} {'compact MB':>11} {'whole/compact':>14}")
    for r in rows:
        print(f"{r['turns']:>6} {r['rows_ms']:>14.2f} {r['peak_mb']:>8.2f} {r['whole_mb']:>9.2f} {r['compact_mb']:>11.3f} {r['whole_mb'] / r['compact_mb']:>14.1f}")
    for a, b in zip(rows, rows[1:]):
        k = b["turns"] / a["turns"]
        print(f"{a['turns']}->{b['turns']} turns (x{k:g}): whole x{b['whole_mb'] / a['whole_mb']:.2f}, compact x{b['compact_mb'] / a['compact_mb']:.2f}, "
              f"graph+rows time x{b['rows_ms'] / a['rows_ms']:.2f}")


if __name__ == "__main__":
    main()
