"""Wire types, part 5: rollouts as jobs (POST /rollouts, GET /rollouts[/{id}[/events]], the MCP
tools submit_rollout and get_rollout, the client's submit/get/wait/events). Import them from
`harness_env.models`.

Every rollout a server runs is a job kept in its store, whether it was submitted (and runs
whether or not its caller stays) or called (POST /rollout, run_rollout: the caller waits, and
going away cancels it). A job's status says where it is; once it ends its result is stored.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field

from harness_env.models.results import ErrorKind, PhaseEvent, RolloutResult
from harness_env.models.summary import RolloutSummary

JobStatus = Literal["queued", "running", "finished", "failed", "cancelled", "interrupted"]
# finished: ran to its end and was graded, or had nothing to grade (whatever the reward; `error`
# may say how the agent's run ended: a timeout, a harness that died); failed: ended with an error
# and no reward (the endpoint, the sandbox or the server failed; error and error_kind say which);
# cancelled: DELETE, or its caller went away;
# interrupted: the server stopped or died while it was queued or running (reward None).
ACTIVE_STATUSES: tuple[JobStatus, ...] = ("queued", "running")
ENDED_STATUSES: tuple[JobStatus, ...] = ("finished", "failed", "cancelled", "interrupted")
MAX_IDEMPOTENCY_KEY_CHARS = 200
MAX_LIST_LIMIT = 500
MAX_WAIT_S = 60.0  # the longest GET /rollouts/{id}?wait= and get_rollout's wait_s hold a call open
ROLLOUT_ID_PATTERN = r"^[0-9a-f]{1,32}$"  # what a server makes (12 hex digits) and accepts


def is_rollout_id(value: Any) -> bool:
    """Whether `value` can be a rollout's id at all (a string that is not names no rollout)."""
    return isinstance(value, str) and re.fullmatch(ROLLOUT_ID_PATTERN, value) is not None


def ended_status(result: RolloutResult) -> JobStatus:
    """How a rollout that returned its result ended: the one rule every face shows (the store,
    the Rollouts tab, the Run tab's history). An end the agent brought about is graded, so it
    is `finished`, its error saying how; an error with no reward is `failed`, a cancel `cancelled`."""
    if result.error_kind == "cancelled":
        return "cancelled"
    return "failed" if result.error is not None and result.reward is None else "finished"


class RolloutAccepted(BaseModel):
    """The answer to a submission: the job's id (the result's `rollout_id` too)."""

    rollout_id: str
    status: JobStatus
    created: bool = Field(True, description="false: the idempotency key named a job submitted before, whose id this is")


class RolloutListItem(BaseModel):
    """One stored rollout in a listing: what a table row shows."""

    rollout_id: str
    status: JobStatus
    created_at: float = Field(description="when the server accepted it (Unix time)")
    started_at: float | None = None
    ended_at: float | None = None
    task_id: str | None = None
    harness: str = ""
    model: str = ""
    reward: float | None = None
    error_kind: ErrorKind | None = None
    wall_s: float | None = None


class RolloutPage(BaseModel):
    """A page of a listing, newest first; `next_cursor` (as `before=`) fetches the next page."""

    items: list[RolloutListItem]
    next_cursor: str | None = None


class RolloutJob(RolloutListItem):
    """A job's state: its status, the phases so far and, once it ended, its result (the summary;
    the whole result too when asked for with detail=full)."""

    error: str | None = None
    phases: list[PhaseEvent] = Field(default_factory=list, description="phase events so far (started, finished, failed)")
    events: int = Field(0, description="events stored so far (GET /rollouts/{id}/events replays them)")
    summary: RolloutSummary | None = None
    result: RolloutResult | None = None

    @property
    def ended(self) -> bool:
        return self.status in ENDED_STATUSES


class JobEnd(BaseModel):
    """The last event of GET /rollouts/{id}/events (`event: end`): how the job ended."""

    rollout_id: str
    status: JobStatus
    reward: float | None = None
    error_kind: ErrorKind | None = None
    error: str | None = None
