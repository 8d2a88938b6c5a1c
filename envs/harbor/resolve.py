"""Resolve a harness="harbor" request: find the Harbor task it names, fill the Task from it, and
check the agent and sandbox names before anything is queued; list a dataset's tasks.

Remote callers (MCP, HTTP, web) name task directories and datasets relative to
$HARNESS_ENV_HARBOR_TASKS_DIR; trusted callers (CLI, in-process) may give any path.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import ValidationError

from harness_env.core.errors import InvalidRequestError, describe_validation_error
from harness_env.core.paths import confined_path
from harness_env.envs.harbor.config import check_agent_and_sandbox
from harness_env.envs.harbor.options import HARBOR_NAME_PATTERN, REMOTE_AGENT_KWARGS, TASKS_DIR_VAR, HarborOptions
from harness_env.envs.harbor.task_dir import check_split, find_task_in_dataset, harbor_task_model, load_task_dir
from harness_env.models import DatasetTaskInfo, RolloutRequest, Task

__all__ = ["REMOTE_AGENT_KWARGS", "TASKS_DIR_VAR", "check_remote_kwargs", "list_remote_tasks", "list_tasks", "locate_task", "prepare"]
INSTRUCTION_PREVIEW_CHARS = 500
# The bounds HarborOptions puts on harbor.dataset and harbor.split.
MAX_DATASET_CHARS = 1024
MAX_SPLIT_CHARS = 128


def check_remote_kwargs(opts: HarborOptions) -> None:
    refused = sorted(set(opts.agent_kwargs) - REMOTE_AGENT_KWARGS)
    if refused:
        raise InvalidRequestError(
            f"harbor.agent_kwargs {refused} are not accepted from remote callers (they can name server files); allowed: {sorted(REMOTE_AGENT_KWARGS)}"
        )
    if opts.sandbox_kwargs:
        raise InvalidRequestError(
            "harbor.sandbox_kwargs are accepted from trusted callers only (CLI, in-process): they choose what the "
            "server's provider account allocates and what the host mounts"
        )


def locate_task(opts: HarborOptions, *, trusted: bool) -> Path:
    """The task directory `opts` names (task_dir, or dataset + split + task_index)."""
    if opts.task_dir:
        return confined_path(opts.task_dir, TASKS_DIR_VAR, "harbor.task_dir", trusted=trusted)
    if opts.dataset:
        root = confined_path(opts.dataset, TASKS_DIR_VAR, "harbor.dataset", trusted=trusted)
        found = find_task_in_dataset(root, opts.split, opts.task_index)
        # A link inside the dataset must not lead a remote caller out of the tasks root.
        return confined_path(str(found), TASKS_DIR_VAR, "a dataset's task", trusted=trusted)
    raise InvalidRequestError("harbor options name no task: give harbor.task_dir or harbor.dataset")


def options_of(request: RolloutRequest) -> HarborOptions:
    """The request's Harbor options, validated (they are plain data when the request was built
    before the harness registry was loaded), with their defaults when none were given."""
    try:
        return HarborOptions.of(request)
    except ValidationError as e:
        raise InvalidRequestError(describe_validation_error(e).replace("invalid request: ", "invalid request: harbor options: ", 1)) from None


def prepare(request: RolloutRequest, *, trusted: bool) -> RolloutRequest:
    """For harness="harbor": the request with its Harbor options validated and its Harbor task
    located and loaded (the Task's instruction and task_id come from it; `task_dir` becomes the
    absolute path). Other harnesses pass through. Raises InvalidRequestError naming what is wrong."""
    if request.harness != "harbor":
        return request
    harbor_task_model()  # ToolMissingError naming the extra, when Harbor is not installed
    opts = options_of(request)
    check_agent_and_sandbox(opts)
    if request.task_family:
        raise InvalidRequestError(
            f"task_family {request.task_family!r} grades a native harness's workspace; it does not apply to harness='harbor' (Harbor's verifier grades)"
        )
    if not trusted:
        check_remote_kwargs(opts)
    if not opts.names_task:  # the uniform Task is converted into a Harbor task when it runs
        return request.model_copy(update={"harness_options": opts})
    path = locate_task(opts, trusted=trusted)
    ht = load_task_dir(path)
    task = request.task
    task = Task(instruction=ht.instruction, task_id=task.task_id or ht.name, metadata={**task.metadata, "harbor_task": ht.name})
    return request.model_copy(update={"task": task, "harness_options": opts.model_copy(update={"task_dir": str(path)})})


def list_tasks(dataset: str = "", split: str | None = None, *, trusted: bool) -> list[DatasetTaskInfo]:
    """The tasks of a dataset directory, in the order task_index counts them. An empty `dataset`
    means the tasks root itself ($HARNESS_ENV_HARBOR_TASKS_DIR)."""
    HarborTaskModel = harbor_task_model()
    root = confined_path(dataset or ".", TASKS_DIR_VAR, "dataset", trusted=trusted)
    if split:
        check_split(split)
        # a split that is a link must not lead a remote caller out of the tasks root either
        root = confined_path(str(root / split), TASKS_DIR_VAR, "split", trusted=trusted)
    if not root.is_dir():
        raise InvalidRequestError(f"Harbor dataset directory {dataset or '.'!r}{f' split {split!r}' if split else ''} does not exist")
    out = []
    for index, path in enumerate(p for p in sorted(root.iterdir()) if HarborTaskModel.is_valid_dir(p)):
        try:
            confined_path(str(path), TASKS_DIR_VAR, "a dataset's task", trusted=trusted)  # a link out: not read
            ht = load_task_dir(path)
        except InvalidRequestError as e:  # listed all the same, so task_index still counts it
            out.append(DatasetTaskInfo(index=index, name=path.name, path=path.name, instruction=f"(unusable: {e})"))
            continue
        out.append(
            DatasetTaskInfo(
                index=index,
                name=ht.name,
                path=path.name,
                instruction=ht.instruction[:INSTRUCTION_PREVIEW_CHARS],
                agent_timeout_s=ht.agent_timeout_s,
                verifier_timeout_s=ht.verifier_timeout_s,
                has_solution=ht.solve_script is not None,
            )
        )
    return out


def list_remote_tasks(dataset: str = "", split: str | None = None) -> list[DatasetTaskInfo]:
    """list_tasks for a remote caller: `dataset` relative to $HARNESS_ENV_HARBOR_TASKS_DIR (empty:
    that directory itself), `split` a plain subdirectory name, both bounded as HarborOptions bounds
    them. ToolMissingError when Harbor is not installed."""
    if not isinstance(dataset, str) or len(dataset) > MAX_DATASET_CHARS:
        raise InvalidRequestError(f"dataset must be a path of at most {MAX_DATASET_CHARS} characters")
    if split is not None and not isinstance(split, str):
        raise InvalidRequestError("split must be a string")
    if split and (len(split) > MAX_SPLIT_CHARS or not re.fullmatch(HARBOR_NAME_PATTERN, split)):
        raise InvalidRequestError(f"split {split[:MAX_SPLIT_CHARS]!r} must be a plain subdirectory name (letters, digits, '.', '_', '-')")
    return list_tasks(dataset, split or None, trusted=False)
