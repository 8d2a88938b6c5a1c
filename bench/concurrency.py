"""Concurrency sweep: N rollouts arriving at once at a real `harness-env serve`.

    .venv/bin/python bench/concurrency.py [--delay 3] [--calls 6] [--prompt-kb 20]
        [--whitebox 16,64,128,256] [--pi 8,16,32,64] [--opencode 8,16,32,64] [serve flags after --]

The policy (tests/fakes, in a process of its own) answers every model call `--delay` seconds after
it arrives, as a busy vLLM does, and each task takes `--calls` model calls (shell commands, then an
answer) with a prompt of about `--prompt-kb` KB (the instruction; token ids to match). At each N,
N rollouts are sent to POST /rollout in the same instant. Per N it prints: rollouts completed and
failed (by error kind), throughput against the ideal N / (T x D), the overhead of a rollout beyond
T x D (p50/p99), the time from arrival to the agent's first model call (p50/p99), the server's
peak RSS and CPU, RSS and CPU per rollout including its harness processes, the server's event-loop
lag (p50/p99, from /metrics; beside it an idle server's p99 over the same time, the share of the
machine's own load) and what a model call took at the proxy beyond D (p50/p99), and the
load average (other users of the machine show there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scripted_policy import scripted_policy  # noqa: E402
from tests.server_process import ServerProcess  # noqa: E402

LAG_METRIC = "harness_env_event_loop_lag_seconds"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def script(calls: int) -> list[dict]:
    """calls - 1 shell commands, then an answer: T model calls."""
    return [{"bash": f"echo step {i} >> steps.txt"} for i in range(calls - 1)] + [{"text": "done"}]


def instruction(tag: str, prompt_kb: int) -> str:
    """A task instruction of about `prompt_kb` KB (a realistic prompt: a task statement with
    context pasted in), tagged so the policy can time this rollout's calls."""
    filler = "".join(f"Context line {i}: the repository keeps its notes in steps.txt, one line per step.\n" for i in range(prompt_kb * 14))
    return f"[tag:{tag}] Run the steps you are given; each appends a line to steps.txt.\n{filler[: prompt_kb * 1024]}"


def lag_buckets(text: str) -> dict[float, float]:
    """The cumulative bucket counts of the loop-lag histogram in a /metrics page."""
    for family in text_string_to_metric_families(text):
        if family.name == LAG_METRIC:
            return {float(s.labels["le"]): s.value for s in family.samples if s.name.endswith("_bucket")}
    return {}


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The q-quantile of the samples between two scrapes (linear within its bucket)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0
    if total <= 0:
        return float("nan")
    want, lower, prev = q * total, 0.0, 0.0
    for bound, cum in zip(bounds, counts):
        if cum >= want:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * ((want - prev) / max(cum - prev, 1e-9))
        lower, prev = bound, cum
    return lower


class TreeSampler:
    """Peak RSS of the server alone and of the server with every process under it, sampled."""

    def __init__(self, pid: int, every_s: float = 0.25) -> None:
        self.proc = psutil.Process(pid)
        self.every_s = every_s
        self.server_peak = self.tree_peak = 0
        self.child_cpu: dict[int, float] = {}  # the CPU seconds each process under the server had when last seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                own = self.proc.memory_info().rss
                tree = own
                for child in self.proc.children(recursive=True):
                    try:
                        tree += child.memory_info().rss
                        t = child.cpu_times()
                        self.child_cpu[child.pid] = t.user + t.system
                    except psutil.Error:
                        pass
                self.server_peak, self.tree_peak = max(self.server_peak, own), max(self.tree_peak, tree)
            except psutil.Error:
                return
            self._stop.wait(self.every_s)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def cpu_seconds(proc: psutil.Process) -> tuple[float, float]:
    """(the server's own CPU seconds, with its ended children's)."""
    t = proc.cpu_times()
    own = t.user + t.system
    return own, own + t.children_user + t.children_system


async def one(client: httpx.AsyncClient, url: str, body: dict) -> tuple[float, float, dict | str]:
    sent = time.time()
    try:
        r = await client.post(url + "/rollout", json=body)
        got = time.time()
        if r.status_code != 200:
            return sent, got, f"http_{r.status_code}"
        return sent, got, r.json()
    except httpx.HTTPError as e:
        return sent, time.time(), type(e).__name__


