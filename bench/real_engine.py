"""The token contract against a real vLLM, per harness: the table of docs/training.md.

    .venv/bin/python bench/real_engine.py [--vllm-port PORT] [--harness NAME ...] [--plain-sampling]

Each harness runs one rollout through its real CLI and the capture proxy against a real vLLM (CPU,
SmolLM2-135M-Instruct, float32, processed logprobs; tests/vllm_engine.py starts one unless
--vllm-port names a running one), with a recording tap between the proxy and vLLM. The first two
answers are constrained to a tool call (`structured_regex`), the third is free. Per harness:
policy calls, branches (and how many of them only re-tokenise text the sampler spelled otherwise),
whether every captured id and logprob is what vLLM returned and every prompt is vLLM's own
tokenisation of what it received, the largest gap between captured and teacher-forced logprobs on
the free answer, and the probe's verdict. Minutes on 2 cores: the harnesses' own prompts (Claude
Code's is about 20,000 tokens) are prefilled at a few hundred tokens a second.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: tests/ is importable

from harness_env import Endpoint, RolloutRequest, Task, run_rollout
from harness_env.envs import HARNESSES
from tests.envs.test_vllm_contract import SHELL, continuity, teacher_forced, tokenize, tool_call_regex
from tests.fakes.loopback import LoopbackServer
from tests.fakes.tap import Tap
from tests.vllm_engine import VllmServer

TEMPERATURE = 1.0


async def measure(server: VllmServer, harness: str, plain_sampling: bool = False) -> dict:
    tap = Tap(server.root_url)
    started = time.monotonic()
    with LoopbackServer(tap) as srv:
        req = RolloutRequest(
            task=Task(instruction="List the files in this directory, then say what you found.", task_id="bench", verify=["true"]),
            endpoint=Endpoint(base_url=srv.base_url, api_key="", model=server.model),
            harness=harness,
            top_logprobs=2,
            temperature=TEMPERATURE,
            max_turns=3,
            max_tokens_cap=96,
            structured_regex=tool_call_regex(harness),
            structured_calls=2,
            agent_timeout_s=1200,
            plain_sampling=plain_sampling,
            # The chat path, whose exactness this table checks call by call; continuity by token ids
            # (vLLM's generate route) is checked in tests/envs/test_vllm_contract.py.
            continuity="messages",
        )
        res = await run_rollout(req)
    turns = [t for t in res.proxy_turns if t.purpose == "policy"]
    calls = tap.chat_calls()
    answers = [c.answer_choice() for c in calls]
    exact = len(turns) == len(calls) and all(
        t.prompt_token_ids == tokenize(server, c.body) and (t.completion_token_ids, t.per_token_logps) == (a["token_ids"], a["logprobs"])
        for t, c, a in zip(turns, calls, answers)
    )
    text_splits, token_splits = continuity(server, turns)
    free = [t for t in turns[2:] if t.completion_token_ids and t.per_token_logps]
    gap = None
    for t in free:
        forced = teacher_forced(t.prompt_token_ids, t.completion_token_ids, TEMPERATURE)
        gap = max([gap or 0.0, *(abs(a - b) for a, b in zip(t.per_token_logps, forced))])
    return {
        "harness": harness,
        "dialect": _dialect(harness),
        "calls": len(turns),
        "branches": res.graph.branches,
        "retokenised": len(token_splits),
        "text_splits": len(text_splits),
        "exact": exact,
        "gap": gap,
        "prompt_tokens": len(turns[0].prompt_token_ids) if turns else 0,
        "verdict": res.rollout_type,
        "error_kind": res.error_kind,
        "seconds": time.monotonic() - started,
        "splits": text_splits + token_splits,
    }


def _dialect(harness: str) -> str:
    return HARNESSES[harness].dialect or "chat"


def table(rows: list[dict]) -> str:
    out = [
        "| harness | dialect | model calls | branches (re-tokenised) | text splits | ids and logprobs exact | "
        "largest logprob gap to teacher forcing (free answer) | first prompt, tokens | probe | s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        gap = f"{r['gap']:.1e}" if r["gap"] is not None else "no free answer"
        out.append(
            f"| {r['harness']} | {r['dialect']} | {r['calls']} | {r['branches']} ({r['retokenised']}) | {r['text_splits']} | "
            f"{'yes' if r['exact'] else 'NO'} | {gap} | {r['prompt_tokens']:,} | {r['verdict']} | {r['seconds']:.0f} |"
        )
    return "\n".join(out)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-port", type=int, help="a vLLM of tests/vllm_engine.py already serving on loopback")
    parser.add_argument("--harness", action="append", choices=sorted(SHELL), help="only these (default: all)")
    parser.add_argument("--plain-sampling", action="store_true", help="the rollout option: the harness's top_p and penalties dropped")
    args = parser.parse_args()
    server = VllmServer(port=args.vllm_port) if args.vllm_port else VllmServer().start()
    try:
        rows = []
        for harness in args.harness or list(SHELL):
            row = await measure(server, harness, args.plain_sampling)
            print(row, flush=True)
            rows.append(row)
        print(table(rows))
    finally:
        if not args.vllm_port:
            server.stop()


if __name__ == "__main__":
    asyncio.run(main())
