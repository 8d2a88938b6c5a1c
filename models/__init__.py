"""Wire types shared by the engine, the server and the client (pydantic v2), in three modules:

- models/base.py: the bounds and checks every request obeys, Task, Endpoint;
- models/options.py: how a rollout runs (RolloutOptions, RolloutRequest, RolloutArgs, and
  HarnessOptions, the base of a harness's own options): each option declared once, as a field;
- models/results.py: what comes back (RolloutResult, Turn, TrainingRow, PhaseEvent, ...);
- models/summary.py: a result in at most 16 KB (RolloutSummary, summarize), for an agent;
- models/jobs.py: rollouts as jobs (RolloutJob, RolloutPage, JobStatus, ...), for /rollouts.

Import them from here. A harness's own options and run info live in its package
(envs/<harness>/options.py); this package imports nothing from the engine (a client installs it alone).
"""

from __future__ import annotations

from typing import Any

from harness_env.models.base import (
    MAX_COMMAND_CHARS,
    MAX_COMMANDS,
    MAX_FILE_CHARS,
    MAX_FILES,
    MAX_INSTRUCTION_CHARS,
    MAX_MAPPING_CHARS,
    MAX_NAME_BYTES,
    MAX_NESTING,
    MAX_PATH_CHARS,
    MAX_TOTAL_FILE_CHARS,
    NO_MODEL_ENDPOINT,
    SURROGATE,
    CheckedText,
    Endpoint,
    Mode,
    Task,
    bounded_mapping,
    check_http_url,
    check_text,
    url_authority,
    url_without_credentials,
)
from harness_env.models.jobs import (
    ACTIVE_STATUSES,
    ENDED_STATUSES,
    MAX_IDEMPOTENCY_KEY_CHARS,
    MAX_LIST_LIMIT,
    MAX_WAIT_S,
    JobEnd,
    JobStatus,
    RolloutAccepted,
    RolloutJob,
    RolloutListItem,
    RolloutPage,
)
from harness_env.models.options import (
    DEFAULT_HARNESS,
    HARNESS_OPTIONS,
    NAMED_TASK_INSTRUCTION,
    OPTION_GROUPS,
    HarnessOptions,
    RolloutArgs,
    RolloutOptions,
    RolloutRequest,
    harness_options_model,
    option,
    option_group,
    upgrade_request,
    use_harness_registry,
)
from harness_env.models.results import (
    AGENT_CAUSED_KINDS,
    LINK_KINDS,
    CaptureLevel,
    CommandResult,
    DatasetTaskInfo,
    ErrorKind,
    GraphSummary,
    HarnessInfo,
    HarnessRunInfo,
    LinkKind,
    Phase,
    PhaseEvent,
    RolloutResult,
    ServedBy,
    TopLogprob,
    TrainingRow,
    Turn,
    TurnPurpose,
)
from harness_env.models.summary import MAX_SUMMARY_BYTES, Detail, RolloutSummary, SummaryFile, SummaryPhase, summarize

__all__ = [
    "DEFAULT_HARNESS",
    "HARNESS_OPTIONS",
    "MAX_COMMAND_CHARS",
    "MAX_COMMANDS",
    "MAX_FILE_CHARS",
    "MAX_FILES",
    "MAX_INSTRUCTION_CHARS",
    "MAX_MAPPING_CHARS",
    "MAX_NAME_BYTES",
    "MAX_NESTING",
    "MAX_PATH_CHARS",
    "MAX_TOTAL_FILE_CHARS",
    "NAMED_TASK_INSTRUCTION",
    "NO_MODEL_ENDPOINT",
    "OPTION_GROUPS",
    "SURROGATE",
    "CaptureLevel",
    "CheckedText",
    "CommandResult",
    "DatasetTaskInfo",
    "Endpoint",
    "AGENT_CAUSED_KINDS",
    "ErrorKind",
    "GraphSummary",
    "HarnessInfo",
    "HarnessOptions",
    "HarnessRunInfo",
    "LINK_KINDS",
    "LinkKind",
    "Mode",
    "Phase",
    "PhaseEvent",
    "RolloutArgs",
    "RolloutOptions",
    "RolloutRequest",
    "RolloutResult",
    "ServedBy",
    "Task",
    "TopLogprob",
    "TrainingRow",
    "Turn",
    "TurnPurpose",
    "bounded_mapping",
    "check_http_url",
    "check_text",
    "harness_options_model",
    "upgrade_request",
    "use_harness_registry",
    "option",
    "option_group",
    "url_authority",
    "url_without_credentials",
]
__all__ += ["MAX_SUMMARY_BYTES", "Detail", "RolloutSummary", "SummaryFile", "SummaryPhase", "summarize"]
__all__ += [
    "ACTIVE_STATUSES",
    "ENDED_STATUSES",
    "MAX_IDEMPOTENCY_KEY_CHARS",
    "MAX_LIST_LIMIT",
    "MAX_WAIT_S",
    "JobEnd",
    "JobStatus",
    "RolloutAccepted",
    "RolloutJob",
    "RolloutListItem",
    "RolloutPage",
]


def __getattr__(name: str) -> Any:
    """A name that is not a wire type: say where a harness's own names went."""
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"module 'harness_env.models' has no attribute {name!r}; a harness's own options and run info "
        "are imported from its package: harness_env.envs.<harness>.options"
    )