async def run_level(server: ServerProcess, idle: ServerProcess, policy_url: str, harness: str, n: int, a: argparse.Namespace) -> dict:
    ideal_s = a.calls * a.delay
    proc = psutil.Process(server.proc.pid)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:
        before = lag_buckets((await client.get(server.url + "/metrics")).text)
        idle_before = lag_buckets((await client.get(idle.url + "/metrics")).text)
        bodies = []
        tags = []
        for _ in range(n):
            tag = uuid.uuid4().hex[:10]
            tags.append(tag)
            bodies.append(
                {
                    "harness": harness,
                    "instruction": instruction(tag, a.prompt_kb),
                    "base_url": policy_url,
                    "model": "m",
                    "verify": [f"test $(wc -l < steps.txt) -eq {a.calls - 1}"],
                    "agent_timeout_s": a.agent_timeout,
                }
            )
        load0 = os.getloadavg()[0]
        cpu0 = cpu_seconds(proc)
        with TreeSampler(proc.pid) as sampler:
            t0 = time.time()
            outs = await asyncio.gather(*(one(client, server.url, b) for b in bodies))
            makespan = time.time() - t0
        cpu1 = cpu_seconds(proc)
        load1 = os.getloadavg()[0]
        after_text = (await client.get(server.url + "/metrics")).text
        idle_after = lag_buckets((await client.get(idle.url + "/metrics")).text)
        arrivals = (await client.get(policy_url + "/_arrivals")).json()
    after = lag_buckets(after_text)
    kinds: Counter[str] = Counter()
    examples: dict[str, str] = {}  # one error message per kind, to say what broke
    overhead, first_call, extra = [], [], []
    result_bytes = []
    for tag, (sent, got, res) in zip(tags, outs):
        if isinstance(res, str):
            kinds[res] += 1
            continue
        if res.get("error") or res.get("reward") != 1.0:
            kind = res.get("error_kind") or "reward_not_1"
            kinds[kind] += 1
            examples.setdefault(kind, (res.get("error") or str(res.get("reward_notes")))[:400])
            continue
        kinds["ok"] += 1
        overhead.append(got - sent - ideal_s)
        if arrivals.get(tag):
            first_call.append(min(arrivals[tag]) - sent)
        for turn in res.get("proxy_turns", []):
            if turn.get("purpose") == "policy":
                extra.append(turn["latency_s"] - a.delay)
        result_bytes.append(len(json.dumps(res)))
    ok = kinds.pop("ok", 0)
    return {
        "harness": harness,
        "n": n,
        "ok": ok,
        "failed": dict(kinds),
        "makespan_s": makespan,
        "per_min": 60 * ok / makespan,
        "ideal_per_min": 60 * n / ideal_s,
        "overhead_p50": pct(overhead, 0.5),
        "overhead_p99": pct(overhead, 0.99),
        "first_call_p50": pct(first_call, 0.5),
        "first_call_p99": pct(first_call, 0.99),
        "server_rss_mb": sampler.server_peak / 2**20,
        "server_cpu_s": cpu1[0] - cpu0[0],
        "tree_rss_per_mb": max(0, sampler.tree_peak - sampler.server_peak) / 2**20 / n,
        # Processes the server reaped count in its children's times; those reaped elsewhere (a
        # sandbox's own init) only as last sampled: the larger of the two is the nearer.
        "cpu_per_rollout_s": (cpu1[0] - cpu0[0] + max(cpu1[1] - cpu1[0] - cpu0[1] + cpu0[0], sum(sampler.child_cpu.values()))) / n,
        "lag_p50_ms": 1000 * bucket_quantile(before, after, 0.5),
        "lag_p99_ms": 1000 * bucket_quantile(before, after, 0.99),
        # The same measure in a server with nothing to do, over the same time: the machine's share.
        "idle_lag_p99_ms": 1000 * bucket_quantile(idle_before, idle_after, 0.99),
        "proxy_extra_p50_ms": 1000 * pct(extra, 0.5),
        "proxy_extra_p99_ms": 1000 * pct(extra, 0.99),
        "result_kb": statistics.mean(result_bytes) / 1024 if result_bytes else float("nan"),
        "load": (load0, load1),
        "examples": examples,
    }


