"""Cost of running an agent through Harbor (harness=harbor, Harbor's own Pi agent in our local
bubblewrap environment) against our native harness (harness=pi), side by side.

    .venv/bin/python bench/harbor_overhead.py [--repeats 7]

Both run the same task (the real Pi CLI, one shell command, one answer, one verify command)
against the scripted policy of tests/fakes in a process of its own; native and Harbor rollouts are
interleaved and the figure is the ratio of the medians of their wall times. The first Harbor
rollout of a process also pays Harbor's one-time import (LiteLLM), measured separately.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scripted_policy import scripted_policy  # noqa: E402
from harness_env import Endpoint, RolloutRequest, Task, run_rollout  # noqa: E402


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    with scripted_policy([{"bash": "echo hello > /app/hello.txt; echo hello > hello.txt"}, {"text": "done"}]) as url:
        endpoint = Endpoint(base_url=url, model="m")
        native = RolloutRequest(
            task=Task(instruction="Create hello.txt containing hello.", verify=["grep -qx hello hello.txt"]), endpoint=endpoint, harness="pi"
        )
        harbor = RolloutRequest(
            task=Task(instruction="Create /app/hello.txt containing hello.", verify=["grep -qx hello /app/hello.txt"]),
            endpoint=endpoint,
            harness="harbor",
            harbor={"agent": "pi"},
        )
        t = time.perf_counter()
        first = await run_rollout(harbor)
        first_s = time.perf_counter() - t
        assert first.reward == 1.0, first.error
        await run_rollout(native)  # warm-up (page cache, Node start-up)
        times: dict[str, list[float]] = {"native": [], "harbor": []}
        for _ in range(args.repeats):
            for name, req in (("native", native), ("harbor", harbor)):
                t = time.perf_counter()
                res = await run_rollout(req)
                times[name].append(time.perf_counter() - t)
                assert res.reward == 1.0, (name, res.error)
        n, h = statistics.median(times["native"]), statistics.median(times["harbor"])
        print(f"first Harbor rollout in a process (imports Harbor + LiteLLM): {first_s:.2f} s")
        print(f"rollout wall time, median of {args.repeats}: native pi {n:.3f} s, Harbor's pi agent {h:.3f} s")
        print(f"ratio harbor / native: {h / n:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
