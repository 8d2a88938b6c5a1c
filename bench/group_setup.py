"""What one setup per group saves a GRPO step: a group of N identical white-box rollouts whose setup
makes a Python venv with pip (a few seconds of real work, as a task's installs are), run with every
member running setup and with one setup per group (the others start from a copy of what it left),
interleaved, median of R, in one run. Verify runs the venv's pip by its script, whose first line
names the directory setup ran in: it passes in every member either way.

    .venv/bin/python bench/group_setup.py [--members 8,16] [--repeats 3]
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
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scripted_policy import scripted_policy  # noqa: E402
from harness_env import Endpoint, RolloutRequest, Task, run_rollout  # noqa: E402
from harness_env.core.sandbox.factory import LocalSandboxFactory  # noqa: E402
from harness_env.core.sandbox.setuplayers import SetupLayers  # noqa: E402

SCRIPT = [{"bash": "echo hello > hello.txt"}, {"text": "done"}]


async def group(base_url: str, n: int, shared: bool) -> tuple[float, int]:
    """Wall seconds of a group of `n`, and how many members ran setup themselves."""
    nonce = uuid.uuid4().hex[:8]  # a group of its own: never one a former round saved
    task = Task(
        instruction="Create hello.txt containing hello.",
        setup=[f": {nonce}", "python3 -m venv .venv"],
        verify=["grep -qx hello hello.txt", ".venv/bin/pip --version"],
    )
    req = RolloutRequest(task=task, endpoint=Endpoint(base_url=base_url, model="m"), harness="whitebox", agent_timeout_s=120, setup_timeout_s=600)
    factory = LocalSandboxFactory(setup_layers=SetupLayers.from_env() if shared else None)
    started = time.monotonic()
    results = await asyncio.gather(*(run_rollout(req, sandbox_factory=factory) for _ in range(n)))
    wall = time.monotonic() - started
    bad = [r for r in results if r.error or r.reward != 1.0]
    if bad:
        raise SystemExit(f"n={n} shared={shared}: {bad[0].error_kind}: {bad[0].error} {bad[0].verify_results}")
    ran = sum(1 for r in results if "run once for the group" not in next(p.detail for p in r.phases if p.name == "setup"))
    return wall, ran


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", default="8,16")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="harness-env-bench-")
    os.environ["HARNESS_ENV_SANDBOX_DIR"] = tmp + "/sandboxes"
    try:
        with scripted_policy(SCRIPT) as base_url:
            await group(base_url, 1, False)  # warm-up (imports, page cache)
            print(f"{os.cpu_count()} CPUs")
            print(f"{'members':>7} {'each runs setup s':>18} {'one setup s':>12} {'ratio':>6}  setups run")
            for n in (int(x) for x in args.members.split(",")):
                walls: dict[bool, list[float]] = {False: [], True: []}
                ran: dict[bool, int] = {}
                for _ in range(args.repeats):
                    for shared in (False, True):
                        wall, ran[shared] = await group(base_url, n, shared)
                        walls[shared].append(wall)
                each, once = statistics.median(walls[False]), statistics.median(walls[True])
                print(f"{n:7} {each:18.2f} {once:12.2f} {each / once:6.2f}  {ran[False]} vs {ran[True]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
