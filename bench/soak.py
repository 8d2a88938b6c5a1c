"""A soak: N rollouts through a real server, white-box and Pi mixed, with faults injected, and
what is left behind counted at the end.

    .venv/bin/python bench/soak.py [--rollouts 1000] [--pi-share 0.3] [--concurrency 16]
        [--kill-every-s 3] [--restart-at 0.5] [--json FILE]

One `harness-env serve` process (its own sandbox directory and job store) runs the rollouts the
client's `run_many` keeps in flight; the policy is the scripted one of tests/fakes, in a process of
its own. Each rollout's instruction names its script ([tag:NAME]):
  - ok:    the agent writes hello.txt; verify passes (reward 1);
  - wrong: it writes something else (reward 0);
  - e500:  the endpoint answers 500 to every call (reward None, `endpoint`);
  - slow:  its first command sleeps, so a harness is there to be killed.
Faults: every --kill-every-s seconds a random harness process of a running rollout is killed
(SIGKILL: Pi's node, or the white-box loop's shell command); once --restart-at of the results are
in, the server is killed (SIGKILL) and started again on the same port, store and sandbox
directory, and the client rides through the restart (it reconnects and waits on).

It passes when every result is graded (a finite reward) or masked for a reason (reward None with
an error_kind the agent cannot cause and a message, or a harness that died before any answer of
the policy's, when nothing of the policy's exists to grade), and when, at the end, the sandbox directory is
empty, nothing is mounted below it, and no process of a rollout is alive. It prints the counts, the
rollouts per minute, and exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import get_args

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness_env.client import AsyncHarnessEnv  # noqa: E402
from harness_env.core.sandbox.envvars import MARKER_VAR  # noqa: E402
from harness_env.models.results import AGENT_CAUSED_KINDS, ErrorKind  # noqa: E402
from tests.server_process import ServerProcess  # noqa: E402

SCRIPTS = {
    "ok": [{"bash": "echo hello > hello.txt"}, {"text": "done"}],
    "wrong": [{"bash": "echo nope > hello.txt"}, {"text": "done"}],
    "e500": [{"status": 500}] * 8,
    "slow": [{"bash": "sleep 4; echo hello > hello.txt"}, {"text": "done"}],
}
MIX = {"ok": 0.55, "wrong": 0.15, "e500": 0.1, "slow": 0.2}
# What a rollout may end masked with (reward None): only what the agent cannot cause (nor a bad
# request: every request here is good).
MASKED_KINDS = set(get_args(ErrorKind)) - AGENT_CAUSED_KINDS - {"invalid_request"}
HARNESS_COMMS = {b"pi", b"node", b"bash", b"sh", b"sleep", b"python3", b"python"}

_POLICY = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from tests.fakes.policy import FakePolicy, FakePolicyServer
srv = FakePolicyServer(FakePolicy(scripts=json.loads(sys.argv[2]))).__enter__()
print(srv.base_url, flush=True)
time.sleep(1e9)
"""


def rollout_args(i: int, rng: random.Random, policy_url: str, pi_share: float) -> dict:
    tag = rng.choices(list(MIX), weights=list(MIX.values()))[0]
    return {
        "instruction": f"[tag:{tag}] Create hello.txt containing hello. (#{i})",
        "verify": ["grep -qx hello hello.txt"],
        "base_url": policy_url,
        "model": "m",
        "harness": "pi" if rng.random() < pi_share else "whitebox",
        "agent_timeout_s": 120,
        "task_id": f"soak-{i}-{tag}",
    }


def rollout_processes(sandbox_dir: Path, seen: set[str] | None = None) -> list[int]:
    """PIDs of every process a sandbox of this soak's server started: they carry the marker
    variable naming their rollout directory, one of `sandbox_dir`'s, or one of `seen` (the
    directories it has had), never another server's rollouts on this machine."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            marker = next((v.split(b"=", 1)[1].decode(errors="replace") for v in env if v.startswith(f"{MARKER_VAR}=".encode())), None)
            if marker and (marker in (seen or ()) or (sandbox_dir / marker).exists()):
                out.append(int(entry))
    return out


def comm(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().strip()
    except OSError:
        return b""


def mounts_below(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(str(path))]


async def watch(sandbox_dir: Path, stop: asyncio.Event, seen: set[str]) -> None:
    """Note every rollout directory the server makes (what is left of them is looked for at the end)."""
    while not stop.is_set():
        seen.update(n for n in os.listdir(sandbox_dir) if not n.endswith(".lease"))
        await asyncio.sleep(0.1)


async def killer(sandbox_dir: Path, every_s: float, stop: asyncio.Event, rng: random.Random, killed: list[str]) -> None:
    """Kill one random harness process of a running rollout every `every_s` seconds."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            pass
        candidates = [p for p in rollout_processes(sandbox_dir) if comm(p) in HARNESS_COMMS]
        if candidates and not stop.is_set():
            pid = rng.choice(candidates)
            name = comm(pid).decode()
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(name)
            except ProcessLookupError:
                pass


