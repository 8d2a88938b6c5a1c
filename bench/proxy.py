"""Capture proxy overhead, measured side by side in one run against the same local upstream.

    .venv/bin/python bench/proxy.py [--requests 400] [--concurrency 32] [--json FILE]
        [--only-realistic] [--only CASE] [--baseline-commit REV] [--bare-relay] [--profile FILE]
        [--vllm | --vllm-port PORT] [--only-vllm] [--vllm-concurrency 8] [--vllm-rounds 4]

Three processes: a minimal OpenAI-compatible upstream, the capture proxy (in transparent_proxy
mode, so every call is rewritten, parsed and recorded), and this load generator, all on this
machine. Direct and proxied calls are interleaved in rounds so machine noise hits both alike.
`--baseline-commit REV` adds a fourth: the proxy of an earlier commit (from `git archive`), measured
in the same rounds, so before and after come from one run. `--bare-relay` adds a relay on the same
stack that only passes bytes on (nothing parsed, rewritten, masked or recorded): the floor a
Python relay on uvicorn, uvloop and aiohttp has on this machine.

- added latency: the upstream answers at once (non-streaming) or bursts its 34 chunks at once
  (streaming), so what is measured is the proxy's own cost per call, p50 and p99, c=1 and c=N;
- time to first token: the upstream models a 50 ms prefill; ratio proxied/direct;
- throughput at c=N: the upstream models an engine (50 ms prefill, 32 chunks 2 ms apart; the
  non-streaming answer after the same time); ratio of calls per second proxied/direct.

Each translating dialect gets its own streaming cases (added latency, time to first byte): the
proxied call speaks the dialect (`POST /v1/responses`, `POST /v1/messages`, `POST
/v1/models/m:streamGenerateContent`, translated chunk by chunk), the direct one chat completions to
the same upstream.

The realistic cases ("real:") are what a training run gives the proxy: 64 open sessions (calls go
round robin over their keys), every turn recorded (a session's turns are cleared after 40, as if
its rollout ended and a new one began), 16 KB prompts with their ~4,000 prompt token ids in every
answer (first chunk when streaming), completion ids and logprobs per chunk. For each case the
proxy's CPU time per call (from /proc, over its rounds only) is printed, next to the upstream's
in the direct rounds, and the proxy's peak RSS at the end.

The real-engine cases ("vllm:", with `--vllm`, `--vllm-port PORT` or `--only-vllm`) call a real
vLLM (tests/vllm_engine.py; the one on PORT, or one started for the run) directly and through its
own capture proxy, interleaved in rounds: whole and streamed, c=1 and c=8, 24 greedy tokens per
call. The direct calls ask for what the proxy adds (logprobs, return_token_ids), so both sides
make the engine do the same work; the engine's time dominates every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
DIALECTS = ("responses", "messages", "gemini")  # the translating dialects, each measured against direct chat completions

UPSTREAM = r'''
import asyncio, functools, json, sys, uvicorn

@functools.lru_cache(maxsize=None)
def answers(n_ids):
    """The whole answer and the first stream chunk, with `n_ids` prompt token ids (made once)."""
    ids = list(range(1000, 1000 + n_ids))
    dumps = functools.partial(json.dumps, separators=(",", ":"))  # compact, as vLLM writes its answers and chunks
    body = dumps({"id": "x", "object": "chat.completion", "prompt_token_ids": ids,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello world"}, "finish_reason": "stop",
        "token_ids": [1, 2], "logprobs": {"content": [{"token": "hello", "logprob": -0.1}, {"token": " world", "logprob": -0.2}]}}]}).encode()
    first = ("data: " + dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "prompt_token_ids": ids}) + "\n\n").encode()
    return body, first

CHUNK = ("data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "tok "}, "token_ids": [7],
    "logprobs": {"content": [{"token": "tok ", "logprob": -0.5}]}}]}, separators=(",", ":")) + "\n\n").encode()
LAST = b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    if not body:  # readiness probe
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    req = json.loads(body)
    # The modelled engine (prefill ms, chunks, ms between chunks, prompt ids), on the first line
    # of the last message: what every dialect passes on to the engine.
    ttft, chunks, gap, n_ids = json.loads(req["messages"][-1]["content"].split("\n", 1)[0])
    BODY, FIRST = answers(n_ids)
    if not req.get("stream"):
        if ttft or gap:
            await asyncio.sleep((ttft + chunks * gap) / 1000)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": BODY})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    if ttft:
        await asyncio.sleep(ttft / 1000)
    await send({"type": "http.response.body", "body": FIRST, "more_body": True})
    for _ in range(chunks):
        if gap:
            await asyncio.sleep(gap / 1000)
        await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
    await send({"type": "http.response.body", "body": LAST})

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error", access_log=False)
'''

PROXY = r"""
import asyncio, contextlib, cProfile, signal, sys, time, uvicorn
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.models import Endpoint

