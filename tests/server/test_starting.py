"""Bounded start-up on a real `harness-env serve`: with --max-starting K, rollouts arriving at once
start K at a time (sandbox, setup, launch until the agent's first model call), the rest wait in
arrival order and their phases show the wait; bad values get one clear error; the event loop's lag
is in /metrics."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness_env.server.slots import StartingSlots
from tests.fakes.policy import FakePolicy, FakePolicyServer

pytestmark = pytest.mark.slow  # starts the server process: not in the fast tier

SETUP_S = 1.0  # each start-up takes at least this long, so overlapping ones would show
# The place is given back when the first call reaches the capture proxy; the policy sees it a
# moment later (forwarded), and this test can only read the policy's clock.
FORWARD_S = 0.25


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of [start, end) intervals that overlap at one instant."""
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


@pytest.mark.e2e
def test_six_rollouts_at_once_start_two_at_a_time_and_all_succeed(start_server) -> None:
    policy = FakePolicy(scripts={"m": [{"bash": "echo one >> steps.txt"}, {"text": "done"}]}, delay_s=0.3)
    with FakePolicyServer(policy) as srv:
        server = start_server("--max-starting", "2", "--max-concurrent", "6")

        async def send_all() -> list[dict]:
            async with httpx.AsyncClient(timeout=300) as client:
                bodies = [
                    {
                        "harness": "whitebox",
                        "instruction": f"[tag:r{i}] append a line to steps.txt",
                        "base_url": srv.base_url,
                        "model": "m",
                        "setup": [f"sleep {SETUP_S}"],
                        "verify": ["test $(wc -l < steps.txt) -eq 1"],
                        "agent_timeout_s": 120,
                    }
                    for i in range(6)
                ]
                replies = await asyncio.gather(*(client.post(server.url + "/rollout", json=b) for b in bodies))
            return [r.json() for r in replies]

        results = asyncio.run(send_all())
        assert [r["error"] for r in results] == [None] * 6 and [r["reward"] for r in results] == [1.0] * 6

        starting = []
        for i, res in enumerate(results):
            phases = {p["name"]: p for p in res["phases"]}
            assert [p["name"] for p in res["phases"]][:4] == ["queue", "endpoint", "start_wait", "sandbox"]
            # From making its sandbox to the agent's first model call reaching the capture proxy.
            starting.append((phases["sandbox"]["started"], min(policy.arrivals[f"r{i}"]) - FORWARD_S))
        assert most_at_once(starting) <= 2, starting
        assert most_at_once(starting) == 2  # the two places were used at once: not one at a time
        # The phase shows the wait: in the order they started, each pair waited longer than the pair before.
        by_start = sorted(({p["name"]: p for p in r["phases"]} for r in results), key=lambda ph: ph["sandbox"]["started"])
        waits = [ph["start_wait"]["duration_s"] for ph in by_start]
        assert max(waits[:2]) < min(waits[2:4]) and max(waits[2:4]) < min(waits[4:]), waits
        assert sum("were waiting to start ahead of this one" in p["detail"] for r in results for p in r["phases"] if p["name"] == "start_wait") >= 3
    server.assert_no_rollout_left()


def test_places_go_in_arrival_order_and_a_cancelled_waiter_passes_its_place_on() -> None:
    async def scenario() -> list[str]:
        slots = StartingSlots(1)
        order: list[str] = []

        async def start(name: str) -> None:
            await slots.acquire()
            order.append(name)
            await asyncio.sleep(0.01)
            slots.release()

        assert await slots.acquire() == 0  # the one place is taken
        tasks = [asyncio.create_task(start(n)) for n in "abcd"]
        await asyncio.sleep(0.01)
        assert slots.waiting == 4
        tasks[1].cancel()  # b goes away while waiting
        slots.release()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert slots.active == 0 and slots.waiting == 0
        return order

    assert asyncio.run(scenario()) == ["a", "c", "d"]


@pytest.mark.parametrize(
    "flag, env, message",
    [
        (["--max-starting", "0"], {}, "--max-starting must be at least 1, not 0"),
        (["--max-starting", "-3"], {}, "--max-starting must be at least 1, not -3"),
        (["--max-starting", "two"], {}, "argument --max-starting: invalid int value: 'two'"),
        ([], {"MAX_STARTING_ROLLOUTS": "0"}, "MAX_STARTING_ROLLOUTS must be a whole number of at least 1, not '0'"),
        ([], {"MAX_STARTING_ROLLOUTS": "many"}, "MAX_STARTING_ROLLOUTS must be a whole number of at least 1, not 'many'"),
    ],
)
def test_bad_max_starting_is_refused_with_one_clear_error(flag: list[str], env: dict, message: str, tmp_path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "harness_env.cli", "serve", "--port", "1", *flag],
        capture_output=True,
        text=True,
        timeout=60,
        env={"HARNESS_ENV_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", **env},
    )
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""


def test_loop_lag_and_start_up_levels_are_in_metrics(module_server) -> None:
    time.sleep(0.5)  # some samples at 50 ms
    text = httpx.get(module_server.url + "/metrics", timeout=30).text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("harness_env_event_loop_lag_seconds_count", ())] >= 5
    recent = {dict(labels)["quantile"]: v for (name, labels), v in samples.items() if name == "harness_env_event_loop_lag_recent_seconds"}
    assert set(recent) == {"0.5", "0.99", "1.0"} and 0 <= recent["0.5"] <= recent["0.99"] <= recent["1.0"]
    assert recent["1.0"] <= samples[("harness_env_event_loop_lag_seconds_sum", ())]  # one of the histogram's samples, in its unit
    assert samples[("harness_env_rollouts_max_starting", ())] >= 1 and samples[("harness_env_rollouts_starting", ())] == 0
