"""Capture proxy overhead, measured side by side in one run against the same local upstream.

    .venv/bin/python bench/proxy.py [--requests 400] [--concurrency 32] [--json FILE]

Three processes: a minimal OpenAI-compatible upstream, the capture proxy (one open session in
transparent_proxy mode, so every call is rewritten, parsed and recorded), and this load generator.
Direct and proxied calls are interleaved in rounds so machine noise hits both alike.

- added latency: the upstream answers at once (non-streaming) or bursts its 34 chunks at once
  (streaming), so what is measured is the proxy's own cost per call, p50 and p99, c=1 and c=N;
- time to first token: the upstream models a 50 ms prefill; ratio proxied/direct;
- throughput at c=N: the upstream models an engine (50 ms prefill, 32 chunks 2 ms apart; the
  non-streaming answer after the same time); ratio of calls per second proxied/direct.

Each translating dialect gets its own streaming cases (added latency, time to first byte): the
proxied call speaks the dialect (`POST /v1/responses`, `POST /v1/messages`, `POST
/v1/models/m:streamGenerateContent`, translated chunk by chunk), the direct one chat completions to
the same upstream.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
DIALECTS = ("responses", "messages", "gemini")  # the translating dialects, each measured against direct chat completions

UPSTREAM = r'''
import asyncio, json, sys, uvicorn
BODY = json.dumps({"id": "x", "object": "chat.completion", "prompt_token_ids": list(range(200)),
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello world"}, "finish_reason": "stop",
    "token_ids": [1, 2], "logprobs": {"content": [{"token": "hello", "logprob": -0.1}, {"token": " world", "logprob": -0.2}]}}]}).encode()
FIRST = ("data: " + json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "prompt_token_ids": list(range(200))}) + "\n\n").encode()
CHUNK = ("data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "tok "}, "token_ids": [7],
    "logprobs": {"content": [{"token": "tok ", "logprob": -0.5}]}}]}) + "\n\n").encode()
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
    # The modelled engine (prefill ms, chunks, ms between chunks), on the first line of the last
    # message: what every dialect passes on to the engine.
    ttft, chunks, gap = json.loads(req["messages"][-1]["content"].split("\n", 1)[0])
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

PROXY = r'''
import asyncio, sys, uvicorn
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.models import Endpoint

async def main():
    proxy = CaptureProxy()
    s = proxy.open_session(Endpoint(base_url=sys.argv[2], api_key="sk-bench", model="m"), CapturePolicy(top_logprobs=0))
    s.turns = _Sink()  # keep memory flat over thousands of calls; recording work still happens
    print(s.key, flush=True)
    cfg = uvicorn.Config(proxy.app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error", access_log=False, lifespan="off")
    await uvicorn.Server(cfg).serve()

class _Sink(list):
    def append(self, item):
        pass

import uvloop  # as under `harness-env serve` (uvicorn picks uvloop when installed)
uvloop.run(main())
'''


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _wait_up(url: str) -> None:
    async with aiohttp.ClientSession() as c:
        for _ in range(200):
            try:
                async with c.get(url):
                    return
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


def _request(api: str, stream: bool, shape: tuple[float, int, float]) -> tuple[str, dict]:
    """The same call in a dialect: its path and body (the modelled engine's shape on the prompt's
    first line)."""
    prompt = json.dumps(shape) + "\n" + "hi " * 50
    if api == "responses":
        return "/responses", {"model": "m", "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}],
                              "tools": [{"type": "function", "name": "bash", "parameters": {"type": "object", "properties": {}}}],
                              "stream": stream, "store": False}
    if api == "gemini":
        return "/models/m:" + ("streamGenerateContent?alt=sse" if stream else "generateContent"), {
            "contents": [{"role": "user", "parts": [{"text": prompt}]}],
            "tools": [{"functionDeclarations": [{"name": "bash", "parametersJsonSchema": {"type": "object", "properties": {}}}]}]}
    if api == "messages":
        return "/messages", {"model": "m", "max_tokens": 1024, "messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
                             "tools": [{"name": "bash", "input_schema": {"type": "object", "properties": {}}}], "stream": stream}
    return "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": prompt}],
                                 "tools": [{"type": "function", "function": {"name": "bash"}}], "stream": stream}


async def _call(client: aiohttp.ClientSession, url: str, key: str, api: str, stream: bool, shape: tuple[float, int, float]) -> tuple[float, float]:
    path, body = _request(api, stream, shape)
    t0 = time.perf_counter()
    ttft = 0.0
    async with client.post(url + path, json=body, headers={"authorization": f"Bearer {key}"}) as r:
        r.raise_for_status()
        first = True
        async for _ in r.content.iter_any():
            if first:
                ttft = time.perf_counter() - t0
                first = False
    return time.perf_counter() - t0, ttft


async def _measure(targets: dict[str, tuple[str, str, str]], *, stream: bool, concurrency: int, n: int, shape: tuple[float, int, float]) -> dict[str, dict[str, float]]:
    """Interleave direct and proxied rounds; per target (url, key, dialect): p50/p99 latency, p50
    TTFT, calls/s."""
    out: dict[str, dict] = {}
    # The load generator must not be the bottleneck: aiohttp on uvloop, as lean as a client gets here.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency * 2)) as client:
        for url, key, api in targets.values():  # warm-up (connections, caches)
            await asyncio.gather(*(_call(client, url, key, api, stream, shape) for _ in range(concurrency)))
        rounds = 4
        per_round = max(concurrency, n // rounds)
        for _ in range(rounds):
            for name, (url, key, api) in targets.items():
                sem = asyncio.Semaphore(concurrency)

                async def one() -> tuple[float, float]:
                    async with sem:
                        return await _call(client, url, key, api, stream, shape)

                t0 = time.perf_counter()
                res = await asyncio.gather(*(one() for _ in range(per_round)))
                d = out.setdefault(name, {"lat": [], "ttft": [], "wall": 0.0, "count": 0})
                d["wall"] += time.perf_counter() - t0
                d["lat"] += [r[0] for r in res]
                d["ttft"] += [r[1] for r in res]
                d["count"] += len(res)
    return {
        name: {
            "p50_ms": statistics.median(d["lat"]) * 1000,
            "p99_ms": _pct(d["lat"], 0.99) * 1000,
            "ttft_p50_ms": statistics.median(d["ttft"]) * 1000,
            "rps": d["count"] / d["wall"],
        }
        for name, d in out.items()
    }


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400, help="calls per target per case")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--dialects", nargs="*", default=list(DIALECTS), choices=DIALECTS, help="the translating dialects to measure")
    args = ap.parse_args()
    N = args.concurrency
    burst, prefill, engine = (0.0, 32, 0.0), (50.0, 32, 0.0), (50.0, 32, 2.0)

    up_port, px_port = _free_port(), _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent)}
    procs = [subprocess.Popen([sys.executable, "-c", UPSTREAM, str(up_port)], env=env)]
    try:
        upstream = f"http://127.0.0.1:{up_port}/v1"
        px = subprocess.Popen([sys.executable, "-c", PROXY, str(px_port), upstream], env=env, stdout=subprocess.PIPE, text=True)
        procs.append(px)
        key = px.stdout.readline().strip()  # type: ignore[union-attr]
        await _wait_up(f"http://127.0.0.1:{up_port}/")
        await _wait_up(f"http://127.0.0.1:{px_port}/")
        proxy_url = f"http://127.0.0.1:{px_port}/v1"
        cases = [
            ("added latency, non-stream", False, 1, burst, "chat"),
            ("added latency, stream", True, 1, burst, "chat"),
            ("added latency, non-stream", False, N, burst, "chat"),
            ("added latency, stream", True, N, burst, "chat"),
            ("ttft, 50 ms prefill", True, 1, prefill, "chat"),
            ("ttft, 50 ms prefill", True, N, prefill, "chat"),
            ("throughput, engine-like", True, N, engine, "chat"),
            ("throughput, engine-like", False, N, engine, "chat"),
        ]
        for api in args.dialects:  # the translating dialects: proxied in their own API, direct in chat completions
            cases += [
                (f"{api}: added latency, stream", True, 1, burst, api),
                (f"{api}: added latency, stream", True, N, burst, api),
                (f"{api}: ttft, 50 ms prefill", True, 1, prefill, api),
                (f"{api}: ttft, 50 ms prefill", True, N, prefill, api),
                (f"{api}: throughput, engine-like", True, N, engine, api),
            ]
        figures = {}
        print(f"{'case':<46}{'direct p50':>11}{'proxy p50':>11}{'added p50':>11}{'direct p99':>11}{'proxy p99':>11}{'ttft x':>8}{'rps x':>8}")
        for title, stream, conc, shape, api in cases:
            targets = {"direct": (upstream, "sk-bench", "chat"), "proxy": (proxy_url, key, api)}
            n = args.requests if conc > 1 else max(100, args.requests // 2)
            m = await _measure(targets, stream=stream, concurrency=conc, n=n, shape=shape)
            d, p = m["direct"], m["proxy"]
            label = f"{title} ({'stream' if stream else 'non-stream'}, c={conc})" if "added" not in title else f"{title}, c={conc}"
            figures[label] = {**m, "added_p50_ms": p["p50_ms"] - d["p50_ms"], "added_p99_ms": p["p99_ms"] - d["p99_ms"],
                              "ttft_ratio": p["ttft_p50_ms"] / d["ttft_p50_ms"], "throughput_ratio": p["rps"] / d["rps"]}
            f = figures[label]
            print(f"{label:<46}{d['p50_ms']:>9.2f}ms{p['p50_ms']:>9.2f}ms{f['added_p50_ms']:>9.2f}ms{d['p99_ms']:>9.2f}ms{p['p99_ms']:>9.2f}ms"
                  f"{f['ttft_ratio']:>8.3f}{f['throughput_ratio']:>8.3f}")
        summary = {
            "added_p50_ms_non_stream_c1": figures["added latency, non-stream, c=1"]["added_p50_ms"],
            "added_p50_ms_stream_c1": figures["added latency, stream, c=1"]["added_p50_ms"],
            "ttft_ratio_c1": figures["ttft, 50 ms prefill (stream, c=1)"]["ttft_ratio"],
            f"ttft_ratio_c{N}": figures[f"ttft, 50 ms prefill (stream, c={N})"]["ttft_ratio"],
            f"throughput_ratio_stream_c{N}": figures[f"throughput, engine-like (stream, c={N})"]["throughput_ratio"],
            f"throughput_ratio_non_stream_c{N}": figures[f"throughput, engine-like (non-stream, c={N})"]["throughput_ratio"],
        }
        targets_ok = {"added_p50_ms_non_stream_c1": ("<", 1.0), "added_p50_ms_stream_c1": ("<", 1.0), "ttft_ratio_c1": ("<=", 1.05),
                      f"ttft_ratio_c{N}": ("<=", 1.05), f"throughput_ratio_stream_c{N}": (">=", 0.8), f"throughput_ratio_non_stream_c{N}": (">=", 0.8)}
        for api in args.dialects:
            for name, label, figure, target in (
                ("added_p50_ms_stream_c1", "added latency, stream, c=1", "added_p50_ms", ("<", 1.0)),
                ("ttft_ratio_c1", "ttft, 50 ms prefill (stream, c=1)", "ttft_ratio", ("<=", 1.05)),
                (f"ttft_ratio_c{N}", f"ttft, 50 ms prefill (stream, c={N})", "ttft_ratio", ("<=", 1.05)),
                (f"throughput_ratio_stream_c{N}", f"throughput, engine-like (stream, c={N})", "throughput_ratio", (">=", 0.8)),
            ):
                summary[f"{api}_{name}"] = figures[f"{api}: {label}"][figure]
                targets_ok[f"{api}_{name}"] = target
        print()
        for k, v in summary.items():
            op, bound = targets_ok[k]
            ok = v < bound if op == "<" else v <= bound if op == "<=" else v >= bound
            print(f"{k:<40}{v:>10.3f}   target {op} {bound}: {'met' if ok else 'NOT met'}")
        if args.json:
            Path(args.json).write_text(json.dumps({"figures": figures, "summary": summary}, indent=2))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)
    return 0


if __name__ == "__main__":
    import uvloop

    raise SystemExit(uvloop.run(main()))
