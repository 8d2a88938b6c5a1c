"""`/metrics` in the Prometheus text format, and one log line per rollout end.

Each app has its own registry (not prometheus_client's process-wide default), so several apps in
one process (tests, an embedding) never share counters. What is counted is fed once per rollout,
when it ends (JobManager.on_end): its status and error kind, its phases' durations, and the model
calls the capture proxy recorded for it (its turns, so the count is exactly the turns a result
carries; the endpoint probe is not a rollout's call). What is a level, not a count (queue depth,
running rollouts, what the store holds) is read when scraped, so it is never stale.

The same rollout end is one line on the "harness_env.rollouts" logger (INFO), key=value, with
every registered secret masked (core/capture/redact.py), for log pipelines that want one event per
rollout rather than a time series.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from harness_env.core.capture.redact import Redactor, registered_secrets, registry_version
from harness_env.models import RolloutResult
from harness_env.server.loop_lag import LoopLagMonitor
from harness_env.server.store.schema import rollouts

if TYPE_CHECKING:
    from harness_env.server.jobs.manager import JobManager
    from harness_env.server.slots import RolloutSlots

ROLLOUT_LOGGER = "harness_env.rollouts"
LOG_LEVEL_VAR = "HARNESS_ENV_LOG_LEVEL"
# Seconds: a verify command or a model call of a few milliseconds up to an agent phase of an hour.
PHASE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
CALL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)

logger = logging.getLogger(ROLLOUT_LOGGER)
store_logger = logging.getLogger("harness_env.metrics")


class ServerMetrics:
    """The app's metrics: counters fed at each rollout end, levels read from `slots` and the
    job store when scraped."""

    def __init__(self, slots: RolloutSlots, jobs: JobManager) -> None:
        self.registry = registry = CollectorRegistry()
        self.rollouts = Counter(
            "harness_env_rollouts",
            "Rollouts this server ran to an end, by status, error kind ('none': no error) and harness",
            ["status", "error_kind", "harness"],
            registry=registry,
        )
        self.rollout_seconds = Histogram("harness_env_rollout_wall_seconds", "Wall time of the rollouts that ended", buckets=PHASE_BUCKETS, registry=registry)
        self.phase_seconds = Histogram(
            "harness_env_phase_duration_seconds", "Duration of each phase of the rollouts that ended", ["phase"], buckets=PHASE_BUCKETS, registry=registry
        )
        self.model_calls = Counter(
            "harness_env_model_calls",
            "Model calls the capture proxy recorded for rollouts that ended, by purpose (policy, auxiliary) and outcome (answered, failed)",
            ["purpose", "outcome"],
            registry=registry,
        )
        self.model_call_seconds = Histogram(
            "harness_env_model_call_latency_seconds", "Latency of those model calls (to the last byte)", ["purpose"], buckets=CALL_BUCKETS, registry=registry
        )
        # Masked rollouts (mask_sample: an end the agent did not cause) never train; their count
        # over harness_env_rollouts is the masked share, and it is the reward lost to
        # infrastructure (a masked rollout's reward is unknown, so what is lost is counted in rollouts).
        self.masked = Counter(
            "harness_env_rollouts_masked",
            "Rollouts whose sample is masked (mask_sample: reward lost to infrastructure or a cancel, never trained), by failure kind and harness",
            ["failure_kind", "harness"],
            registry=registry,
        )
        self.masked_tokens = Counter(
            "harness_env_masked_completion_tokens", "Policy tokens sampled in masked rollouts (sampling lost to infrastructure)", registry=registry
        )
        self.completion_tokens = Counter(
            "harness_env_model_completion_tokens", "Completion token ids those model calls returned", ["purpose"], registry=registry
        )
        registry.register(_Levels(slots, jobs))
        self.loop_lag = LoopLagMonitor(registry)  # sampling while the app runs (its lifespan)

    def rollout_ended(self, job_id: str, status: str, result: RolloutResult) -> None:
        """Count a rollout that ended and write its log line (JobManager.on_end)."""
        kind = result.error_kind or "none"
        self.rollouts.labels(status, kind, result.harness or "").inc()
        self.rollout_seconds.observe(result.wall_s)
        for phase in result.phases:
            self.phase_seconds.labels(phase.name).observe(max(phase.duration_s, 0.0))
        if result.mask_sample:
            self.masked.labels(result.failure_kind or "", result.harness or "").inc()
            self.masked_tokens.inc(sum(len(t.completion_token_ids) for t in result.proxy_turns if t.purpose == "policy"))
        for turn in result.proxy_turns:
            self.model_calls.labels(turn.purpose, "answered" if turn.answered else "failed").inc()
            self.model_call_seconds.labels(turn.purpose).observe(max(turn.latency_s, 0.0))
            if turn.completion_token_ids:
                self.completion_tokens.labels(turn.purpose).inc(len(turn.completion_token_ids))
        if logger.isEnabledFor(logging.INFO):
            logger.info("%s", rollout_line(job_id, status, result))

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """The exposition (the text format, or OpenMetrics when the scraper asks for it) and its
        content type. Reads the store: call it off the event loop."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