HEADER = (
    "| harness | N | ok | failed | rollouts/min (ideal) | overhead p50/p99 s | first call p50/p99 s | server RSS MB | server CPU s "
    "| per rollout: RSS MB, CPU s | loop lag p50/p99 ms (idle server p99) | proxy +ms p50/p99 | load 1m |"
)


def row(r: dict) -> str:
    failed = ", ".join(f"{k} {v}" for k, v in sorted(r["failed"].items())) or "0"
    return (
        f"| {r['harness']} | {r['n']} | {r['ok']} | {failed} | {r['per_min']:.0f} ({r['ideal_per_min']:.0f}) "
        f"| {r['overhead_p50']:.1f} / {r['overhead_p99']:.1f} | {r['first_call_p50']:.1f} / {r['first_call_p99']:.1f} "
        f"| {r['server_rss_mb']:.0f} | {r['server_cpu_s']:.0f} | {r['tree_rss_per_mb']:.1f}, {r['cpu_per_rollout_s']:.2f} "
        f"| {r['lag_p50_ms']:.1f} / {r['lag_p99_ms']:.1f} ({r.get('idle_lag_p99_ms', float('nan')):.1f}) "
        f"| {r['proxy_extra_p50_ms']:.0f} / {r['proxy_extra_p99_ms']:.0f} "
        f"| {r['load'][0]:.1f} -> {r['load'][1]:.1f} |"
    )


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delay", type=float, default=3.0, help="seconds the policy takes per model call (D)")
    ap.add_argument("--calls", type=int, default=6, help="model calls per task (T)")
    ap.add_argument("--prompt-kb", type=int, default=20, help="size of the instruction, so of every prompt")
    ap.add_argument("--agent-timeout", type=float, default=900.0)
    for name, levels in (("whitebox", "16,64,128,256"), ("pi", "8,16,32,64"), ("opencode", "8,16,32,64")):
        ap.add_argument(f"--{name}", default=levels, help=f"concurrency levels for {name} ('' to skip; default {levels})")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("serve_args", nargs="*", help="extra `harness-env serve` flags (after --), e.g. --max-starting 4")
    a = ap.parse_args()
    if a.calls < 1 or a.delay < 0:
        ap.error("--calls must be at least 1 and --delay at least 0")
    plan = [(h, [int(x) for x in getattr(a, h).split(",") if x]) for h in ("whitebox", "pi", "opencode")]
    top = max((n for _, ns in plan for n in ns), default=1)
    print(f"D={a.delay}s T={a.calls} prompt~{a.prompt_kb}KB cpus={os.cpu_count()} serve flags: {' '.join(a.serve_args) or '(defaults)'}", flush=True)
    rows = []
    with scripted_policy(script(a.calls), delay_s=a.delay) as policy_url:
        # One directory for everything the two servers keep (sandboxes, logs, job stores), removed after.
        work = Path(tempfile.mkdtemp(prefix="bench-concurrency-"))
        (work / "busy").mkdir()
        (work / "idle").mkdir()
        server = ServerProcess(work / "busy", "--max-concurrent", str(top), "--max-queue", str(top * 4), *a.serve_args)
        idle = ServerProcess(work / "idle")  # runs nothing: its loop lag is what the machine alone costs
        try:
            print(HEADER, flush=True)
            print("|" + "---|" * (HEADER.count("|") - 1), flush=True)
            for harness, levels in plan:
                if levels:  # warm-up: the endpoint probe, the page cache, Node's compile cache
                    await run_level(server, idle, policy_url, harness, 1, a)
                for n in levels:
                    r = await run_level(server, idle, policy_url, harness, n, a)
                    rows.append(r)
                    print(row(r), flush=True)
                    for kind, message in r["examples"].items():
                        print(f"    {harness} N={n} {kind}: {message}", file=sys.stderr, flush=True)
        finally:
            server.stop()
            idle.stop()
            shutil.rmtree(work, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    # A TERM (a timeout's) ends the run like ^C, so the server and the policy are stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    raise SystemExit(asyncio.run(main()))
