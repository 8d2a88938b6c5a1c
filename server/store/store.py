"""The job store: jobs, their events and results in SQLite or PostgreSQL, through SQLAlchemy Core.

Synchronous on purpose: the server calls it off the event loop (reads in worker threads, writes
from one writer, server/store/writer.py), and a tool reading a data directory needs no loop.
Every method is one transaction. SQLite runs in WAL mode (readers never wait for the writer; a
killed process loses nothing committed and never corrupts the file) with incremental vacuum, so
the file shrinks when retention removes results.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import Engine, create_engine, delete, event, func, insert, inspect, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from harness_env.models import ACTIVE_STATUSES, ENDED_STATUSES, RolloutResult
from harness_env.server.store import schema
from harness_env.server.store.codec import ENCODING, compress, decode_result, encode_result
from harness_env.server.store.schema import events, instances, meta, result_turns, results, rollouts

MAX_ERROR_CHARS = 2000  # the row keeps the error's head; the whole text is in the result
LIST_COLUMNS = (
    rollouts.c.seq,
    rollouts.c.id,
    rollouts.c.status,
    rollouts.c.created_at,
    rollouts.c.started_at,
    rollouts.c.ended_at,
    rollouts.c.task_id,
    rollouts.c.harness,
    rollouts.c.model,
    rollouts.c.reward,
    rollouts.c.error_kind,
    rollouts.c.wall_s,
)


class DuplicateKey(Exception):
    """A job with this idempotency key exists already."""


class StoreError(Exception):
    """The store cannot be opened or used as it is (a bad URL, a newer schema)."""


@dataclass(frozen=True)
class Orphan:
    """An active job whose server is gone."""

    id: str
    task_id: str | None
    harness: str
    host: str | None  # the dead server's host (None: unknown)
    sandbox_dir: str | None


def make_engine(url: str) -> Engine:
    """An engine for a `sqlite:///path` or `postgresql://...` URL (psycopg 3 as the driver)."""
    u = make_url(url)
    backend = u.get_backend_name()
    if backend == "sqlite":
        # check_same_thread off: the pool hands a connection to whichever worker thread asks.
        engine = create_engine(u, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            for pragma in ("auto_vacuum=INCREMENTAL", "journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=30000"):
                cur.execute(f"PRAGMA {pragma}")  # auto_vacuum takes effect only on a new file: before its tables
            cur.close()

        return engine
    if backend == "postgresql":
        if u.drivername == "postgresql":
            u = u.set(drivername="postgresql+psycopg")
        return create_engine(u, pool_pre_ping=True, pool_size=5, max_overflow=10)
    raise StoreError(f"store URL {u.render_as_string(hide_password=True)!r}: use sqlite:///PATH or postgresql://USER@HOST/DB")


class Store:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.is_sqlite = engine.dialect.name == "sqlite"

    @classmethod
    def open(cls, url: str) -> Store:
        store = cls(make_engine(url))
        store.create()
        return store

    def create(self) -> None:
        """The tables, made if missing (several replicas may start at once: one wins, the others
        find them); a store written by a newer schema is refused."""
        for attempt in range(3):
            try:
                schema.metadata.create_all(self.engine)
                with self.engine.begin() as conn:
                    version = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version")).scalar()
                    if version is None:
                        conn.execute(insert(meta).values(key="schema_version", value=str(schema.SCHEMA_VERSION)))
                break
            except (IntegrityError, ProgrammingError, OperationalError):
                if attempt == 2:
                    raise
        if version is not None and int(version) > schema.SCHEMA_VERSION:
            raise StoreError(f"the store was written by a newer harness-env (schema {version}; this one knows {schema.SCHEMA_VERSION})")
        if version is not None and int(version) < schema.SCHEMA_VERSION:
            self._migrate(int(version))

    def _migrate(self, version: int) -> None:
        """Bring a store of an older schema up to this one: add the columns (and their index) later
        versions added. Replicas starting at once may race: a column another one added is fine."""
        for added in range(version + 1, schema.SCHEMA_VERSION + 1):
            for column in schema.ADDED_COLUMNS.get(added, ()):
                if column.name in {c["name"] for c in inspect(self.engine).get_columns(column.table.name)}:
                    continue
                kind = column.type.compile(dialect=self.engine.dialect)
                try:
                    with self.engine.begin() as conn:
                        conn.exec_driver_sql(f"ALTER TABLE {column.table.name} ADD COLUMN {column.name} {kind}")
                except (OperationalError, ProgrammingError):
                    if column.name not in {c["name"] for c in inspect(self.engine).get_columns(column.table.name)}:
                        raise
        with self.engine.begin() as conn:
            for index in schema.rollouts.indexes:
                index.create(conn, checkfirst=True)
            conn.execute(update(meta).where(meta.c.key == "schema_version").values(value=str(schema.SCHEMA_VERSION)))

    def close(self) -> None:
        self.engine.dispose()

    # -- servers -------------------------------------------------------------------------------
    def register_instance(self, instance: str, host: str, pid: int, now: float) -> None:
        with self.engine.begin() as conn:
            conn.execute(insert(instances).values(id=instance, host=host, pid=pid, started_at=now, heartbeat_at=now))

    def heartbeat(self, instance: str, now: float) -> None:
        with self.engine.begin() as conn:
            conn.execute(update(instances).where(instances.c.id == instance).values(heartbeat_at=now))

    def remove_instance(self, instance: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(instances).where(instances.c.id == instance))

    def orphans(self, me: str, host: str, now: float, lease_s: float, exclusive: bool) -> list[Orphan]:
        """Active jobs whose server is gone: (exclusive, a store only this server uses) every other
        server's; else those of servers whose heartbeat is older than `lease_s`, or that ran on
        this host as a process that no longer exists. Servers gone with nothing left are forgotten."""
        with self.engine.begin() as conn:
            known = {r.id: r for r in conn.execute(select(instances))}
            dead = {i: r for i, r in known.items() if i != me and (exclusive or r.heartbeat_at < now - lease_s or (r.host == host and not _alive(r.pid)))}
            q = select(rollouts.c.id, rollouts.c.task_id, rollouts.c.harness, rollouts.c.instance, rollouts.c.sandbox_dir).where(
                rollouts.c.status.in_(ACTIVE_STATUSES), rollouts.c.instance != me
            )
            found = [
                Orphan(r.id, r.task_id, r.harness, dead[r.instance].host if r.instance in dead else None, r.sandbox_dir)
                for r in conn.execute(q)
                if r.instance in dead or r.instance not in known
            ]
            if dead:
                conn.execute(delete(instances).where(instances.c.id.in_(list(dead))))
        return found

    # -- jobs ----------------------------------------------------------------------------------
    def id_for_key(self, key: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(select(rollouts.c.id).where(rollouts.c.idempotency_key == key)).scalar()

    def insert_job(self, row: dict[str, Any], new_id: Callable[[], str] | None = None) -> str:
        """Store a new job; its id (`new_id()` makes another should the row's be taken). Raises
        DuplicateKey when its idempotency key is taken."""
        for _ in range(5):
            try:
                with self.engine.begin() as conn:
                    conn.execute(insert(rollouts).values(**row))
                return row["id"]
            except IntegrityError:
                if row.get("idempotency_key") and self.id_for_key(row["idempotency_key"]):
                    raise DuplicateKey(row["idempotency_key"]) from None
                if new_id is None or self.status(row["id"]) is None:
                    raise
                row = {**row, "id": new_id()}  # a short random id met an older one
        raise StoreError("could not find a free rollout id")

    def mark_running(self, job_id: str, now: float) -> None:
        with self.engine.begin() as conn:
            conn.execute(update(rollouts).where(rollouts.c.id == job_id, rollouts.c.status == "queued").values(status="running", started_at=now))

    def set_sandbox(self, job_id: str, path: str | None) -> None:
        with self.engine.begin() as conn:
            conn.execute(update(rollouts).where(rollouts.c.id == job_id).values(sandbox_dir=path))

    def append_events(self, rows: Sequence[tuple[str, int, float, str]]) -> None:
        """(job id, seq, time, PhaseEvent JSON) rows, in one transaction."""
        if not rows:
            return
        with self.engine.begin() as conn:
            conn.execute(insert(events), [{"rollout_id": i, "seq": s, "at": t, "data": d} for i, s, t, d in rows])
            for job_id, count in Counter(r[0] for r in rows).items():
                conn.execute(update(rollouts).where(rollouts.c.id == job_id).values(next_event=rollouts.c.next_event + count))

    def finish(self, job_id: str, status: str, result: RolloutResult, summary_json: str, now: float, *, only_if_active: bool = False) -> bool:
        """Store `result` and end the job with `status`; `only_if_active`: unless it ended already
        (returns False then). The job's own server wins over one that took it for dead."""
        header, turns = encode_result(result)
        with self.engine.begin() as conn:
            where = [rollouts.c.id == job_id] + ([rollouts.c.status.in_(ACTIVE_STATUSES)] if only_if_active else [])
            row = conn.execute(select(rollouts.c.request, rollouts.c.summary).where(*where)).first()
            if row is None:
                return False
            conn.execute(delete(result_turns).where(result_turns.c.rollout_id == job_id))
            conn.execute(delete(results).where(results.c.rollout_id == job_id))
            conn.execute(insert(results).values(rollout_id=job_id, encoding=ENCODING, header=header))
            if turns:
                conn.execute(insert(result_turns), [{"rollout_id": job_id, "position": i, "body": b} for i, b in enumerate(turns)])
            event_bytes = conn.execute(select(func.coalesce(func.sum(func.length(events.c.data)), 0)).where(events.c.rollout_id == job_id)).scalar()
            size = len(header) + sum(map(len, turns)) + len(row.request or b"") + len(summary_json) + int(event_bytes or 0)
            conn.execute(
                update(rollouts)
                .where(rollouts.c.id == job_id)
                .values(
                    status=status,
                    ended_at=now,
                    reward=result.reward,
                    error_kind=result.error_kind,
                    error=None if result.error is None else result.error[:MAX_ERROR_CHARS],
                    wall_s=result.wall_s,
                    summary=summary_json,
                    stored_bytes=size,
                    sandbox_dir=None,
                    **({"task_id": result.task_id} if result.task_id else {}),
                )
            )
        return True

    def end_without_result(self, job_id: str, status: str, error: str, now: float) -> None:
        """End the job with `status` and `error` but no stored result: the last resort when the
        store refused its result (a job must never stay running for ever)."""
        with self.engine.begin() as conn:
            conn.execute(
                update(rollouts)
                .where(rollouts.c.id == job_id)
                .values(status=status, ended_at=now, reward=None, error_kind="internal", error=error[:MAX_ERROR_CHARS], sandbox_dir=None)
            )

    def request_cancel(self, job_id: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(update(rollouts).where(rollouts.c.id == job_id, rollouts.c.status.in_(ACTIVE_STATUSES)).values(cancel_requested=True))

    def cancel_requests(self, instance: str) -> list[str]:
        with self.engine.connect() as conn:
            return list(
                conn.execute(
                    select(rollouts.c.id).where(rollouts.c.instance == instance, rollouts.c.cancel_requested.is_(True), rollouts.c.status.in_(ACTIVE_STATUSES))
                ).scalars()
            )

    # -- reads ---------------------------------------------------------------------------------
    def get(self, job_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(rollouts).where(rollouts.c.id == job_id)).mappings().first()
        return dict(row) if row is not None else None

    def status(self, job_id: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(select(rollouts.c.status).where(rollouts.c.id == job_id)).scalar()

    def events_after(self, job_id: str, after: int, limit: int = 500) -> list[tuple[int, str]]:
        """Events with seq > `after`, oldest first: (seq, PhaseEvent JSON)."""
        with self.engine.connect() as conn:
            q = select(events.c.seq, events.c.data).where(events.c.rollout_id == job_id, events.c.seq > after).order_by(events.c.seq).limit(limit)
            return [(r.seq, r.data) for r in conn.execute(q)]

    def phases(self, job_id: str) -> list[dict[str, Any]]:
        """The job's phase events but the `info` ones (model calls as they happen)."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(events.c.data).where(events.c.rollout_id == job_id).order_by(events.c.seq)).scalars()
            return [e for e in map(orjson.loads, rows) if e.get("status") != "info"]

    def load_result(self, job_id: str) -> RolloutResult | None:
        with self.engine.connect() as conn:
            head = conn.execute(select(results.c.encoding, results.c.header).where(results.c.rollout_id == job_id)).first()
            if head is None:
                return None
            turns = conn.execute(select(result_turns.c.body).where(result_turns.c.rollout_id == job_id).order_by(result_turns.c.position)).scalars().all()
        return decode_result(head.encoding, head.header, list(turns))

    def list(
        self, *, statuses: Iterable[str] = (), task_id: str | None = None, harness: str | None = None, before: int | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        """Newest first; `before`: a seq (the previous page's last)."""
        q = select(*LIST_COLUMNS)
        if statuses := list(statuses):
            q = q.where(rollouts.c.status.in_(statuses))
        if task_id is not None:
            q = q.where(rollouts.c.task_id == task_id)
        if harness is not None:
            q = q.where(rollouts.c.harness == harness)
        if before is not None:
            q = q.where(rollouts.c.seq < before)
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(q.order_by(rollouts.c.seq.desc()).limit(limit)).mappings()]

    # -- retention -----------------------------------------------------------------------------
    def total_bytes(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.coalesce(func.sum(rollouts.c.stored_bytes), 0))).scalar() or 0)

    def to_remove(self, *, older_than: float | None, max_bytes: int | None, batch: int = 500) -> list[str]:
        """Up to `batch` ended jobs to remove, oldest ended first: those that ended before
        `older_than`, then as many as bring the total under `max_bytes`. Never an active job."""
        ended = rollouts.c.status.in_(ENDED_STATUSES)
        with self.engine.connect() as conn:
            ids: list[str] = []
            if older_than is not None:
                ids = list(
                    conn.execute(select(rollouts.c.id).where(ended, rollouts.c.ended_at < older_than).order_by(rollouts.c.ended_at).limit(batch)).scalars()
                )
            if max_bytes is not None and len(ids) < batch:
                excess = int(conn.execute(select(func.coalesce(func.sum(rollouts.c.stored_bytes), 0))).scalar() or 0) - max_bytes
                q = select(rollouts.c.id, rollouts.c.stored_bytes).where(ended).order_by(rollouts.c.ended_at, rollouts.c.seq)
                for r in conn.execute(q.limit(batch * 4)) if excess > 0 else ():
                    if excess <= 0 or len(ids) >= batch:
                        break
                    if r.id not in ids:
                        ids.append(r.id)
                        excess -= r.stored_bytes
            return ids

    def remove(self, ids: Sequence[str]) -> None:
        """Remove ended jobs with everything stored about them (an active one is left alone)."""
        if not ids:
            return
        with self.engine.begin() as conn:
            gone = list(conn.execute(select(rollouts.c.id).where(rollouts.c.id.in_(ids), rollouts.c.status.in_(ENDED_STATUSES))).scalars())
            for table, col in ((events, events.c.rollout_id), (result_turns, result_turns.c.rollout_id), (results, results.c.rollout_id)):
                conn.execute(delete(table).where(col.in_(gone)))
            conn.execute(delete(rollouts).where(rollouts.c.id.in_(gone), rollouts.c.status.in_(ENDED_STATUSES)))

    def shrink(self) -> None:
        """Give the pages freed by removals back to the file system (SQLite; PostgreSQL's
        autovacuum does this itself)."""
        if self.is_sqlite:
            with self.engine.begin() as conn:
                conn.exec_driver_sql("PRAGMA incremental_vacuum")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this server is new: the one that had its pid is gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def request_blob(request_json: dict[str, Any]) -> bytes:
    return compress(request_json)
