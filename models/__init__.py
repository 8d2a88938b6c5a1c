"""Wire types shared by the engine, the server and the client (pydantic v2), in three modules:

- models/base.py: the bounds and checks every request obeys, Task, Endpoint;
- models/options.py: how a rollout runs (RolloutOptions, RolloutRequest, RolloutArgs, and
  HarnessOptions, the base of a harness's own options): each option declared once, as a field;
- models/results.py: what comes back (RolloutResult, Turn, TrainingRow, PhaseEvent, ...);
- models/summary.py: a result in at most 16 KB (RolloutSummary, summarize), for an agent;
- models/jobs.py: rollouts as jobs (RolloutJob, RolloutPage, JobStatus, ...), for /rollouts.

Import them from here. Names that moved into a harness's own package (its options and run info,
envs/<harness>/options.py) are still importable from here under their former names.
"""

from __future__ import annotations

import importlib
import pkgutil
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
    LEGACY_OPTION_KEYS,
    NAMED_TASK_INSTRUCTION,
    OPTION_GROUPS,
    HarnessOptions,
    RolloutArgs,
    RolloutOptions,
    RolloutRequest,
    harness_options_model,
    harness_options_models,
    option,
    option_group,
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
    "LEGACY_OPTION_KEYS",
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
    "harness_options_models",
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

_moved: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    """A name a harness package took with it (listed in the `__all__` of its options module,
    envs/<harness>/options.py), found there. Importing it loads the harness registry, so the
    client, which must not, imports none of them."""
    if name.startswith("__"):
        raise AttributeError(name)
    if name not in _moved:
        envs = importlib.import_module("harness_env.envs")  # mid-import while the registry loads: fine
        for pkg in pkgutil.iter_modules(envs.__path__):
            where = f"harness_env.envs.{pkg.name}.options"
            try:
                module = importlib.import_module(where)
            except ModuleNotFoundError as e:
                if e.name != where:  # the module is there but needs what is missing: say so
                    raise
                continue
            _moved.update({n: getattr(module, n) for n in getattr(module, "__all__", ())})
    if name in _moved:
        return _moved[name]
    raise AttributeError(f"module 'harness_env.models' has no attribute {name!r}")
