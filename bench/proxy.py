"""Capture proxy overhead, measured side by side in one run against the same local upstream.

    .venv/bin/python bench/proxy.py [--requests 400] [--concurrency 32] [--json FILE]
        [--only-realistic] [--only CASE] [--baseline-commit REV] [--tree NAME=DIR] [--bare-relay] [--kernel-relay] [--openenv]
        [--profile FILE] [--vllm | --vllm-port PORT] [--only-vllm] [--vllm-concurrency 8] [--vllm-rounds 4]

Three processes: a minimal OpenAI-compatible upstream, the capture proxy (in transparent_proxy
mode, so every call is rewritten, parsed and recorded), and this load generator, all on this
machine. Direct and proxied calls are interleaved in rounds so machine noise hits both alike.
`--baseline-commit REV` adds a fourth: the proxy of an earlier commit (from `git archive`), measured
in the same rounds, so before and after come from one run (`--tree NAME=DIR`: the proxy of the
package in DIR/harness_env, e.g. an experiment). `--bare-relay` adds a relay on the same
stack that only passes bytes on (nothing parsed, rewritten, masked or recorded): the floor a
Python relay on uvicorn, uvloop and aiohttp has on this machine; `--kernel-relay` adds socat
relaying TCP bytes (a process per connection, no Python): the floor of any relay here. `--openenv` adds OpenEnv's capture
server (OpenEnv 0.10.0 from its own venv, tests/openenv_env.py) on the chat-completions cases, its
sessions registered as a trainer registers them. Every call's body is new (bench/proxy_stats.py):
an equal one would be answered from the record, as a harness's retry is.

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
answer (first chunk when streaming), completion ids and logprobs per chunk; added latency at c=1
and c=N. For each case the proxy's CPU time per call (from /proc, over its rounds only) is
printed, next to the upstream's in the direct rounds, and the proxy's peak RSS at the end.

The real-engine cases ("vllm:", with `--vllm`, `--vllm-port PORT` or `--only-vllm`) are
bench/proxy_vllm.py's. The processes measured are bench/proxy_servers.py's; the load generator and
the figures bench/proxy_stats.py's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proxy_servers import Target, baseline_tree, start_bare_relay, start_kernel_relay, start_openenv, start_proxy, start_upstream, wait_up  # noqa: E402
from bench.proxy_stats import HEADER, Shape, check, label, measure, peak_rss_mb, row  # noqa: E402
from bench.proxy_vllm import vllm_cases  # noqa: E402

DIALECTS = ("responses", "messages", "gemini")  # the translating dialects, each measured against direct chat completions
CHAT_ONLY = ("bare relay", "kernel relay", "openenv")  # targets that are measured on chat completions only
Case = tuple[str, bool, int, Shape, str, int, int]  # (title, stream, concurrency, shape, dialect, sessions, prompt bytes)
Check = tuple[str, str, str, str, float]  # (summary name, case label, figure, op, bound)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400, help="calls per target per case")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--sessions", type=int, default=64, help="open capture sessions in the proxy (realistic cases)")
    ap.add_argument("--prompt-kb", type=int, default=16, help="prompt size of the realistic cases")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--dialects", nargs="*", default=list(DIALECTS), choices=DIALECTS, help="the translating dialects to measure")
    ap.add_argument("--only-realistic", action="store_true", help="only the realistic cases (64 sessions, 16 KB prompts)")
    ap.add_argument("--baseline-commit", help="also run the proxy of this commit, side by side (before/after in one run)")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR", help="also run the proxy of the harness_env package in DIR, as NAME")
    ap.add_argument("--only", help="only the cases whose title contains this (for profiling one case)")
    ap.add_argument("--bare-relay", action="store_true", help="also measure a relay that only passes bytes on (the stack's floor)")
    ap.add_argument("--kernel-relay", action="store_true", help="also measure socat relaying the bytes (no Python: the floor of any relay here)")
    ap.add_argument("--openenv", action="store_true", help="also measure OpenEnv's capture server (its own venv: tests/openenv_env.py)")
    ap.add_argument("--profile", help="write a cProfile of each proxy process to FILE.<target> (costs time: not for figures)")
    ap.add_argument("--vllm", action="store_true", help="also measure against a real vLLM, started for the run (tests/vllm_engine.py)")
    ap.add_argument("--vllm-port", type=int, help="also measure against the real vLLM running on this port (implies --vllm)")
    ap.add_argument("--only-vllm", action="store_true", help="only the real-vLLM cases (implies --vllm)")
    ap.add_argument("--vllm-concurrency", type=int, default=8)
    ap.add_argument("--vllm-rounds", type=int, default=4, help="rounds per real-vLLM case (3 calls per target a round at c=1, 2 x concurrency at c=N)")
    return ap.parse_args()


def _cases(args: argparse.Namespace) -> list[Case]:
    N, S, prompt_bytes = args.concurrency, args.sessions, args.prompt_kb * 1024
    real_ids = prompt_bytes // 4  # about 4 bytes of text per token
    burst, prefill, engine = (0.0, 32, 0.0, 200), (50.0, 32, 0.0, 200), (50.0, 32, 2.0, 200)
    real_burst, real_engine = (0.0, 32, 0.0, real_ids), (50.0, 32, 2.0, real_ids)
    cases: list[Case] = []
    if args.only_vllm:
        return cases
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
    cases += [
        ("real: added latency, non-stream", False, 1, real_burst, "chat", S, prompt_bytes),
        ("real: added latency, stream", True, 1, real_burst, "chat", S, prompt_bytes),
        ("real: added latency, non-stream", False, N, real_burst, "chat", S, prompt_bytes),
        ("real: added latency, stream", True, N, real_burst, "chat", S, prompt_bytes),
        ("real: ttft, streaming engine", True, 1, real_engine, "chat", S, prompt_bytes),
        ("real: ttft, streaming engine", True, N, real_engine, "chat", S, prompt_bytes),
        ("real: throughput, streaming engine", True, N, real_engine, "chat", S, prompt_bytes),
        ("real: throughput, engine-like", False, N, real_engine, "chat", S, prompt_bytes),
    ]
    if args.only:
        cases = [c for c in cases if args.only in label(c[0], c[1], c[2])]
    return cases


def _checks(args: argparse.Namespace) -> list[Check]:
    N = args.concurrency
    checks: list[Check] = []
    for c in (1, N):
        checks += [
            (f"real_added_p50_ms_non_stream_c{c}", f"real: added latency, non-stream, c={c}", "added_p50_ms", "<", 1.0),
            (f"real_added_p50_ms_stream_c{c}", f"real: added latency, stream, c={c}", "added_p50_ms", "<", 1.0),
            (f"real_cpu_ms_per_call_non_stream_c{c}", f"real: added latency, non-stream, c={c}", "cpu_ms_per_call", "<", 1.0),
            (f"real_cpu_ms_per_call_stream_c{c}", f"real: added latency, stream, c={c}", "cpu_ms_per_call", "<", 1.0),
        ]
    checks += [
        ("real_ttft_ratio_c1", "real: ttft, streaming engine (stream, c=1)", "ttft_ratio", "<=", 1.05),
        (f"real_ttft_ratio_c{N}", f"real: ttft, streaming engine (stream, c={N})", "ttft_ratio", "<=", 1.05),
        (f"real_throughput_ratio_stream_c{N}", f"real: throughput, streaming engine (stream, c={N})", "throughput_ratio", ">=", 0.8),
        (f"real_throughput_ratio_non_stream_c{N}", f"real: throughput, engine-like (non-stream, c={N})", "throughput_ratio", ">=", 0.8),
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
    return checks


async def _targets(args: argparse.Namespace, procs: list[subprocess.Popen], upstream: str, tmp: str) -> dict[str, Target]:
    """The proxies measured against direct calls, each started in a process of its own."""
    proxies: dict[str, Target] = {}
    if args.only_vllm:
        return proxies
    trees = {"proxy": str(ROOT.parent)}
    if args.baseline_commit:
        trees[f"base {args.baseline_commit}"] = baseline_tree(args.baseline_commit, tmp)
    trees.update(dict(tree.split("=", 1) for tree in args.tree))
    for name, tree in trees.items():
        profile = [f"{args.profile}.{name.split()[0]}"] if args.profile else []
        proxies[name] = await start_proxy(procs, tree, upstream, args.sessions, "m", profile)
    if args.bare_relay:
        proxies["bare relay"] = await start_bare_relay(procs, upstream, args.sessions)
    if args.kernel_relay:
        proxies["kernel relay"] = await start_kernel_relay(procs, upstream, args.sessions)
    if args.openenv:
        proxies["openenv"] = await start_openenv(procs, upstream, args.sessions, "m")
    return proxies


def _summary(args: argparse.Namespace, proxies: dict[str, Target], figures: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Each proxy's peak memory and the targets' figures, printed against their bounds."""
    summary: dict[str, dict[str, float]] = {}
    for name, (_, _, _, pid) in proxies.items():
        if name in ("bare relay", "kernel relay") or name not in figures:
            continue
        print(f"\n{name}: peak RSS {peak_rss_mb(pid):.0f} MB ({args.sessions} sessions, up to 40 recorded turns each)")
        summary[name] = {"peak_rss_mb": peak_rss_mb(pid)}
        for key, case, figure, op, bound in _checks(args):
            if case not in figures[name]:
                continue
            v = summary[name][key] = figures[name][case][figure]
            print(f"{key:<44}{v:>10.3f}   target {op} {bound}: {'met' if check(v, op, bound) else 'NOT met'}")
    return summary