TURNS_PER_ROLLOUT = 40

def clear_after(box):
    # Every turn is recorded; a session's turns are dropped once it has TURNS_PER_ROLLOUT, as if its
    # rollout had ended and a new one begun, so memory stays what 64 rollouts in flight hold.
    def on_turn(turn):
        if len(box[0].turns) >= TURNS_PER_ROLLOUT:
            box[0].turns.clear()
    return on_turn

async def main():
    proxy = CaptureProxy()
    keys = []
    for _ in range(int(sys.argv[3])):
        box = []
        box.append(proxy.open_session(Endpoint(base_url=sys.argv[2], api_key="sk-bench", model=sys.argv[4]), CapturePolicy(top_logprobs=0),
                                      on_turn=clear_after(box)))
        keys.append(box[0].key)
    print(" ".join(keys), flush=True)
    cfg = uvicorn.Config(proxy.app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error", access_log=False, lifespan="off")
    server = Server(cfg)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: setattr(server, "should_exit", True))
    profile = cProfile.Profile(time.process_time) if len(sys.argv) > 5 else None  # CPU time: wall time would count the upstream running while a write wakes it
    if profile is not None:  # --profile: cProfile of the whole proxy process, written when it stops
        profile.enable()
    try:
        await server.serve()
    finally:
        if profile is not None:
            profile.disable()
            profile.dump_stats(sys.argv[5])
        await proxy.aclose()

class Server(uvicorn.Server):  # stops on SIGTERM without re-raising it, so the proxy closes and the profile is written
    capture_signals = contextlib.nullcontext

import uvloop  # as under `harness-env serve` (uvicorn picks uvloop when installed)
uvloop.run(main())
"""

BARE_RELAY = r"""
# The floor for a relay on the proxy's stack (uvicorn + uvloop + aiohttp): bytes in, bytes out,
# nothing parsed, rewritten, masked or recorded. Only for measuring.
import asyncio, sys, aiohttp, uvicorn

