"""Rollouts as jobs: every rollout the server runs is a job in the store (server/store).

A job is submitted (POST /rollouts, MCP submit_rollout: it runs whether or not the caller stays)
or called (POST /rollout, MCP run_rollout, the web UI: the caller waits, and going away cancels
it, as before). Either way it is admitted by the same slots (server/slots.py: beyond the queue it
is refused at once), stored before it is acknowledged, and its events and result are written as
they happen, so a client can watch it, fetch its result later, or find it `interrupted` after the
server died. Jobs run in the server that accepted them; the store is what any replica reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import make_url

from harness_env.core.phases import EventSink
from harness_env.core.pipeline import PreparedRollout
from harness_env.core.runner import Rollout, Runner, new_id
from harness_env.core.sandbox.base import SandboxFactory
from harness_env.core.serialisable import describe, failed_copy, repaired_copy
from harness_env.models import (
    ENDED_STATUSES,
    MAX_WAIT_S,
    Detail,
    JobEnd,
    JobStatus,
    PhaseEvent,
    RolloutAccepted,
    RolloutJob,
    RolloutListItem,
    RolloutPage,
    RolloutResult,
    RolloutSummary,
    ServedBy,
    summarize,
)
from harness_env.models.jobs import ended_status
from harness_env.server.placement import ray_placement
from harness_env.server.slots import RolloutSlots, ServerBusy
from harness_env.server.store import DataDirLock, DuplicateKey, Store, StoreWriter
from harness_env.server.store.store import request_blob

logger = logging.getLogger("harness_env.jobs")
POLL_S = 1.0  # how often a follower re-reads a job that runs on another replica (no local wake-up)
STOP_WAIT_S = 20.0  # how long a stopping server waits for its jobs' clean-up
CANCEL_WAIT_S = 15.0  # how long DELETE waits for the clean-up before answering
INTERRUPTED = "the server stopped while this rollout ran (it was restarted or shut down); submit it again"


@dataclass(eq=False)
class Job:
    """A job running in this server."""

    id: str
    prepared: PreparedRollout
    listener: EventSink | None = None
    task: asyncio.Task | None = None
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    next_seq: int = 0
    cancelling: bool = False
    interrupting: bool = False


class Notifier:
    """Wakes whoever follows a job when something of it was written."""

    def __init__(self) -> None:
        self._events: weakref.WeakValueDictionary[str, asyncio.Event] = weakref.WeakValueDictionary()

    def waiter(self, job_id: str) -> asyncio.Event:
        ev = self._events.get(job_id)
        if ev is None:
            ev = self._events[job_id] = asyncio.Event()
        return ev

    def notify(self, job_ids: set[str]) -> None:
        for job_id in job_ids:
            ev = self._events.pop(job_id, None)
            if ev is not None:
                ev.set()


async def wait_for_change(ev: asyncio.Event, timeout: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ev.wait(), timeout)


class JobManager:
    """Submits, runs, cancels and reads jobs; owns the store while the app runs (start/stop). Each
    job runs on `runner` (core/runner.py, as every face's rollouts), which waits in `slots`."""

    def __init__(self, runner: Runner, slots: RolloutSlots, store_url: str) -> None:
        self.runner = runner
        self.slots = slots
        self.store_url = store_url
        self.instance = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.served_by = ServedBy(host=self.host, instance=self.instance, **ray_placement())
        self.local: dict[str, Job] = {}
        self.notifier = Notifier()
        self.store: Store | None = None
        self.writer: StoreWriter | None = None
        self.exclusive = True  # a SQLite store has one server (DataDirLock): every other server's running job is dead
        self._lock: DataDirLock | None = None
        self._stopping = False
        # Told of every job that ends here (id, status, result), before it is stored: the metrics
        # and the rollout log line (server/metrics.py). It must not raise.
        self.on_end: Callable[[str, JobStatus, RolloutResult], None] | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        url = make_url(self.store_url)
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            self._lock = DataDirLock(Path(url.database).parent)  # makes the directory, refuses a second server
        self.store = store = await asyncio.to_thread(Store.open, self.store_url)
        self.exclusive = store.is_sqlite
        await asyncio.to_thread(store.register_instance, self.instance, self.host, os.getpid(), time.time())
        self.writer = StoreWriter(store, self.notifier.notify)
        self.writer.start()

    async def stop(self) -> None:
        """Interrupt the jobs still here (their clean-up runs), store how they ended, close."""
        self._stopping = True
        for job in list(self.local.values()):
            job.interrupting = True
            self.cancel_local(job)
        tasks = [j.task for j in self.local.values() if j.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_WAIT_S)
        if self.writer is not None:
            await self.writer.close()
        if self.store is not None:
            await asyncio.to_thread(self.store.remove_instance, self.instance)
            await asyncio.to_thread(self.store.close)
        if self._lock is not None:
            self._lock.release()

    def _store(self) -> tuple[Store, StoreWriter]:
        if self.store is None or self.writer is None or self._stopping:
            raise ServerBusy("the server is starting or stopping; retry in a moment")
        return self.store, self.writer

    # -- submitting ----------------------------------------------------------------------------
    async def existing(self, key: str) -> RolloutAccepted | None:
        """The job an idempotency key names, if there is one."""
        store, _ = self._store()
        job_id = await asyncio.to_thread(store.id_for_key, key)
        if job_id is None:
            return None
        return RolloutAccepted(rollout_id=job_id, status=await asyncio.to_thread(store.status, job_id) or "queued", created=False)

    async def submit(self, prepared: PreparedRollout, *, key: str | None = None, listener: EventSink | None = None) -> RolloutAccepted:
        """Admit, store, start. Raises ServerBusy beyond the queue; with a key already used, the
        job it named (nothing new runs)."""
        store, _ = self._store()
        self.slots.admit()
        job = Job(new_id(), prepared, listener)
        self.local[job.id] = job
        # Shielded: once the job is being stored it starts, even if this caller goes away; a
        # called job's caller then cancels it (run_attached).
        return await asyncio.shield(asyncio.ensure_future(self._accept(job, key)))

    async def _accept(self, job: Job, key: str | None) -> RolloutAccepted:
        store, writer = self._store()
        request = job.prepared.request
        row = {
            "id": job.id,
            "status": "queued",
            "created_at": time.time(),
            "task_id": request.task.task_id,
            "harness": job.prepared.harness.name,
            "model": request.endpoint.model or "",
            "idempotency_key": key,
            "instance": self.instance,
            "request": request_blob(request.model_dump(mode="json")),
        }  # the key masked by SecretStr
        try:
            stored_as = await writer.call(job.id, store.insert_job, row, new_id)
        except BaseException as e:
            self.slots.release_admission()
            self.local.pop(job.id, None)
            job.done.cancel()
            if isinstance(e, DuplicateKey) and key is not None:
                found = await self.existing(key)
                if found is not None:
                    return found
            raise
        if stored_as != job.id:
            self.local[stored_as] = self.local.pop(job.id)
            job.id = stored_as
        job.task = asyncio.create_task(self._run(job), name=f"rollout-{job.id}")
        if job.cancelling:  # its caller went away while it was being stored
            job.task.cancel()
        return RolloutAccepted(rollout_id=job.id, status="queued", created=True)

    async def run_attached(self, prepared: PreparedRollout, on_event: EventSink | None = None) -> RolloutResult:
        """A called rollout: submitted, then waited for; the caller going away cancels it."""
        accepted = await self.submit(prepared, listener=on_event)
        job = self.local.get(accepted.rollout_id)
        try:
            if job is None:
                raise ServerBusy("the rollout could not be started; retry")
            return await asyncio.shield(job.done)
        except asyncio.CancelledError:
            if job is not None:
                self.cancel_local(job)
            raise

    # -- running -------------------------------------------------------------------------------
    def _on_event(self, job: Job, ev: PhaseEvent) -> None:
        assert self.writer is not None
        self.writer.post_event((job.id, job.next_seq, time.time(), ev.model_dump_json()))
        job.next_seq += 1
        if job.listener is not None:
            job.listener(ev)

    def _factory(self, job: Job) -> SandboxFactory:
        base, writer = self.runner.sandbox_factory, self.writer
        assert writer is not None and self.store is not None
        store = self.store

        def make(**kw):
            sandbox = base(**kw)
            # Where its directory is, so a server starting after this one died can remove it.
            writer.post(job.id, store.set_sandbox, job.id, str(getattr(sandbox, "root", "")) or None)
            return sandbox

        return make  # type: ignore[return-value]

    async def _run(self, job: Job) -> None:
        store, writer = self.store, self.writer
        assert store is not None and writer is not None
        rollout: Rollout = self.runner.rollout(job.prepared, lambda ev: self._on_event(job, ev), rollout_id=job.id, sandbox_factory=self._factory(job))
        cancelled = False
        try:
            result = await rollout.execute(admitted=True, on_running=lambda: writer.post(job.id, store.mark_running, job.id, time.time()))
        except asyncio.CancelledError:  # DELETE, the caller gone, or the server stopping
            cancelled = True
            result = rollout.result
        except Exception as e:  # never expected (the engine returns failures as data)
            logger.exception("rollout %s failed outside the engine", job.id)
            result = rollout.result
            result.error, result.error_kind, result.reward = f"internal error ({type(e).__name__})", "internal", None
        result.served_by = self.served_by
        status: JobStatus = ended_status(result)
        if job.interrupting:
            status, result.error, result.error_kind, result.reward = "interrupted", INTERRUPTED, "internal", None
        elif cancelled:
            status = "cancelled"
        if self.on_end is not None:
            try:
                self.on_end(job.id, status, result)
            except Exception:
                logger.exception("could not count the end of rollout %s", job.id)
        end = asyncio.ensure_future(self._store_end(job, status, result))
        try:
            try:
                result = await asyncio.shield(end)
            except asyncio.CancelledError:  # a DELETE as it ended: its end is written all the same
                result = await end
        finally:
            self.local.pop(job.id, None)
            if not job.done.done():
                job.done.set_result(result)

    async def _finish(self, job: Job, status: JobStatus, result: RolloutResult) -> None:
        store, writer = self.store, self.writer
        assert store is not None and writer is not None
        summary = await asyncio.to_thread(lambda: summarize(result).model_dump_json())  # walks every turn: off the loop
        await writer.call(job.id, store.finish, job.id, status, result, summary, time.time())

    async def _store_end(self, job: Job, status: JobStatus, result: RolloutResult) -> RolloutResult:
        """Store how the job ended, whatever fails on the way, and return the result as stored (what
        its caller is given): a result that does not serialise is stored made serialisable; one the
        store refuses ends the job `failed` with why, with its result if the store takes that, else
        its row alone. A job never stays `running` because its end could not be written."""
        try:
            await self._finish(job, status, result)
            return result
        except Exception as e:
            logger.exception("could not store the result of rollout %s", job.id)
            problem: Exception = e
        # None: it serialised (the store itself refused it), or no copy of it does.
        repaired = await asyncio.to_thread(repaired_copy, result)
        if repaired is not None:
            try:
                await self._finish(job, status, repaired)
                return repaired
            except Exception as e:
                logger.exception("could not store the repaired result of rollout %s", job.id)
                problem = e
        failed = failed_copy(result, f"the result could not be stored ({describe(problem)})")
        try:
            await self._finish(job, "failed", failed)
            return failed
        except Exception:
            logger.exception("could not store the failure of rollout %s", job.id)
        assert self.store is not None and self.writer is not None and failed.error is not None
        try:
            await self.writer.call(job.id, self.store.end_without_result, job.id, "failed", failed.error, time.time())
        except Exception:
            logger.exception("could not end rollout %s in the store", job.id)
        return failed

    def cancel_local(self, job: Job) -> None:
        """Cancel a job of this server once (a second cancel would cut its clean-up short)."""
        if job.cancelling:
            return
        job.cancelling = True
        if job.task is not None:
            job.task.cancel()

    async def cancel(self, job_id: str) -> RolloutJob | None:
        """Cancel a job wherever it runs; here, wait for its clean-up (up to CANCEL_WAIT_S)."""
        store, writer = self._store()
        job = self.local.get(job_id)
        if job is not None:
            self.cancel_local(job)
            if job.task is not None:
                await asyncio.wait({job.task}, timeout=CANCEL_WAIT_S)
        elif await asyncio.to_thread(store.status, job_id) is None:
            return None
        else:  # another replica's: it polls for the request (server/jobs/upkeep.py)
            await writer.call(job_id, store.request_cancel, job_id)
        return await self.get(job_id)

    # -- reading -------------------------------------------------------------------------------
    async def get(self, job_id: str, detail: Detail = "summary", wait_s: float = 0.0) -> RolloutJob | None:
        """The job's state; `wait_s`: wait up to that long (MAX_WAIT_S at most) for it to end."""
        store, _ = self._store()
        deadline = time.monotonic() + min(max(wait_s, 0.0), MAX_WAIT_S)
        while True:
            waiter = self.notifier.waiter(job_id)
            row = await asyncio.to_thread(store.get, job_id)
            left = deadline - time.monotonic()
            if row is None or row["status"] in ENDED_STATUSES or left <= 0:
                break
            await wait_for_change(waiter, min(left, POLL_S))
        if row is None:
            return None
        phases = await asyncio.to_thread(store.phases, job_id)
        job = RolloutJob(**list_item(row).model_dump(), error=row["error"], phases=phases, events=row["next_event"])
        if row["summary"]:
            job.summary = RolloutSummary.model_validate_json(row["summary"])
        if detail == "full" and job.ended:
            job.result = await asyncio.to_thread(store.load_result, job_id)
        return job

    async def list(self, *, statuses: list[str], task_id: str | None, harness: str | None, before: int | None, limit: int) -> RolloutPage:
        store, _ = self._store()
        rows = await asyncio.to_thread(store.list, statuses=statuses, task_id=task_id, harness=harness, before=before, limit=limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        return RolloutPage(items=[list_item(r) for r in rows], next_cursor=str(rows[-1]["seq"]) if more else None)

    async def follow(self, job_id: str, after: int = -1) -> AsyncIterator[tuple[int, str] | JobEnd | None]:
        """The job's events after seq `after` as they are stored ((seq, PhaseEvent JSON)), then
        how it ended. Replays what is stored, then follows; ends when the job has ended. None:
        a while passed with nothing new (a stream's keep-alive)."""
        store, _ = self._store()
        while True:
            waiter = self.notifier.waiter(job_id)
            rows = await asyncio.to_thread(store.events_after, job_id, after)
            for seq, data in rows:
                yield seq, data
                after = seq
            if rows:
                continue
            row = await asyncio.to_thread(store.get, job_id)
            if row is None:
                return
            if row["status"] in ENDED_STATUSES:
                if await asyncio.to_thread(store.events_after, job_id, after, 1):
                    continue  # written between the two reads
                yield JobEnd(rollout_id=job_id, status=row["status"], reward=row["reward"], error_kind=row["error_kind"], error=row["error"])
                return
            await wait_for_change(waiter, POLL_S if job_id not in self.local else 15.0)
            yield None


def list_item(row: dict) -> RolloutListItem:
    return RolloutListItem(
        rollout_id=row["id"],
        status=row["status"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        task_id=row["task_id"],
        harness=row["harness"] or "",
        model=row["model"] or "",
        reward=row["reward"],
        error_kind=row["error_kind"],
        wall_s=row["wall_s"],
    )
