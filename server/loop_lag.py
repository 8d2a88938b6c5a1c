"""The event loop's lag: how late a periodic sleep wakes up.

Anything that holds the server's event loop (serialising a large result, parsing a big answer,
reading a file) delays every other rollout's I/O by as long: the capture proxy's relayed chunks,
the white-box loops, health checks. A sampler that sleeps `interval_s` and measures how much later
than asked it woke up sees exactly that delay, at the cost of one wake-up per interval.

Samples go to a cumulative histogram (Prometheus buckets, so a scraper computes quantiles over
any span from two scrapes) and to a window of the last `window` samples, whose p50/p99/max are
exposed as gauges for a person reading /metrics.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import deque
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Seconds: fine below 50 ms, where a healthy loop stays, coarse above.
LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
INTERVAL_S = 0.05
WINDOW = 1200  # samples: the last minute at the default interval


def freeze_long_lived() -> None:
    """Leave every object alive now (modules, classes, the app and its routes: over 100,000 once
    the server is built, several times that with the web UI) out of the cyclic garbage collector's
    scans from now on. A full collection walked them all on the event loop: 40 ms on an idle
    machine, up to 400 ms with hundreds of rollouts running. Called once the server is built and
    again once the web UI is loaded; garbage is collected first, so nothing dead is kept."""
    gc.collect()
    gc.freeze()


def quantile(sorted_values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of already sorted values; 0.0 for none."""
    if not sorted_values:
        return 0.0
    rank = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[rank]


class LoopLagMonitor(Collector):
    """Samples the running loop's lag from `start()` to `stop()`; registers its metrics in `registry`."""

    def __init__(self, registry: CollectorRegistry, interval_s: float = INTERVAL_S, window: int = WINDOW) -> None:
        self.interval_s = interval_s
        self.recent: deque[float] = deque(maxlen=window)
        self.histogram = Histogram(
            "harness_env_event_loop_lag_seconds", f"How late the server's event loop woke from a {interval_s}s sleep", buckets=LAG_BUCKETS, registry=registry
        )
        registry.register(self)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sample(), name="loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _sample(self) -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            self.record(max(0.0, time.perf_counter() - asked - self.interval_s))

    def record(self, lag_s: float) -> None:
        self.recent.append(lag_s)
        self.histogram.observe(lag_s)

    def collect(self) -> Iterator[Metric]:
        values = sorted(self.recent)
        gauge = GaugeMetricFamily(
            "harness_env_event_loop_lag_recent_seconds",
            f"The event loop's lag over its last {self.recent.maxlen} samples (quantile 1 is the maximum)",
            labels=["quantile"],
        )
        for q in (0.5, 0.99, 1.0):
            gauge.add_metric([str(q)], quantile(values, q))
        yield gauge
