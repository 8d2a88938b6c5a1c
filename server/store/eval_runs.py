"""Eval runs in the store: what `harness-env eval` records (the run, each attempt as a rollout
linked to it) and what the web UI's Evals view reads back.

An attempt is stored as a rollout row like a job's (its request with the key masked, its result,
its summary), plus `eval_run` and `eval_attempt`. Against a server whose store is this one, the
job's own row is linked instead of a second row being made.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import orjson
from sqlalchemy import insert, select, update

from harness_env.models import RolloutRequest, RolloutResult, summarize
from harness_env.models.jobs import ended_status
from harness_env.server.store.schema import eval_runs, rollouts
from harness_env.server.store.store import Store, request_blob

RUN_COLUMNS = [c for c in eval_runs.c if c.name != "summary"]
ATTEMPT_COLUMNS = (
    rollouts.c.id,
    rollouts.c.task_id,
    rollouts.c.eval_attempt,
    rollouts.c.status,
    rollouts.c.reward,
    rollouts.c.error_kind,
    rollouts.c.error,
    rollouts.c.wall_s,
    rollouts.c.ended_at,
)


def options_of(request: RolloutRequest) -> dict[str, Any]:
    """The request's options: neither its task nor its endpoint (whose key must never be stored)."""
    return request.model_dump(mode="json", exclude={"task", "endpoint"}, exclude_none=True)


class EvalRecorder:
    """Writes one eval run and its attempts (synchronous: the caller runs it off its event loop)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.run_id = ""

    def begin(
        self, run_id: str, out_dir: str, first: RolloutRequest | None, tasks: list[str], attempts: int, threshold: float, servers: list[str] | None
    ) -> None:
        """Create the run, or mark a resumed one running again with what it evaluates now."""
        self.run_id, now = run_id, time.time()
        values = {
            "updated_at": now,
            "status": "running",
            "out_dir": out_dir,
            "tasks": json.dumps(tasks),
            "attempts": attempts,
            "threshold": threshold,
            "servers": json.dumps(servers) if servers else None,
            "harness": first.harness if first else "",
            "model": first.endpoint.model if first else "",
            "base_url": first.endpoint.base_url if first else None,
            "options": json.dumps(options_of(first) if first else {}),
        }
        with self.store.engine.begin() as conn:
            if conn.execute(select(eval_runs.c.id).where(eval_runs.c.id == run_id)).first() is None:
                conn.execute(insert(eval_runs).values(id=run_id, created_at=now, **values))
            else:
                conn.execute(update(eval_runs).where(eval_runs.c.id == run_id).values(**values))

    def recorded(self) -> set[tuple[str, int]]:
        """(task id, attempt) of the attempts stored already (a resumed run records only the others)."""
        with self.store.engine.connect() as conn:
            q = select(rollouts.c.task_id, rollouts.c.eval_attempt).where(rollouts.c.eval_run == self.run_id)
            return {(r.task_id, r.eval_attempt) for r in conn.execute(q)}

    def attempt(self, task_id: str, attempt: int, request: RolloutRequest, result: RolloutResult) -> None:
        """Store one finished attempt as a rollout of this run."""
        rid = result.rollout_id or uuid.uuid4().hex[:12]
        if self.store.get(rid) is None:  # else: the job of a server that shares this store
            # Inserted ended: a server sharing the store never sees it active (it would take it for a dead server's job).
            now, status = time.time(), ended_status(result)
            row = {
                "id": rid,
                "status": status,
                "ended_at": now,
                "created_at": now - (result.wall_s or 0.0),
                "started_at": now - (result.wall_s or 0.0),
                "task_id": task_id,
                "harness": result.harness or request.harness,
                "model": request.endpoint.model,
                "instance": "eval",
                "request": request_blob(request.model_dump(mode="json")),
            }  # the key masked by SecretStr
            rid = self.store.insert_job(row, lambda: uuid.uuid4().hex[:12])
            self.store.finish(rid, status, result, summarize(result).model_dump_json(), now)
        with self.store.engine.begin() as conn:
            conn.execute(update(rollouts).where(rollouts.c.id == rid).values(eval_run=self.run_id, eval_attempt=attempt, task_id=task_id))

    def end(self, status: str, summary: dict[str, Any]) -> None:
        with self.store.engine.begin() as conn:
            conn.execute(update(eval_runs).where(eval_runs.c.id == self.run_id).values(status=status, updated_at=time.time(), summary=json.dumps(summary)))


# -- reads (the Evals view) ------------------------------------------------------------------------
def list_runs(store: Store, limit: int = 100) -> list[dict[str, Any]]:
    """The eval runs, newest first, with their tasks as a list."""
    with store.engine.connect() as conn:
        rows = conn.execute(select(*RUN_COLUMNS).order_by(eval_runs.c.seq.desc()).limit(limit)).mappings().all()
    return [_run(dict(r)) for r in rows]


def get_run(store: Store, run_id: str) -> dict[str, Any] | None:
    with store.engine.connect() as conn:
        row = conn.execute(select(*RUN_COLUMNS).where(eval_runs.c.id == run_id)).mappings().first()
    return _run(dict(row)) if row is not None else None


def _run(row: dict[str, Any]) -> dict[str, Any]:
    row["tasks"], row["options"] = json.loads(row["tasks"]), json.loads(row["options"])
    row["servers"] = json.loads(row["servers"]) if row["servers"] else None
    return row


def run_attempts(store: Store, run_id: str) -> list[dict[str, Any]]:
    """The run's attempts (rollout rows), by task and attempt."""
    q = select(*ATTEMPT_COLUMNS).where(rollouts.c.eval_run == run_id).order_by(rollouts.c.task_id, rollouts.c.eval_attempt)
    with store.engine.connect() as conn:
        return [dict(r) for r in conn.execute(q).mappings()]


def stored_summary(store: Store, run_id: str) -> dict[str, Any] | None:
    """summary.json as the run last wrote it (None until it ended once)."""
    with store.engine.connect() as conn:
        text = conn.execute(select(eval_runs.c.summary).where(eval_runs.c.id == run_id)).scalar()
    return orjson.loads(text) if text else None