def verdict(result) -> str:
    """'graded', 'masked:<kind>', or 'WRONG:<why>' for a result that breaks the contract."""
    if result.reward is not None:
        return "graded" if isinstance(result.reward, float) else f"WRONG: reward {result.reward!r}"
    if result.error_kind in MASKED_KINDS and result.error:
        return f"masked:{result.error_kind}"
    acted = any(t.purpose == "policy" and t.upstream_status == 200 for t in result.proxy_turns)
    if result.error_kind in AGENT_CAUSED_KINDS and result.error and not acted:
        return f"masked:{result.error_kind} before the policy acted"  # nothing of the policy's to grade (core/engine.py end_of_agent)
    phases = "; ".join(f"{p.name}{'' if p.ok else ' failed'}: {p.detail[:120]}" for p in result.phases)
    return f"WRONG: reward None with error_kind {result.error_kind!r}: {(result.error or '')[:200]} [{phases}] notes={result.sandbox_notes}"


async def soak(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="harness-env-soak-"))
    sandbox_dir = work / "sandboxes"
    sandbox_dir.mkdir()
    data_dir = work / "data"
    env = {"HARNESS_ENV_DATA_DIR": str(data_dir)}
    serve_args = ("--max-concurrent", str(args.concurrency))
    policy = await asyncio.create_subprocess_exec(sys.executable, "-c", _POLICY, str(ROOT), json.dumps(SCRIPTS), stdout=asyncio.subprocess.PIPE)
    policy_url = (await policy.stdout.readline()).decode().strip()  # type: ignore[union-attr]
    server = ServerProcess(sandbox_dir, *serve_args, env=env, start_timeout_s=60)
    requests = [rollout_args(i, rng, policy_url, args.pi_share) for i in range(args.rollouts)]
    outcomes: collections.Counter[str] = collections.Counter()
    by_tag: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    wrong: list[str] = []
    killed: list[str] = []
    restarts: list[dict] = []
    stop = asyncio.Event()
    seen: set[str] = set()
    kill_task = asyncio.create_task(killer(sandbox_dir, args.kill_every_s, stop, rng, killed))
    watch_task = asyncio.create_task(watch(sandbox_dir, stop, seen))
    started = time.monotonic()
    done = 0
    try:
        async with AsyncHarnessEnv(server.url, reconnect_for_s=180, timeout=60) as client:
            async for result in client.run_many(requests, concurrency=args.concurrency):
                done += 1
                seen.update(p.detail.split()[-1] for p in result.phases if p.name == "sandbox" and p.detail)
                v = verdict(result)
                outcomes[v.split(":")[0] if v.startswith("WRONG") else v] += 1
                by_tag[(result.task_id or "?").rsplit("-", 1)[-1]][v if not v.startswith("WRONG") else "WRONG"] += 1
                if v.startswith("WRONG"):
                    wrong.append(v)
                if not restarts and done >= args.restart_at * args.rollouts:
                    t = time.monotonic()
                    server.proc.kill()  # SIGKILL: no lifespan, no cleanup of its own
                    server.proc.wait()
                    left_tmp = sorted(p.name for p in server.tmp_dir.iterdir())  # the restart must sweep these
                    server = ServerProcess(sandbox_dir, *serve_args, env=env, start_timeout_s=60, port=server.port)
                    restarts.append({"after_results": done, "down_s": round(time.monotonic() - t, 2), "dead_server_tmp_left": left_tmp})
                if done % max(1, args.rollouts // 20) == 0:
                    print(f"  {done}/{args.rollouts} results, {time.monotonic() - started:.0f}s, {dict(outcomes)}", flush=True)
        wall = time.monotonic() - started
    finally:
        stop.set()
        await kill_task
        await watch_task
        deadline = time.monotonic() + 30  # the server's own rollouts end and their directories go
        while time.monotonic() < deadline and (os.listdir(sandbox_dir) or rollout_processes(sandbox_dir, seen)):
            await asyncio.sleep(0.5)
        left_dirs = sorted(os.listdir(sandbox_dir))
        left_mounts = mounts_below(sandbox_dir)
        left_procs = [f"{p}:{comm(p).decode()}" for p in rollout_processes(sandbox_dir, seen)]
        server_log_tail = server.log_path.read_text()[-2000:]
        try:
            server.stop()
        except AssertionError as e:  # its TMPDIR held something: a leftover too
            left_dirs.append(f"server TMPDIR: {e}")
        policy.kill()
        await policy.wait()
        shutil.rmtree(work, ignore_errors=True)
    return {
        "rollouts": args.rollouts,
        "results": done,
        "wall_s": round(wall, 1),
        "rollouts_per_min": round(60 * done / wall, 1),
        "sandboxes_seen": len(seen),
        "outcomes": dict(outcomes),
        "by_tag": {k: dict(v) for k, v in sorted(by_tag.items())},
        "harness_processes_killed": dict(collections.Counter(killed)),
        "server_restarts": restarts,
        "left_dirs": left_dirs,
        "left_mounts": left_mounts,
        "left_processes": left_procs,
        "contract_broken": wrong[:20],
        "server_log_tail": server_log_tail if wrong or left_dirs or left_procs else "",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rollouts", type=int, default=1000)
    ap.add_argument("--pi-share", type=float, default=0.3, help="share of rollouts run by the Pi CLI (the rest: white-box)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--kill-every-s", type=float, default=3.0)
    ap.add_argument("--restart-at", type=float, default=0.5, help="share of results after which the server is killed and restarted")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    report = asyncio.run(soak(args))
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    ok = report["results"] == args.rollouts and not report["contract_broken"]
    ok = ok and not report["left_dirs"] and not report["left_mounts"] and not report["left_processes"]
    print("soak: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
