"""Cost of the job store: what storing a rollout adds, and listing a large store.

    .venv/bin/python bench/store.py [--rollouts 200] [--events 30] [--turns 20] [--rows 100000] [--backends sqlite,postgresql]

For each backend (SQLite in a temporary data directory; PostgreSQL started from its binaries in a
temporary directory, as the tests do):

1. Write overhead per rollout: everything the server writes for one rollout (the job row, running,
   its sandbox, `--events` phase events, then its result: a `--turns`-turn conversation as
   bench/capture.py builds it, packed and compressed), timed
   - one rollout at a time, each event its own transaction (the worst case: events far apart);
   - `--rollouts` at once through the server's single writer (events batched as they queue up).
2. GET /rollouts against a real `harness-env serve` whose store holds `--rows` ended rollouts:
   the first page, filtered pages (status, task id, harness) and a page deep in the listing,
   median of 20 requests each, over HTTP on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from capture import conversation  # bench/capture.py

from harness_env.core.capture.graph import link_turns
from harness_env.models import PhaseEvent, RolloutResult, summarize
from harness_env.server.store import Store, StoreWriter
from harness_env.server.store.codec import encode_result
from harness_env.server.store.schema import rollouts
from harness_env.server.store.store import request_blob
from tests.server.store.postgres import PostgresServer
from tests.server_process import ServerProcess

REQUEST = {"task": {"instruction": "Fix the failing test. " * 20, "verify": ["pytest -q"]}, "harness": "pi", "endpoint": {"model": "m"}}


def row(job_id: str) -> dict:
    return {
        "id": job_id,
        "status": "queued",
        "created_at": time.time(),
        "task_id": "task-1",
        "harness": "pi",
        "model": "m",
        "instance": "bench",
        "request": request_blob(REQUEST),
    }


def event(job_id: str, i: int) -> str:
    return PhaseEvent(
        rollout_id=job_id, phase="agent", status="info", elapsed_s=i * 0.5, detail=f"model call {i} (policy): 150 tokens, 1 tool calls, 0.42s"
    ).model_dump_json()


def linked(turns: int) -> RolloutResult:
    """bench/capture.py's conversation with its turn graph, as the engine returns it."""
    result = conversation(turns)
    link_turns(result.proxy_turns)
    return result


def one_at_a_time(store: Store, n: int, events: int, turns: int) -> float:
    """Seconds per rollout, each write its own transaction."""
    result = linked(turns)
    summary = summarize(result).model_dump_json()
    times = []
    for k in range(n):
        job_id = f"seq{k:06d}"
        t0 = time.perf_counter()
        store.insert_job(row(job_id))
        store.mark_running(job_id, time.time())
        store.set_sandbox(job_id, f"/tmp/harness-env/rollout-{job_id}")
        for i in range(events):
            store.append_events([(job_id, i, time.time(), event(job_id, i))])
        store.finish(job_id, "finished", result, summary, time.time())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def in_flight(store: Store, n: int, events: int, turns: int) -> float:
    """Seconds of writing per rollout with `n` rollouts at once through the single writer."""
    result = linked(turns)
    summary = summarize(result).model_dump_json()
    writer = StoreWriter(store, lambda _ids: None)
    writer.start()

    async def rollout(k: int) -> None:
        job_id = f"par{k:06d}"
        await writer.call(job_id, store.insert_job, row(job_id))
        writer.post(job_id, store.mark_running, job_id, time.time())
        for i in range(events):
            writer.post_event((job_id, i, time.time(), event(job_id, i)))
            await asyncio.sleep(0)  # other rollouts' events come in between
        await writer.call(job_id, store.finish, job_id, "finished", result, summary, time.time())

    t0 = time.perf_counter()
    await asyncio.gather(*(rollout(k) for k in range(n)))
    wall = time.perf_counter() - t0
    await writer.close()
    return wall / n


