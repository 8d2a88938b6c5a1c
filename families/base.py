"""What a task family provides: how its tasks become what the agent gets, and how a submission
is graded (instead of shell verify commands)."""

from __future__ import annotations

from typing import Protocol

from harness_env.core.grading import Grader
from harness_env.models import RolloutRequest


class TaskFamily(Protocol):
    name: str

    def prepare(self, request: RolloutRequest, *, trusted: bool) -> RolloutRequest:
        """Validate `request.family_options` and return the request with the task the agent gets
        (instruction, files, tools). `trusted`: the caller may name server-side paths (the CLI,
        the in-process API); a remote caller may not, beyond the configured data directory.
        Raises InvalidRequestError with a clear message."""
        ...

    def grader(self, request: RolloutRequest) -> Grader: ...
