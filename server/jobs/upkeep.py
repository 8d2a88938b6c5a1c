"""What keeps the store true while the server runs: jobs whose server died are marked
`interrupted` (at start, and on a shared store whenever a replica stops beating), their sandboxes
removed when they were on this machine; cancel requests made on other replicas reach the jobs
here; and retention removes the oldest ended results past a maximum age or total size.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from dataclasses import dataclass

from harness_env.core.sandbox.backends import remove_leftover
from harness_env.models import RolloutResult, summarize
from harness_env.server.jobs.manager import JobManager
from harness_env.server.store import Orphan

logger = logging.getLogger("harness_env.jobs")
MAX_AGE_VAR = "HARNESS_ENV_RETENTION_MAX_AGE"
MAX_SIZE_VAR = "HARNESS_ENV_RETENTION_MAX_SIZE"
INTERVAL_VAR = "HARNESS_ENV_RETENTION_INTERVAL_S"
DEFAULT_MAX_SIZE = "10GB"
TICK_S = 1.0
HEARTBEAT_S = 10.0
LEASE_S = 60.0  # a replica silent this long is taken for dead (a shared store only)
DIED = "the server running this rollout stopped before it ended (it died or was killed); submit it again"
_AGE_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def _amount(text: str, units: dict[str, int], what: str) -> float | None:
    """'30d', '12h', '500MB', '0' or 'none' (no limit) -> the number in base units, or None."""
    t = text.strip().lower().replace(" ", "")
    if t in ("", "0", "none", "off"):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]*)", t)
    if m is None or m.group(2) not in units:
        raise ValueError(f"{what} {text!r}: a number with an optional unit ({', '.join(u for u in units if u)}), or 0 for none")
    return float(m.group(1)) * units[m.group(2)]


def parse_age(text: str) -> float | None:
    return _amount(text, _AGE_UNITS, "retention age")


def parse_size(text: str) -> int | None:
    n = _amount(text, _SIZE_UNITS, "retention size")
    return None if n is None else int(n)


@dataclass(frozen=True)
class Retention:
    """Ended results older than `max_age_s`, then the oldest beyond `max_bytes` in all, are
    removed every `interval_s`. None: no limit. A running job is never removed."""

    max_age_s: float | None = None
    max_bytes: int | None = parse_size(DEFAULT_MAX_SIZE)
    interval_s: float = 60.0

    @classmethod
    def from_env(cls, max_age: str | None = None, max_size: str | None = None, env: dict[str, str] | None = None) -> Retention:
        """Flags win over the environment (HARNESS_ENV_RETENTION_MAX_AGE / _MAX_SIZE / _INTERVAL_S)."""
        env = dict(os.environ) if env is None else env
        age = max_age if max_age is not None else env.get(MAX_AGE_VAR, "")
        size = max_size if max_size is not None else env.get(MAX_SIZE_VAR, DEFAULT_MAX_SIZE)
        return cls(parse_age(age), parse_size(size), float(env.get(INTERVAL_VAR) or 60.0))


def remove_sandbox(path: str) -> str:
    """Clean up after a dead server's rollout whose sandbox was `path`: the registered backend
    whose sandbox it is kills what it left and removes it (core/sandbox/backends.py); what was done."""
    return remove_leftover(path) or "no sandbox backend registered here made it: left as it is"


async def recover(jobs: JobManager) -> int:
    """Mark the jobs whose server is gone `interrupted` (reward None) and clean up after them."""
    store, writer = jobs._store()
    orphans: list[Orphan] = await asyncio.to_thread(store.orphans, jobs.instance, jobs.host, time.time(), LEASE_S, jobs.exclusive)
    for o in orphans:
        result = RolloutResult(rollout_id=o.id, task_id=o.task_id, harness=o.harness, error=DIED, error_kind="internal")
        if o.sandbox_dir and (jobs.exclusive or o.host == jobs.host):
            note = await asyncio.to_thread(remove_sandbox, o.sandbox_dir)
            result.sandbox_notes.append(f"clean-up after the server died: {note}")
        await writer.call(o.id, store.finish, o.id, "interrupted", result, summarize(result).model_dump_json(), time.time(), only_if_active=True)
    if orphans:
        logger.warning("marked %d rollout(s) interrupted: their server stopped before they ended", len(orphans))
    return len(orphans)


async def enforce_retention(jobs: JobManager, retention: Retention) -> int:
    """Remove what retention says, oldest ended first, in batches; returns how many."""
    store, writer = jobs._store()
    removed = 0
    for _ in range(10_000):
        older_than = None if retention.max_age_s is None else time.time() - retention.max_age_s
        ids = await asyncio.to_thread(store.to_remove, older_than=older_than, max_bytes=retention.max_bytes)
        if not ids:
            break
        await writer.call(None, store.remove, ids)
        removed += len(ids)
    if removed:
        await writer.call(None, store.shrink)
        logger.info("retention removed %d stored rollout(s)", removed)
    return removed


async def upkeep(jobs: JobManager, retention: Retention) -> None:
    """The background loop (one per server): remote cancels, heartbeat and orphans (a shared
    store), retention. A failure is logged and tried again next time."""
    last_beat = last_retention = time.monotonic()
    while True:
        await asyncio.sleep(TICK_S)
        now = time.monotonic()
        try:
            store, writer = jobs._store()
            if not jobs.exclusive:
                for job_id in await asyncio.to_thread(store.cancel_requests, jobs.instance):
                    if (job := jobs.local.get(job_id)) is not None:
                        jobs.cancel_local(job)
                if now - last_beat >= HEARTBEAT_S:
                    last_beat = now
                    await writer.call(None, store.heartbeat, jobs.instance, time.time())
                    await recover(jobs)
            if now - last_retention >= retention.interval_s:
                last_retention = now
                await enforce_retention(jobs, retention)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("job store upkeep failed; trying again")