def fill(store: Store, rows: int) -> None:
    """`rows` ended rollouts (listing columns and a summary-sized text), in bulk."""
    rng = random.Random(0)
    statuses = ["finished"] * 7 + ["failed"] * 2 + ["cancelled"]
    summary = "s" * 2000
    now = time.time() - rows
    with store.engine.begin() as conn:
        for start in range(0, rows, 2000):
            conn.execute(
                rollouts.insert(),
                [
                    {
                        "id": f"{i:012x}",
                        "status": rng.choice(statuses),
                        "created_at": now + i,
                        "started_at": now + i,
                        "ended_at": now + i + 60,
                        "task_id": f"task-{rng.randrange(1000)}",
                        "harness": rng.choice(["pi", "opencode", "whitebox"]),
                        "model": "m",
                        "reward": rng.choice([0.0, 1.0]),
                        "wall_s": 60.0,
                        "instance": "old",
                        "summary": summary,
                        "stored_bytes": 20_000,
                    }
                    for i in range(start, min(start + 2000, rows))
                ],
            )


def time_get(url: str, params: dict) -> float:
    with httpx.Client(base_url=url, timeout=60) as c:
        c.get("/rollouts", params=params).raise_for_status()  # warm
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            r = c.get("/rollouts", params=params)
            times.append(time.perf_counter() - t0)
            r.raise_for_status()
    return statistics.median(times)


def listing(url_env: dict[str, str], rows: int, work: Path) -> dict[str, float]:
    (work / "sandboxes").mkdir(exist_ok=True)
    server = ServerProcess(work / "sandboxes", env=url_env)
    try:
        first = httpx.get(server.url + "/rollouts", params={"limit": 50}).json()
        deep = str(rows // 50)  # a cursor near the oldest rows
        cases = {
            "first page (50)": {"limit": 50},
            "status=failed": {"status": "failed"},
            "task_id=task-7": {"task_id": "task-7"},
            "harness=opencode": {"harness": "opencode"},
            "page 1,999 (before=cursor)": {"before": deep},
            "next page": {"before": first["next_cursor"]},
        }
        return {name: time_get(server.url, params) for name, params in cases.items()}
    finally:
        server.stop()


def bench(backend: str, args: argparse.Namespace, work: Path, pg: PostgresServer | None) -> None:
    if backend == "sqlite":
        data = work / "data"
        data.mkdir()
        url, env = f"sqlite:///{data / 'rollouts.db'}", {"HARNESS_ENV_DATA_DIR": str(data)}
    else:
        assert pg is not None
        url = pg.new_database()
        env = {"HARNESS_ENV_STORE_URL": url}
    store = Store.open(url)
    seq = one_at_a_time(store, args.rollouts, args.events, args.turns)
    par = asyncio.run(in_flight(store, args.rollouts, args.events, args.turns))
    print(
        f"\n{backend}: write overhead per rollout ({args.events} events, a {args.turns}-turn result of "
        f"{store.get('seq000000')['stored_bytes'] / 1024:.0f} KB stored)"
    )
    result = linked(args.turns)
    t0 = time.perf_counter()
    for _ in range(10):
        encode_result(result)
    print(f"  of which packing and compressing the result: {(time.perf_counter() - t0) * 100:7.2f} ms")
    print(f"  one at a time, a transaction per event:  {seq * 1000:7.2f} ms")
    print(f"  {args.rollouts} in flight, single writer:        {par * 1000:7.2f} ms")
    with store.engine.begin() as conn:
        conn.execute(rollouts.delete())
    fill(store, args.rows)
    store.close()
    print(f"  GET /rollouts over HTTP, {args.rows:,} rollouts stored (median of 20):")
    for name, seconds in listing(env, args.rows, work).items():
        print(f"    {name:<28} {seconds * 1000:7.2f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rollouts", type=int, default=200)
    p.add_argument("--events", type=int, default=30)
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--backends", default="sqlite,postgresql")
    args = p.parse_args()
    backends = args.backends.split(",")
    pg = PostgresServer() if "postgresql" in backends else None
    try:
        for backend in backends:
            with tempfile.TemporaryDirectory(prefix="store-bench-", dir="/tmp") as tmp:
                bench(backend, args, Path(tmp), pg)
    finally:
        if pg is not None:
            pg.stop()
    print(f"\n(cpus: {len(os.sched_getaffinity(0))}; PostgreSQL as the tests run it: fsync off)")


if __name__ == "__main__":
    main()
