"""What the sandbox hardening costs a rollout: the same scripted task with the network cut to the
capture proxy (the default, `network="proxy_only"`: a network namespace plus socat per command)
and with the host network (`network="open"`), interleaved, median of N, per harness. Both run
under the same limits (cgroup, tmpfs, unprivileged uid), so the ratio isolates the network cut;
the absolute wall time includes everything.

    .venv/bin/python bench/isolation.py [--repeats 7] [--harnesses whitebox,pi]
"""

from __future__ import annotations

import argparse
import asyncio
import os
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

TASK = Task(instruction="Create hello.txt containing hello.", verify=["grep -qx hello hello.txt"], task_id="bench")
SCRIPT = [{"bash": "echo hello > hello.txt"}, {"bash": "cat hello.txt"}, {"text": "done"}]


async def one(base_url: str, harness: str, network: str) -> float:
    req = RolloutRequest(task=TASK, endpoint=Endpoint(base_url=base_url, model="m"), harness=harness, network=network, agent_timeout_s=60)
    started = time.monotonic()
    res = await run_rollout(req)
    wall = time.monotonic() - started
    if res.error or res.reward != 1.0:
        raise SystemExit(f"{harness}/{network}: rollout failed: {res.error_kind}: {res.error}")
    if (network == "proxy_only") != (not any("network open" in n for n in res.sandbox_notes)):
        raise SystemExit(f"{harness}/{network}: the network was not what was asked: {res.sandbox_notes}")
    return wall


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--harnesses", default="whitebox,pi")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="harness-env-bench-")
    os.environ["HARNESS_ENV_SANDBOX_DIR"] = tmp
    try:
        with scripted_policy(SCRIPT) as base_url:
            print(f"{'harness':10} {'open s':>8} {'proxy_only s':>13} {'ratio':>7}")
            for harness in args.harnesses.split(","):
                await one(base_url, harness, "open")  # warm-up (imports, page cache)
                walls: dict[str, list[float]] = {"open": [], "proxy_only": []}
                for _ in range(args.repeats):
                    for network in ("open", "proxy_only"):
                        walls[network].append(await one(base_url, harness, network))
                o, p = statistics.median(walls["open"]), statistics.median(walls["proxy_only"])
                print(
                    f"{harness:10} {o:8.4f} {p:13.4f} {p / o:7.3f}   (open {min(walls['open']):.3f}-{max(walls['open']):.3f}, "
                    f"proxy_only {min(walls['proxy_only']):.3f}-{max(walls['proxy_only']):.3f})"
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
