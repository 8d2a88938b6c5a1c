"""What the engine needs from a task family's grader (families/*): grading a submission in the
sandbox instead of running verify commands. Core only defines the shape; the entry points (the
in-process API, the server) look the family up and hand its grader to the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from harness_env.core.sandbox.base import Sandbox
from harness_env.models import RolloutRequest


@dataclass
class GradeOutcome:
    reward: float | None
    source: str | None  # "judge", "zero_check", ...
    notes: list[str] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # an infrastructure failure (reward None): the judge was unreachable, say
    # `error` is one the submission can cause (a judge that answers without scores): the reward stands.
    agent_caused: bool = False


class Grader(Protocol):
    async def grade(self, sandbox: Sandbox, request: RolloutRequest) -> GradeOutcome: ...