async def main():
    client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024), auto_decompress=False, skip_auto_headers=("User-Agent",))
    upstream = sys.argv[2]

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            m = await receive()
            chunks.append(m.get("body", b""))
            if not m.get("more_body"):
                break
        path = scope["path"][len("/v1"):] if scope["path"].startswith("/v1") else scope["path"]
        if not chunks[0]:  # readiness probe
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        async with client.post(upstream + path, data=b"".join(chunks), headers={"content-type": "application/json", "authorization": "Bearer sk-bench"}) as r:
            await send({"type": "http.response.start", "status": r.status, "headers": [(b"content-type", r.headers.get("content-type", "").encode())]})
            async for piece in r.content.iter_any():
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    print("bare", flush=True)
    cfg = uvicorn.Config(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error", access_log=False, lifespan="off")
    await uvicorn.Server(cfg).serve()

import uvloop
uvloop.run(main())
"""

Shape = tuple[float, int, float, int]  # prefill ms, chunks, ms between chunks, prompt token ids in the answer


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _wait_up(url: str) -> None:
    async with aiohttp.ClientSession() as c:
        for _ in range(200):
            try:
                async with c.get(url):
                    return
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


def _request(api: str, stream: bool, shape: Shape, prompt_bytes: int) -> tuple[str, bytes]:
    """The same call in a dialect: its path and body (the modelled engine's shape on the prompt's
    first line)."""
    prompt = json.dumps(shape) + "\n" + "hi " * max(50, prompt_bytes // 3)
    if api == "responses":
        path, body = (
            "/responses",
            {
                "model": "m",
                "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}],
                "tools": [{"type": "function", "name": "bash", "parameters": {"type": "object", "properties": {}}}],
                "stream": stream,
                "store": False,
            },
        )
    elif api == "gemini":
        path, body = (
            "/models/m:" + ("streamGenerateContent?alt=sse" if stream else "generateContent"),
            {
                "contents": [{"role": "user", "parts": [{"text": prompt}]}],
                "tools": [{"functionDeclarations": [{"name": "bash", "parametersJsonSchema": {"type": "object", "properties": {}}}]}],
            },
        )
    elif api == "messages":
        path, body = (
            "/messages",
            {
                "model": "m",
                "max_tokens": 1024,
                "messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
                "tools": [{"name": "bash", "input_schema": {"type": "object", "properties": {}}}],
                "stream": stream,
            },
        )
    else:
        path, body = (
            "/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": prompt}], "tools": [{"type": "function", "function": {"name": "bash"}}], "stream": stream},
        )
    return path, json.dumps(body).encode()  # encoded once: the load generator's own cost stays small


async def _call(client: aiohttp.ClientSession, url: str, key: str, path: str, body: bytes) -> tuple[float, float]:
    t0 = time.perf_counter()
    ttft = 0.0
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    async with client.post(url + path, data=body, headers=headers) as r:
        r.raise_for_status()
        first = True
        async for _ in r.content.iter_any():
            if first:
                ttft = time.perf_counter() - t0
                first = False
    return time.perf_counter() - t0, ttft


Target = tuple[str, list[str], str, int | None]  # base URL, keys (round robin), dialect, pid whose CPU is counted


async def _measure(
    targets: dict[str, Target],
    *,
    stream: bool,
    concurrency: int,
    n: int,
    shape: Shape = (0.0, 0, 0.0, 0),
    prompt_bytes: int = 0,
    bodies: dict[str, tuple[str, bytes]] | None = None,
    rounds: int = 4,
) -> dict[str, dict[str, float]]:
    """Interleave the targets' rounds; per target: p50/p99 latency, p50 TTFT, calls/s, and the CPU
    its process used per call during its own rounds. `bodies`: each target's path and body, if not
    the modelled engine's `_request`."""
    out: dict[str, dict] = {}
    turn = 0
    # The load generator must not be the bottleneck: aiohttp on uvloop, as lean as a client gets here.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency * 2)) as client:
        bodies = bodies or {name: _request(api, stream, shape, prompt_bytes) for name, (_, _, api, _) in targets.items()}

        def call(name: str) -> asyncio.Future:
            nonlocal turn
            url, keys, _, _ = targets[name]
            turn += 1
            return _call(client, url, keys[turn % len(keys)], *bodies[name])

        for name in targets:  # warm-up (connections, caches)
            await asyncio.gather(*(call(name) for _ in range(concurrency)))
        per_round = max(concurrency, n // rounds)
        for _ in range(rounds):
            for name, (_, _, _, pid) in targets.items():
                sem = asyncio.Semaphore(concurrency)

                async def one(name: str = name, sem: asyncio.Semaphore = sem) -> tuple[float, float]:
                    async with sem:
                        return await call(name)

                cpu0 = _cpu_s(pid) if pid else 0.0
                t0 = time.perf_counter()
                res = await asyncio.gather(*(one() for _ in range(per_round)))
                d = out.setdefault(name, {"lat": [], "ttft": [], "wall": 0.0, "count": 0, "cpu": 0.0})
                d["wall"] += time.perf_counter() - t0
                d["cpu"] += (_cpu_s(pid) - cpu0) if pid else 0.0
                d["lat"] += [r[0] for r in res]
                d["ttft"] += [r[1] for r in res]
                d["count"] += len(res)
    return {
        name: {
            "p50_ms": statistics.median(d["lat"]) * 1000,
            "p99_ms": _pct(d["lat"], 0.99) * 1000,
            "ttft_p50_ms": statistics.median(d["ttft"]) * 1000,
            "rps": d["count"] / d["wall"],
            "cpu_ms_per_call": d["cpu"] / d["count"] * 1000,
        }
        for name, d in out.items()
    }


def _baseline_tree(rev: str, into: str) -> str:
    """The package as of `rev` (git archive), importable from `into` as harness_env."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--prefix=harness_env/", rev], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def _label(title: str, stream: bool, concurrency: int) -> str:
    return f"{title}, c={concurrency}" if "added" in title else f"{title} ({'stream' if stream else 'non-stream'}, c={concurrency})"


def _check(value: float, op: str, bound: float) -> bool:
    return value < bound if op == "<" else value <= bound if op == "<=" else value >= bound


async def _start_proxy(procs: list[subprocess.Popen], tree: str, upstream: str, sessions: int, model: str, profile: list[str]) -> Target:
    """The capture proxy (transparent_proxy, `sessions` open) in a process of its own, relaying to `upstream`."""
    port = _free_port()
    px = subprocess.Popen(
        [sys.executable, "-c", PROXY, str(port), upstream, str(sessions), model, *profile],
        env={**os.environ, "PYTHONPATH": tree},
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(px)
    keys = px.stdout.readline().split()  # type: ignore[union-attr]
    await _wait_up(f"http://127.0.0.1:{port}/")
    return (f"http://127.0.0.1:{port}/v1", keys, "chat", px.pid)


# The real engine: short completions (it decodes 25-34 tokens/s on these 2 cores), greedy so every
# call samples the same tokens, a prompt the model does not answer in fewer.
VLLM_PROMPT = "Write a long story about a lighthouse keeper and the sea."
VLLM_MAX_TOKENS = 24


@contextlib.contextmanager
def _vllm(port: int | None) -> Iterator[tuple[str, str]]:
    """A real vLLM's base URL and served model: the one running on `port`, or one started here
    (tests/vllm_engine.py) for the run."""
    sys.path.insert(0, str(ROOT))
    from tests.vllm_engine import SERVED_NAME, VllmServer

    if port:
        yield f"http://127.0.0.1:{port}/v1", SERVED_NAME
        return
    with VllmServer() as server:
        yield server.base_url, server.model


def _vllm_bodies(model: str, stream: bool) -> dict[str, tuple[str, bytes]]:
    """The same call both ways; direct, it asks vLLM for what the proxy adds to the proxied one
    (logprobs and return_token_ids; top_logprobs 0 is not sent)."""
    body = {"model": model, "messages": [{"role": "user", "content": VLLM_PROMPT}], "max_tokens": VLLM_MAX_TOKENS, "temperature": 0, "stream": stream}
    return {
        "direct": ("/chat/completions", json.dumps({**body, "logprobs": True, "return_token_ids": True}).encode()),
        "proxy": ("/chat/completions", json.dumps(body).encode()),
    }


async def _vllm_cases(args: argparse.Namespace, procs: list[subprocess.Popen], figures: dict[str, dict]) -> None:
    """Direct and proxied calls to a real vLLM, interleaved in rounds: whole and streamed, c=1 and
    c=--vllm-concurrency. The engine dominates: what is left is the proxy's share of each call."""
    with _vllm(args.vllm_port) as (base_url, model):
        await _wait_up(base_url + "/models")
        proxy = await _start_proxy(procs, str(ROOT.parent), base_url, 1, model, [])
        targets: dict[str, Target] = {"direct": (base_url, ["sk-bench"], "chat", None), "proxy": proxy}
        for conc in (1, args.vllm_concurrency):
            for stream in (False, True):
                n = args.vllm_rounds * (3 if conc == 1 else 2 * conc)
                m = await _measure(targets, stream=stream, concurrency=conc, n=n, bodies=_vllm_bodies(model, stream), rounds=args.vllm_rounds)
                _row(figures, "vllm proxy", _label("vllm: added latency, " + ("stream" if stream else "non-stream"), stream, conc), m["direct"], m["proxy"])
        print(
            f"\nvllm proxy: peak RSS {_peak_rss_mb(proxy[3]):.0f} MB; {VLLM_MAX_TOKENS} tokens per call from {base_url} "
            "(shared: other work may call this engine too)"
        )


def _row(figures: dict[str, dict], name: str, label: str, d: dict[str, float], p: dict[str, float]) -> None:
    """A proxied target's figures against the direct ones of the same rounds: kept and printed."""
    f = figures.setdefault(name, {})[label] = {
        "direct": d,
        "proxy": p,
        "added_p50_ms": p["p50_ms"] - d["p50_ms"],
        "added_p99_ms": p["p99_ms"] - d["p99_ms"],
        "ttft_ratio": p["ttft_p50_ms"] / d["ttft_p50_ms"],
        "throughput_ratio": p["rps"] / d["rps"],
        "cpu_ms_per_call": p["cpu_ms_per_call"],
    }
    print(
        f"{label:<50}{name:<16}{p['p50_ms']:>7.2f}ms{f['added_p50_ms']:>9.2f}ms{f['added_p99_ms']:>9.2f}ms"
        f"{f['ttft_ratio']:>8.3f}{f['throughput_ratio']:>8.3f}{p['cpu_ms_per_call']:>8.2f}ms{d['cpu_ms_per_call']:>17.2f}ms"
    )


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400, help="calls per target per case")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--sessions", type=int, default=64, help="open capture sessions in the proxy (realistic cases)")
    ap.add_argument("--prompt-kb", type=int, default=16, help="prompt size of the realistic cases")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--dialects", nargs="*", default=list(DIALECTS), choices=DIALECTS, help="the translating dialects to measure")
    ap.add_argument("--only-realistic", action="store_true", help="only the realistic cases (64 sessions, 16 KB prompts)")
    ap.add_argument("--baseline-commit", help="also run the proxy of this commit, side by side (before/after in one run)")
    ap.add_argument("--only", help="only the cases whose title contains this (for profiling one case)")
    ap.add_argument("--bare-relay", action="store_true", help="also measure a relay that only passes bytes on (the stack's floor)")
    ap.add_argument("--profile", help="write a cProfile of each proxy process to FILE.<target> (costs time: not for figures)")
    ap.add_argument("--vllm", action="store_true", help="also measure against a real vLLM, started for the run (tests/vllm_engine.py)")
    ap.add_argument("--vllm-port", type=int, help="also measure against the real vLLM running on this port (implies --vllm)")
    ap.add_argument("--only-vllm", action="store_true", help="only the real-vLLM cases (implies --vllm)")
    ap.add_argument("--vllm-concurrency", type=int, default=8)
    ap.add_argument("--vllm-rounds", type=int, default=4, help="rounds per real-vLLM case (3 calls per target a round at c=1, 2 x concurrency at c=N)")
    args = ap.parse_args()
    N = args.concurrency
    prompt_bytes = args.prompt_kb * 1024
    real_ids = prompt_bytes // 4  # about 4 bytes of text per token
    burst, prefill, engine = (0.0, 32, 0.0, 200), (50.0, 32, 0.0, 200), (50.0, 32, 2.0, 200)
    real_burst, real_engine = (0.0, 32, 0.0, real_ids), (50.0, 32, 2.0, real_ids)

    up_port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent)}
    procs = [subprocess.Popen([sys.executable, "-c", UPSTREAM, str(up_port)], env=env)]
    tmp = tempfile.mkdtemp(prefix="bench-proxy-")
    try:
        upstream = f"http://127.0.0.1:{up_port}/v1"
        proxies: dict[str, Target] = {}
        trees = {} if args.only_vllm else {"proxy": str(ROOT.parent)}
        if args.baseline_commit and not args.only_vllm:
            trees[f"base {args.baseline_commit}"] = _baseline_tree(args.baseline_commit, tmp)
        for name, tree in trees.items():
            profile = [f"{args.profile}.{name.split()[0]}"] if args.profile else []
            proxies[name] = await _start_proxy(procs, tree, upstream, args.sessions, "m", profile)
        if args.bare_relay and not args.only_vllm:
            port = _free_port()
            px = subprocess.Popen([sys.executable, "-c", BARE_RELAY, str(port), upstream], env=env, stdout=subprocess.PIPE, text=True)
            procs.append(px)
            px.stdout.readline()  # type: ignore[union-attr]
            await _wait_up(f"http://127.0.0.1:{port}/")
            proxies["bare relay"] = (f"http://127.0.0.1:{port}/v1", ["-"] * args.sessions, "chat", px.pid)
        await _wait_up(f"http://127.0.0.1:{up_port}/")
        # (title, stream, concurrency, shape, dialect, sessions, prompt bytes)
        cases: list[tuple[str, bool, int, Shape, str, int, int]] = []
        if not args.only_realistic:
            cases += [
                ("added latency, non-stream", False, 1, burst, "chat", 1, 0),
                ("added latency, stream", True, 1, burst, "chat", 1, 0),
                ("added latency, non-stream", False, N, burst, "chat", 1, 0),
                ("added latency, stream", True, N, burst, "chat", 1, 0),
                ("ttft, 50 ms prefill", True, 1, prefill, "chat", 1, 0),
                ("ttft, 50 ms prefill", True, N, prefill, "chat", 1, 0),
                ("throughput, engine-like", True, N, engine, "chat", 1, 0),
                ("throughput, engine-like", False, N, engine, "chat", 1, 0),
            ]
            for api in args.dialects:  # the translating dialects: proxied in their own API, direct in chat completions
                cases += [
                    (f"{api}: added latency, stream", True, 1, burst, api, 1, 0),
                    (f"{api}: added latency, stream", True, N, burst, api, 1, 0),
                    (f"{api}: ttft, 50 ms prefill", True, 1, prefill, api, 1, 0),
                    (f"{api}: ttft, 50 ms prefill", True, N, prefill, api, 1, 0),
                    (f"{api}: throughput, engine-like", True, N, engine, api, 1, 0),
                ]
        S = args.sessions
        cases += [
            ("real: added latency, non-stream", False, 1, real_burst, "chat", S, prompt_bytes),
            ("real: added latency, stream", True, 1, real_burst, "chat", S, prompt_bytes),
            ("real: ttft, streaming engine", True, 1, real_engine, "chat", S, prompt_bytes),
            ("real: ttft, streaming engine", True, N, real_engine, "chat", S, prompt_bytes),
            ("real: throughput, streaming engine", True, N, real_engine, "chat", S, prompt_bytes),
            ("real: throughput, engine-like", False, N, real_engine, "chat", S, prompt_bytes),
        ]
        if args.only_vllm:
            cases = []
        if args.only:
            cases = [c for c in cases if args.only in _label(c[0], c[1], c[2])]
        figures: dict[str, dict] = {}
        print(f"{'case':<50}{'target':<16}{'p50':>9}{'added p50':>11}{'added p99':>11}{'ttft x':>8}{'rps x':>8}{'cpu/call':>10}{'upstream cpu/call':>19}")
        for title, stream, conc, shape, api, sessions, pbytes in cases:
            # The upstream's CPU per call in the direct rounds: what serving the same bytes costs a
            # minimal ASGI app, a floor for a relay that must also read them.
            targets: dict[str, Target] = {"direct": (upstream, ["sk-bench"], "chat", procs[0].pid)}
            targets.update(
                {name: (url, keys[:sessions], api, pid) for name, (url, keys, _, pid) in proxies.items() if api == "chat" or name != "bare relay"}
            )  # the bare relay speaks only chat completions
            n = args.requests if conc > 1 else max(100, args.requests // 2)
            m = await _measure(targets, stream=stream, concurrency=conc, n=n, shape=shape, prompt_bytes=pbytes)
            d = m["direct"]
            label = _label(title, stream, conc)
            for name in proxies:
                if name not in m:
                    continue
                _row(figures, name, label, d, m[name])
        checks = [  # (summary name, case label, figure, op, bound)
            ("real_added_p50_ms_non_stream_c1", "real: added latency, non-stream, c=1", "added_p50_ms", "<", 1.0),
            ("real_added_p50_ms_stream_c1", "real: added latency, stream, c=1", "added_p50_ms", "<", 1.0),
            ("real_ttft_ratio_c1", "real: ttft, streaming engine (stream, c=1)", "ttft_ratio", "<=", 1.05),
            (f"real_ttft_ratio_c{N}", f"real: ttft, streaming engine (stream, c={N})", "ttft_ratio", "<=", 1.05),
            (f"real_throughput_ratio_stream_c{N}", f"real: throughput, streaming engine (stream, c={N})", "throughput_ratio", ">=", 0.8),
            (f"real_throughput_ratio_non_stream_c{N}", f"real: throughput, engine-like (non-stream, c={N})", "throughput_ratio", ">=", 0.8),
            ("real_cpu_ms_per_call_non_stream_c1", "real: added latency, non-stream, c=1", "cpu_ms_per_call", "<", 1.0),
            ("real_cpu_ms_per_call_stream_c1", "real: added latency, stream, c=1", "cpu_ms_per_call", "<", 1.0),
        ]
        if not args.only_realistic:
            checks += [
                ("added_p50_ms_non_stream_c1", "added latency, non-stream, c=1", "added_p50_ms", "<", 1.0),
                ("added_p50_ms_stream_c1", "added latency, stream, c=1", "added_p50_ms", "<", 1.0),
                ("ttft_ratio_c1", "ttft, 50 ms prefill (stream, c=1)", "ttft_ratio", "<=", 1.05),
                (f"ttft_ratio_c{N}", f"ttft, 50 ms prefill (stream, c={N})", "ttft_ratio", "<=", 1.05),
                (f"throughput_ratio_stream_c{N}", f"throughput, engine-like (stream, c={N})", "throughput_ratio", ">=", 0.8),
                (f"throughput_ratio_non_stream_c{N}", f"throughput, engine-like (non-stream, c={N})", "throughput_ratio", ">=", 0.8),
            ]
            for api in args.dialects:
                checks += [
                    (f"{api}_added_p50_ms_stream_c1", f"{api}: added latency, stream, c=1", "added_p50_ms", "<", 1.0),
                    (f"{api}_ttft_ratio_c1", f"{api}: ttft, 50 ms prefill (stream, c=1)", "ttft_ratio", "<=", 1.05),
                    (f"{api}_ttft_ratio_c{N}", f"{api}: ttft, 50 ms prefill (stream, c={N})", "ttft_ratio", "<=", 1.05),
                    (f"{api}_throughput_ratio_stream_c{N}", f"{api}: throughput, engine-like (stream, c={N})", "throughput_ratio", ">=", 0.8),
                ]
        if args.vllm or args.vllm_port or args.only_vllm:
            await _vllm_cases(args, procs, figures)
        summary: dict[str, dict[str, float]] = {}
        for name, (_, _, _, pid) in proxies.items():
            if name == "bare relay":
                continue
            print(f"\n{name}: peak RSS {_peak_rss_mb(pid):.0f} MB ({args.sessions} sessions, up to 40 recorded turns each)")
            summary[name] = {"peak_rss_mb": _peak_rss_mb(pid)}
            for key, label, figure, op, bound in checks:
                if label not in figures[name]:
                    continue
                v = summary[name][key] = figures[name][label][figure]
                print(f"{key:<44}{v:>10.3f}   target {op} {bound}: {'met' if _check(v, op, bound) else 'NOT met'}")
        if args.json:
            Path(args.json).write_text(json.dumps({"figures": figures, "summary": summary}, indent=2))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    import uvloop

    raise SystemExit(uvloop.run(main()))
