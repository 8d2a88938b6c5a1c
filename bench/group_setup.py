"""What one setup per group saves a GRPO step: a group of N identical white-box rollouts whose setup
makes a Python venv with pip (a few seconds of real work, as a task's installs are), run four
ways, interleaved, median of R, in one run: every member running setup ("each"), one setup per
group with the other members copying the saved layer ("copy", HARNESS_ENV_SETUP_OVERLAY=0), one
setup per group with the others mounting it as overlays but the layer saved on disk
("overlay-disk", HARNESS_ENV_SETUP_CACHE_MEMORY=0), and the default: overlays on a layer saved in
the cache's own tmpfs ("overlay"; core/sandbox/setupfork.py and setuplayers.py; the copy, on disk,
where this host cannot mount them). A fifth row, "next step", is the overlay group's task again
on the same server (as a trainer's next epoch over its tasks asks for it): the layer is still kept
(HARNESS_ENV_SETUP_CACHE_AGE_S), so no member runs setup. Verify runs the venv's pip by its script, whose first line
names the directory setup ran in: it passes in every member every way.

Two figures per way: the group's start (from the call until every member's agent has started:
the setup phase, saving the layer, and every member's sandbox) and its whole wall (setup, agents,
verify, close). Then where the overlay groups' start goes, from the results' phase timings.

With `--groups G`, G groups (G tasks) start at once, as a GRPO step over G prompts does: one
group alone cannot use more than one core for its one setup, while its N setups without sharing
spread over every core, so on C cores one group's start ratio is at most about N/C; with G >= C
groups both ways keep every core busy, and the ratio approaches N.

    .venv/bin/python bench/group_setup.py [--members 8,16] [--repeats 3] [--groups 1]
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
from harness_env import Endpoint, RolloutRequest, RolloutResult, Task, run_rollout  # noqa: E402
from harness_env.core.sandbox.factory import LocalSandboxFactory  # noqa: E402
from harness_env.core.sandbox.setupfork import OVERLAY_VAR, overlay_refusal  # noqa: E402
from harness_env.core.sandbox.setuplayers import MEMORY_VAR, SetupLayers  # noqa: E402

SCRIPT = [{"bash": "echo hello > hello.txt"}, {"text": "done"}]
WAYS = ("each", "copy", "overlay-disk", "overlay", "next step")


def phase(r: RolloutResult, name: str):
    return next(p for p in r.phases if p.name == name)


_last: dict[str, tuple[list[str], LocalSandboxFactory]] = {}  # the overlay step's tasks and cache, for "next step"


async def group(base_url: str, n: int, way: str, groups: int = 1) -> tuple[float, float, list[RolloutResult]]:
    """(start s, wall s, results) of `groups` groups of `n` (a GRPO step over `groups` tasks) run `way`."""
    nonces = [uuid.uuid4().hex[:8] for _ in range(groups)]  # groups of their own: never one a former round saved
    if way == "next step":  # the overlay step's tasks again, on the same server: their layers are kept
        nonces, factory = _last["overlay"]
    tasks = [
        Task(
            instruction="Create hello.txt containing hello.",
            setup=[f": {nonce}", "python3 -m venv .venv"],
            verify=["grep -qx hello hello.txt", ".venv/bin/pip --version"],
        )
        for nonce in nonces
    ]
    endpoint = Endpoint(base_url=base_url, model="m")
    reqs = [RolloutRequest(task=t, endpoint=endpoint, harness="whitebox", agent_timeout_s=120, setup_timeout_s=600) for t in tasks for _ in range(n)]
    os.environ[OVERLAY_VAR] = "0" if way == "copy" else "1"
    os.environ[MEMORY_VAR] = "0" if way == "overlay-disk" else "1"
    if way != "next step":
        factory = LocalSandboxFactory(setup_layers=SetupLayers.from_env() if way != "each" else None)
        _last[way] = (nonces, factory)
    t0 = time.time()
    results = await asyncio.gather(*(run_rollout(req, sandbox_factory=factory) for req in reqs))
    wall = time.time() - t0
    if factory.setup_layers is not None and way != "overlay-disk" and not factory.setup_layers.in_memory:
        print(f"  ({way}: the setup cache is on disk here: the server cannot mount a tmpfs)")
    bad = [r for r in results if r.error or r.reward != 1.0]
    if bad:
        raise SystemExit(f"n={n} {way}: {bad[0].error_kind}: {bad[0].error} {bad[0].verify_results}")
    start = max(phase(r, "agent").started for r in results) - t0
    return start, wall, results


def breakdown(results: list[RolloutResult]) -> tuple[float, float, float]:
    """(a leader's setup s, saving its layer s, a member's sandbox s: medians) of shared groups."""
    members = [r for r in results if "run once for the group" in phase(r, "setup").detail]
    setups = [(phase(r, "setup"), phase(r, "agent").started) for r in results if r not in members]  # the leaders'
    saved = statistics.median(agent - (s.started + s.duration_s) for s, agent in setups)
    return statistics.median(s.duration_s for s, _ in setups), saved, statistics.median(phase(r, "sandbox").duration_s for r in members)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", default="8,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--groups", type=int, default=1, help="groups at once, each its own task (a GRPO step over that many prompts)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="harness-env-bench-")
    os.environ["HARNESS_ENV_SANDBOX_DIR"] = tmp + "/sandboxes"
    try:
        with scripted_policy(SCRIPT) as base_url:
            await group(base_url, 1, "each")  # warm-up (imports, page cache)
            os.environ.pop(OVERLAY_VAR, None)
            print(f"{args.groups} group(s) at once; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}; overlay: {overlay_refusal() or 'mounted'}")
            print(f"{'members':>7} {'way':>12} {'start s':>8} {'wall s':>7} {'start ratio':>12} {'wall ratio':>11}  setups run")
            for n in (int(x) for x in args.members.split(",")):
                starts: dict[str, list[float]] = {w: [] for w in WAYS}
                walls: dict[str, list[float]] = {w: [] for w in WAYS}
                parts: dict[str, list[tuple[float, float, float]]] = {}
                ran: dict[str, int] = {}
                for _ in range(args.repeats):
                    for way in WAYS:
                        start, wall, results = await group(base_url, n, way, args.groups)
                        starts[way].append(start)
                        walls[way].append(wall)
                        ran[way] = sum(1 for r in results if "run once for the group" not in phase(r, "setup").detail)
                        if way.startswith("overlay"):
                            parts.setdefault(way, []).append(breakdown(results))
                each_start, each_wall = statistics.median(starts["each"]), statistics.median(walls["each"])
                for way in WAYS:
                    start, wall = statistics.median(starts[way]), statistics.median(walls[way])
                    print(f"{n:7} {way:>12} {start:8.2f} {wall:7.2f} {each_start / start:12.2f} {each_wall / wall:11.2f}  {ran[way]}")
                for way, got in parts.items():
                    setup, saved, sandbox = (statistics.median(p[i] for p in got) for i in range(3))
                    print(f"{'':7} {way} start: setup {setup:.2f} s, saving its layer {saved:.2f} s, a member's sandbox {sandbox:.3f} s (medians)")
            print(f"load average at the end {os.getloadavg()[0]:.1f}")
    finally:
        os.environ.pop(OVERLAY_VAR, None)
        os.environ.pop(MEMORY_VAR, None)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