class _Levels(Collector):
    """Gauges read when scraped: admission (running, queued, the limits) and the store."""

    def __init__(self, slots: RolloutSlots, jobs: JobManager) -> None:
        self.slots, self.jobs = slots, jobs

    def collect(self) -> Iterator[Metric]:
        s = self.slots
        for name, doc, value in (
            ("running", "Rollouts running in this server", s.running),
            ("queued", "Rollouts admitted and waiting for a slot in this server (the queue depth)", s.queued),
            ("max_concurrent", "Rollouts this server runs at once (--max-concurrent)", s.max_concurrent),
            ("max_queue", "Rollouts this server lets wait (--max-queue)", s.max_queue),
            ("starting", "Rollouts in their start-up (sandbox, setup, harness launch) in this server", s.starting.active),
            ("waiting_to_start", "Rollouts waiting for a start-up place (--max-starting)", s.starting.waiting),
            ("max_starting", "Rollouts this server starts at once (--max-starting)", s.starting.limit),
        ):
            yield GaugeMetricFamily(f"harness_env_rollouts_{name}", doc, value=value)
        store = self.jobs.store
        if store is None:
            return  # starting or stopped: no store to read
        try:
            with store.engine.connect() as conn:
                counts = conn.execute(select(rollouts.c.status, func.count()).group_by(rollouts.c.status)).all()
            stored = store.total_bytes()
        except Exception as e:  # a scrape must answer even when the store does not
            store_logger.warning("metrics: could not read the job store: %s", type(e).__name__)
            return
        by_status = GaugeMetricFamily("harness_env_store_rollouts", "Rollouts in the job store, by status (a shared store: every replica's)", labels=["status"])
        for status, count in sorted(counts):
            by_status.add_metric([status], count)
        yield by_status
        yield GaugeMetricFamily(
            "harness_env_store_result_bytes", "Bytes the ended rollouts take in the store (what retention's size limit counts)", value=stored
        )
        path = store.engine.url.database if store.is_sqlite else None
        if path and path != ":memory:":
            size = sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
            yield GaugeMetricFamily("harness_env_store_file_bytes", "Size of the SQLite store's files (database and write-ahead log)", value=size)


_redactor: tuple[int, Redactor] | None = None


def _mask(text: str) -> str:
    global _redactor
    version = registry_version()
    if _redactor is None or _redactor[0] != version:
        _redactor = (version, Redactor(registered_secrets()))
    return _redactor[1].redact(text)


def _value(v: object) -> str:
    if v is None:
        return "none"
    text = _mask(str(v))
    if not text or any(c.isspace() or c in '"=\\' for c in text) or not text.isprintable():
        return json.dumps(text)
    return text


def rollout_line(job_id: str, status: str, result: RolloutResult) -> str:
    """`rollout_end id=... task=... harness=... status=... reward=... error_kind=... wall_s=...`:
    values with spaces, quotes or '=' are JSON strings; secrets are masked."""
    fields = {
        "id": job_id,
        "task": result.task_id or "",
        "harness": result.harness,
        "status": status,
        "reward": result.reward,
        "error_kind": result.error_kind,
        "mask_sample": result.mask_sample,
        "wall_s": round(result.wall_s, 3),
    }
    return "rollout_end " + " ".join(f"{k}={_value(v)}" for k, v in fields.items())


def log_rollouts_to_stderr() -> None:
    """Make the rollout lines visible in `harness-env serve`'s output: uvicorn configures only its
    own loggers. Only when nothing else handles them (an embedding's logging configuration wins),
    at $HARNESS_ENV_LOG_LEVEL (default info), once per process."""
    if logger.handlers or logging.getLogger().handlers:
        return
    level = logging.getLevelName(os.environ.get(LOG_LEVEL_VAR, "info").upper())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level if isinstance(level, int) else logging.INFO)
    logger.propagate = False
