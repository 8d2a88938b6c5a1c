"""What a task family provides: how its tasks become what the agent gets, how a submission is
graded (instead of shell verify commands), and how its task records read (so the CLI and
`harness-env eval` take them without knowing the family)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from harness_env.core.grading import Grader
from harness_env.models import RolloutRequest

if TYPE_CHECKING:
    from pydantic import BaseModel


@dataclass(frozen=True)
class FamilyExample:
    """A task of the family that the web form offers to load: what the agent is asked, and the options."""

    name: str
    instruction: str
    family_options: dict[str, Any] = field(default_factory=dict)


class TaskFamily(Protocol):
    name: str
    example: FamilyExample | None  # offered by the web form beside the shell examples
    # Its family_options, declared once: the web form derives its controls from the fields (title,
    # description, default; a field's json_schema_extra "example" shows in an empty JSON box) and
    # shows the model's docstring above them.
    options_model: type[BaseModel]
    instruction_label: str  # what the web form calls the instruction of this family's task
    # A record of the family: a task file's object with `task_family`, or a line of a tasks.jsonl
    # (without `task_family`: the first family whose instruction_key it has, and no `instruction`).
    instruction_key: str  # the key holding what the agent is asked: the task's instruction
    record_keys: tuple[str, ...]  # the keys a record without `task_family` passes on (others: its own data, dropped)
    request_keys: tuple[str, ...]  # record keys that are request fields (its own limits), unless the caller gives them
    path_keys: tuple[str, ...]  # family option keys naming a file, relative to the record's file when not absolute

    def prepare(self, request: RolloutRequest, *, trusted: bool) -> RolloutRequest:
        """Validate `request.family_options` and return the request with the task the agent gets
        (instruction, files, tools). `trusted`: the caller may name server-side paths (the CLI,
        the in-process API); a remote caller may not, beyond the configured data directory.
        Raises InvalidRequestError with a clear message."""
        ...

    def grader(self, request: RolloutRequest) -> Grader: ...

    def reference_image(self, family_options: dict[str, Any]) -> str | None:
        """The server-side PNG the grading tab shows beside the submission, from a prepared
        request's family_options (the path prepare checked; never sent to the page); None: none."""
        ...
