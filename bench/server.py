"""Rollout overhead of the server vs the in-process engine, and rollouts per minute.

    .venv/bin/python bench/server.py [--repeats 7] [--levels 1,4,16]

Both paths run the same scripted task (the real Pi CLI against the scripted policy of tests/fakes,
in a process of its own: one shell command, one answer, one verify command), both on uvloop. In-process and through-the-server rollouts are
interleaved; the figure is the ratio of the medians of their wall times as the caller sees them.
Then rollouts per minute through the server (the client's run_many) at each concurrency level.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scripted_policy import scripted_policy  # noqa: E402
from harness_env import Endpoint, RolloutRequest, Task, run_rollout  # noqa: E402
from harness_env.client import AsyncHarnessEnv  # noqa: E402
from tests.server_process import ServerProcess  # noqa: E402

TASK = {"instruction": "Create hello.txt containing hello.", "verify": ["grep -qx hello hello.txt"]}


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--levels", default="1,4,16")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]

    with scripted_policy([{"bash": "echo hello > hello.txt"}, {"text": "done"}]) as policy_url:
        sandbox_dir = Path(tempfile.mkdtemp(prefix="bench-server-"))
        server = ServerProcess(sandbox_dir, "--max-concurrent", str(max(levels)))
        try:
            req = RolloutRequest(task=Task(**TASK), endpoint=Endpoint(base_url=policy_url, model="m"))
            args_http = {**TASK, "base_url": policy_url, "model": "m"}
            inproc, remote = [], []
            async with AsyncHarnessEnv(server.url) as env:
                await run_rollout(req)  # warm-up both paths (page cache, Node start-up)
                await env.run_rollout(**args_http)
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    r1 = await run_rollout(req)
                    inproc.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    r2 = await env.run_rollout(**args_http)
                    remote.append(time.perf_counter() - t)
                    assert r1.reward == 1.0 and r2.reward == 1.0, (r1.error, r2.error)
                a, b = statistics.median(inproc), statistics.median(remote)
                print(f"rollout wall time, median of {args.repeats}: in-process {a:.3f}s, through the server {b:.3f}s")
                print(f"server overhead: {b - a:+.3f}s = {100 * (b - a) / a:+.1f}% of the rollout (ratio {b / a:.3f}; target < 5%)")
                print()
                print(f"{'concurrency':>12}{'rollouts':>10}{'wall s':>9}{'per minute':>12}{'failed':>8}")
                for level in levels:
                    n = max(level * 2, 8)
                    t = time.perf_counter()
                    results = [r async for r in env.run_many([args_http] * n, concurrency=level)]
                    wall = time.perf_counter() - t
                    failed = sum(1 for r in results if r.reward != 1.0)
                    print(f"{level:>12}{n:>10}{wall:>9.1f}{60 * n / wall:>12.1f}{failed:>8}")
        finally:
            server.stop()
            shutil.rmtree(sandbox_dir, ignore_errors=True)  # the bench's own; the server left it empty
    return 0


if __name__ == "__main__":
    import uvloop

    raise SystemExit(uvloop.run(main()))