async def main() -> int:
    args = _args()
    procs: list[subprocess.Popen] = []
    tmp = tempfile.mkdtemp(prefix="bench-proxy-")
    try:
        upstream = start_upstream(procs)
        upstream_pid = procs[0].pid
        await wait_up(upstream.removesuffix("/v1") + "/")
        proxies = await _targets(args, procs, upstream, tmp)
        figures: dict[str, dict] = {}
        print(HEADER)
        for title, stream, conc, shape, api, sessions, pbytes in _cases(args):
            # The upstream's CPU per call in the direct rounds: what serving the same bytes costs a
            # minimal ASGI app, a floor for a relay that must also read them.
            targets: dict[str, Target] = {"direct": (upstream, ["sk-bench"], "chat", upstream_pid)}
            targets.update({name: (url, keys[:sessions], api, pid) for name, (url, keys, _, pid) in proxies.items() if api == "chat" or name not in CHAT_ONLY})
            n = args.requests if conc > 1 else max(100, args.requests // 2)
            m = await measure(targets, stream=stream, concurrency=conc, n=n, shape=shape, prompt_bytes=pbytes)
            for name in proxies:
                if name in m:
                    row(figures, name, label(title, stream, conc), m["direct"], m[name])
        if args.vllm or args.vllm_port or args.only_vllm:
            await vllm_cases(args, procs, figures)
        summary = _summary(args, proxies, figures)
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
