"""The store's tables (SQLAlchemy Core): one schema for SQLite and PostgreSQL.

- rollouts: one row per job, with what a listing filters and shows (status, task, harness, reward,
  times) as columns, its summary (16 KB at most) as JSON and its request compressed;
- events: the job's phase events, one row each, in order (`seq`), as they happened;
- results / result_turns: its result once it ended, compact: storage.pack's linear form (each
  turn only what it adds to the turn it continues), the turns one row each, every part
  compressed, so a 40-turn result is neither a quadratic JSON blob nor one huge row;
- instances: the servers using the store (a heartbeat each), so a server starting, or a replica
  sharing a PostgreSQL store, can tell which running jobs lost their server;
- eval_runs: one row per `harness-env eval` run (what it evaluated: tasks, harness, endpoint without
  its key, options, attempts); its attempts are rollouts rows whose `eval_run` names it.

Schema 2 added eval_runs and rollouts.eval_run / eval_attempt; Store.create migrates a schema 1 store.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Column, Float, Index, Integer, LargeBinary, MetaData, String, Table, Text

SCHEMA_VERSION = 2
metadata = MetaData()

meta = Table("harness_env_meta", metadata, Column("key", String(64), primary_key=True), Column("value", String(256), nullable=False))

rollouts = Table(
    "rollouts",
    metadata,
    # The order of acceptance: newest first is seq descending, and the listing's cursor. SQLite's
    # AUTOINCREMENT never reuses a removed row's number, so a cursor stays valid under retention.
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(32), nullable=False, unique=True),
    Column("status", String(16), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("started_at", Float),
    Column("ended_at", Float),
    Column("task_id", String(256)),
    Column("harness", String(64), nullable=False, default=""),
    Column("model", String(256), nullable=False, default=""),
    Column("reward", Float),
    Column("error_kind", String(32)),
    Column("error", Text),
    Column("wall_s", Float),
    Column("idempotency_key", String(200), unique=True),
    Column("instance", String(64), nullable=False),  # the server running it
    Column("sandbox_dir", Text),  # its local sandbox while it runs: cleaned up if its server dies
    Column("cancel_requested", Boolean, nullable=False, default=False),  # DELETE on another replica
    Column("next_event", Integer, nullable=False, default=0),
    Column("summary", Text),  # RolloutSummary JSON
    Column("request", LargeBinary),  # the prepared request (JSON, zlib), its key masked
    Column("stored_bytes", BigInteger, nullable=False, default=0),  # what retention counts
    Column("eval_run", String(32)),  # the eval run this rollout is an attempt of (eval_runs.id)
    Column("eval_attempt", Integer),  # which attempt of its task (0-based)
    sqlite_autoincrement=True,
)
Index("rollouts_status_seq", rollouts.c.status, rollouts.c.seq)
Index("rollouts_task_seq", rollouts.c.task_id, rollouts.c.seq)
Index("rollouts_harness_seq", rollouts.c.harness, rollouts.c.seq)
Index("rollouts_ended", rollouts.c.ended_at)
Index("rollouts_instance", rollouts.c.instance, rollouts.c.status)
Index("rollouts_eval_run", rollouts.c.eval_run, rollouts.c.task_id)
# Columns added after schema 1, with the version that added them: Store.create adds them to an older store.
ADDED_COLUMNS = {2: (rollouts.c.eval_run, rollouts.c.eval_attempt)}

events = Table(
    "events",
    metadata,
    Column("rollout_id", String(32), primary_key=True),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("at", Float, nullable=False),
    Column("data", Text, nullable=False),  # PhaseEvent JSON
)

results = Table(
    "results",
    metadata,
    Column("rollout_id", String(32), primary_key=True),
    Column("encoding", String(32), nullable=False),
    Column("header", LargeBinary, nullable=False),  # the packed result but its turns
)

result_turns = Table(
    "result_turns",
    metadata,
    Column("rollout_id", String(32), primary_key=True),
    Column("position", Integer, primary_key=True, autoincrement=False),
    Column("body", LargeBinary, nullable=False),  # one packed turn
)

instances = Table(
    "instances",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("host", String(256), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", Float, nullable=False),
    Column("heartbeat_at", Float, nullable=False),
)

eval_runs = Table(
    "eval_runs",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),  # newest first is seq descending
    Column("id", String(32), nullable=False, unique=True),  # the run's key (eval.json's run_key), kept across resumes
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("status", String(16), nullable=False),  # running, finished (every attempt ran), stopped
    Column("out_dir", Text, nullable=False),
    Column("harness", String(64), nullable=False),
    Column("model", String(256), nullable=False),
    Column("base_url", Text),  # the endpoint, never its key
    Column("servers", Text),  # JSON list of the harness-env servers it ran on, or null (in process)
    Column("tasks", Text, nullable=False),  # JSON list of task ids, in order
    Column("options", Text, nullable=False),  # JSON: the first request's options (no task, no endpoint)
    Column("attempts", Integer, nullable=False),
    Column("threshold", Float, nullable=False),
    Column("summary", Text),  # summary.json as last written
    sqlite_autoincrement=True,
)
