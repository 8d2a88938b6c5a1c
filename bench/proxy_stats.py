"""The load generator of bench/proxy.py and its figures: the calls each dialect makes, targets
measured in interleaved rounds, latency percentiles and each process's CPU per call (from /proc).

Every call's body differs from every other's (a sequence number at the end of its prompt): the
proxy answers a request equal to one it answered already from its record (a harness's retry,
core/capture/retries.py), so equal bodies would measure that, not a model call.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import time
from pathlib import Path

import aiohttp

from bench.proxy_servers import Target

Shape = tuple[float, int, float, int]  # prefill ms, chunks, ms between chunks, prompt token ids in the answer
Body = tuple[str, bytes, bytes]  # path, and the body before and after the call's sequence number
SEQ = "@@SEQ@@"  # where a call's sequence number goes in its body (in the prompt's text)
_seq = itertools.count()


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def body_of(path: str, body: dict) -> Body:
    """`body` encoded once, split where its SEQ marker is: the load generator's own cost stays small."""
    head, tail = json.dumps(body).encode().split(SEQ.encode())
    return path, head, tail


def request(api: str, stream: bool, shape: Shape, prompt_bytes: int) -> Body:
    """The same call in a dialect: its path and body (the modelled engine's shape on the prompt's
    first line)."""
    prompt = json.dumps(shape) + "\n" + "hi " * max(50, prompt_bytes // 3) + SEQ
    if api == "responses":
        return body_of(
            "/responses",
            {
                "model": "m",
                "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}],
                "tools": [{"type": "function", "name": "bash", "parameters": {"type": "object", "properties": {}}}],
                "stream": stream,
                "store": False,
            },
        )
    if api == "gemini":
        return body_of(
            "/models/m:" + ("streamGenerateContent?alt=sse" if stream else "generateContent"),
            {
                "contents": [{"role": "user", "parts": [{"text": prompt}]}],
                "tools": [{"functionDeclarations": [{"name": "bash", "parametersJsonSchema": {"type": "object", "properties": {}}}]}],
            },
        )
    if api == "messages":
        return body_of(
            "/messages",
            {
                "model": "m",
                "max_tokens": 1024,
                "messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
                "tools": [{"name": "bash", "input_schema": {"type": "object", "properties": {}}}],
                "stream": stream,
            },
        )
    return body_of(
        "/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": prompt}], "tools": [{"type": "function", "function": {"name": "bash"}}], "stream": stream},
    )


async def call(client: aiohttp.ClientSession, url: str, key: str, body: Body) -> tuple[float, float]:
    path, head, tail = body
    data = head + str(next(_seq)).encode() + tail
    t0 = time.perf_counter()
    ttft = 0.0
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    async with client.post(url + path, data=data, headers=headers) as r:
        r.raise_for_status()
        first = True
        async for _ in r.content.iter_any():
            if first:
                ttft = time.perf_counter() - t0
                first = False
    return time.perf_counter() - t0, ttft


async def measure(
    targets: dict[str, Target],
    *,
    stream: bool,
    concurrency: int,
    n: int,
    shape: Shape = (0.0, 0, 0.0, 0),
    prompt_bytes: int = 0,
    bodies: dict[str, Body] | None = None,
    rounds: int = 4,
) -> dict[str, dict[str, float]]:
    """Interleave the targets' rounds; per target: p50/p99 latency, p50 TTFT, calls/s, and the CPU
    its process used per call during its own rounds. `bodies`: each target's call, if not the
    modelled engine's `request`."""
    out: dict[str, dict] = {}
    turn = 0
    # The load generator must not be the bottleneck: aiohttp on uvloop, as lean as a client gets here.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency * 2)) as client:
        bodies = bodies or {name: request(api, stream, shape, prompt_bytes) for name, (_, _, api, _) in targets.items()}

        def one_call(name: str) -> asyncio.Future:
            nonlocal turn
            url, keys, _, _ = targets[name]
            turn += 1
            return call(client, url, keys[turn % len(keys)], bodies[name])

        for name in targets:  # warm-up (connections, caches)
            await asyncio.gather(*(one_call(name) for _ in range(concurrency)))
        per_round = max(concurrency, n // rounds)
        for _ in range(rounds):
            for name, (_, _, _, pid) in targets.items():
                sem = asyncio.Semaphore(concurrency)

                async def one(name: str = name, sem: asyncio.Semaphore = sem) -> tuple[float, float]:
                    async with sem:
                        return await one_call(name)

                cpu0 = cpu_s(pid) if pid else 0.0
                t0 = time.perf_counter()
                res = await asyncio.gather(*(one() for _ in range(per_round)))
                d = out.setdefault(name, {"lat": [], "ttft": [], "wall": 0.0, "count": 0, "cpu": 0.0})
                d["wall"] += time.perf_counter() - t0
                d["cpu"] += (cpu_s(pid) - cpu0) if pid else 0.0
                d["lat"] += [r[0] for r in res]
                d["ttft"] += [r[1] for r in res]
                d["count"] += len(res)
    return {
        name: {
            "p50_ms": statistics.median(d["lat"]) * 1000,
            "p99_ms": pct(d["lat"], 0.99) * 1000,
            "ttft_p50_ms": statistics.median(d["ttft"]) * 1000,
            "rps": d["count"] / d["wall"],
            "cpu_ms_per_call": d["cpu"] / d["count"] * 1000 if targets[name][3] else float("nan"),  # no pid: not counted
        }
        for name, d in out.items()
    }


def label(title: str, stream: bool, concurrency: int) -> str:
    return f"{title}, c={concurrency}" if "added" in title else f"{title} ({'stream' if stream else 'non-stream'}, c={concurrency})"


def check(value: float, op: str, bound: float) -> bool:
    return value < bound if op == "<" else value <= bound if op == "<=" else value >= bound


HEADER = f"{'case':<50}{'target':<16}{'p50':>9}{'added p50':>11}{'added p99':>11}{'ttft x':>8}{'rps x':>8}{'cpu/call':>10}{'upstream cpu/call':>19}"


def row(figures: dict[str, dict], name: str, case: str, d: dict[str, float], p: dict[str, float]) -> None:
    """A proxied target's figures against the direct ones of the same rounds: kept and printed."""
    f = figures.setdefault(name, {})[case] = {
        "direct": d,
        "proxy": p,
        "added_p50_ms": p["p50_ms"] - d["p50_ms"],
        "added_p99_ms": p["p99_ms"] - d["p99_ms"],
        "ttft_ratio": p["ttft_p50_ms"] / d["ttft_p50_ms"],
        "throughput_ratio": p["rps"] / d["rps"],
        "cpu_ms_per_call": p["cpu_ms_per_call"],
    }
    print(
        f"{case:<50}{name:<16}{p['p50_ms']:>7.2f}ms{f['added_p50_ms']:>9.2f}ms{f['added_p99_ms']:>9.2f}ms"
        f"{f['ttft_ratio']:>8.3f}{f['throughput_ratio']:>8.3f}{p['cpu_ms_per_call']:>8.2f}ms{d['cpu_ms_per_call']:>17.2f}ms",
        flush=True,
    )
