"""bench/proxy.py's real-engine cases ("vllm:"): a real vLLM (tests/vllm_engine.py; the one on
--vllm-port, or one started for the run) called directly and through its own capture proxy,
interleaved in rounds: whole and streamed, c=1 and c=--vllm-concurrency, 24 greedy tokens a call.
The direct calls ask for what the proxy adds (logprobs, return_token_ids), so both sides make the
engine do the same work; the engine's time dominates every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator

from bench.proxy_servers import ROOT, Target, start_proxy, wait_up
from bench.proxy_stats import SEQ, Body, label, measure, peak_rss_mb, row

# Short completions (the engine decodes 25-34 tokens/s on these 2 cores), greedy so every call
# samples the same tokens, a prompt the model does not answer in fewer.
VLLM_PROMPT = "Write a long story about a lighthouse keeper and the sea (story " + SEQ + ")."
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


def _bodies(model: str, stream: bool) -> dict[str, Body]:
    """The same call both ways; direct, it asks vLLM for what the proxy adds to the proxied one
    (logprobs and return_token_ids; top_logprobs 0 is not sent)."""
    body = {"model": model, "messages": [{"role": "user", "content": VLLM_PROMPT}], "max_tokens": VLLM_MAX_TOKENS, "temperature": 0, "stream": stream}

    def split(b: dict) -> Body:
        head, tail = json.dumps(b).encode().split(SEQ.encode())
        return "/chat/completions", head, tail

    return {"direct": split({**body, "logprobs": True, "return_token_ids": True}), "proxy": split(body)}


async def vllm_cases(args: argparse.Namespace, procs: list[subprocess.Popen], figures: dict[str, dict]) -> None:
    """Direct and proxied calls to a real vLLM, interleaved in rounds: whole and streamed, c=1 and
    c=--vllm-concurrency. The engine dominates: what is left is the proxy's share of each call."""
    with _vllm(args.vllm_port) as (base_url, model):
        await wait_up(base_url + "/models")
        proxy = await start_proxy(procs, str(ROOT.parent), base_url, 1, model, [])
        targets: dict[str, Target] = {"direct": (base_url, ["sk-bench"], "chat", None), "proxy": proxy}
        for conc in (1, args.vllm_concurrency):
            for stream in (False, True):
                n = args.vllm_rounds * (3 if conc == 1 else 2 * conc)
                m = await measure(targets, stream=stream, concurrency=conc, n=n, bodies=_bodies(model, stream), rounds=args.vllm_rounds)
                row(figures, "vllm proxy", label("vllm: added latency, " + ("stream" if stream else "non-stream"), stream, conc), m["direct"], m["proxy"])
        print(
            f"\nvllm proxy: peak RSS {peak_rss_mb(proxy[3]):.0f} MB; {VLLM_MAX_TOKENS} tokens per call from {base_url} "
            "(shared: other work may call this engine too)"
        )
