"""TASKS of `harness-env eval`: what a path names, as a list of tasks with unique ids.

A path is one of:
  - a JSONL file: one task per line (a task file's object: instruction, setup, verify, files,
    task_id; or a task family's record with `task_family`); a line without `instruction` that has
    a family's instruction_key (families/base.py) is that family's record;
  - a directory holding `tasks.jsonl` (a family's dataset, e.g. as `harness-env svg-dataset` writes it);
  - a task or dataset directory of a harness's own (its `local_tasks`: Harbor's task directories
    with task.toml, or one of them);
  - a directory of task JSON files (`*.json`, in name order).
Nothing here runs a rollout; turning a task into a request is the caller's (the CLI's run_request).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness_env.core.errors import InvalidRequestError


@dataclass(frozen=True)
class EvalTask:
    """One task: `source` is the file it came from (relative paths in it are relative to that file's
    directory) or the harness's dataset / task directory; `data` the task object (None for a
    harness's own task, which brings its own: `harness` runs it with `harness_options` naming it);
    `task_index` its dataset's index. A family record's own request fields (its limits) are in
    `data`, under its request_keys."""

    task_id: str
    source: str
    data: dict[str, Any] | None = None
    task_index: int | None = None
    harness: str | None = None
    harness_options: dict[str, Any] = field(default_factory=dict)


MAX_ID_CHARS = 100  # a directory name, far under a name's 255 bytes, with room for a duplicate's "-N"
ID_DIGEST_CHARS = 12


def safe_id(name: str) -> str:
    """A task id usable as a directory name (results/<id>/) and in an idempotency key: only
    [A-Za-z0-9._-], no leading dot, at most MAX_ID_CHARS; a longer one keeps its start and ends
    in a digest of the whole id, so two long ids that share a start stay apart. Idempotent."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "task"
    if len(safe) <= MAX_ID_CHARS:
        return safe
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:ID_DIGEST_CHARS]
    return safe[: MAX_ID_CHARS - ID_DIGEST_CHARS - 1] + "-" + digest


def _unique(tasks: list[EvalTask]) -> list[EvalTask]:
    seen: dict[str, int] = {}
    out = []
    for t in tasks:
        base = safe_id(t.task_id)
        seen[base] = seen.get(base, 0) + 1
        name = base if seen[base] == 1 else f"{base}-{seen[base]}"
        out.append(EvalTask(name, t.source, t.data, t.task_index, t.harness, t.harness_options))
    return out


def _family_record(rec: dict[str, Any]) -> dict[str, Any]:
    """A record without `task_family` or `instruction`, as the first registered family whose
    instruction_key it has reads it (only its record_keys and request_keys pass on); else as it is."""
    from harness_env.families import family_names, get_family

    for name in family_names():
        family = get_family(name)
        if family.instruction_key in rec:
            keys = (*family.record_keys, *family.request_keys)
            return {"task_family": name, **{k: rec[k] for k in keys if rec.get(k) is not None}}
    return rec


def _json_object(text: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidRequestError(f"{where} is not valid JSON: {e.msg}") from None
    if not isinstance(data, dict):
        raise InvalidRequestError(f"{where} must be a JSON object (a task)")
    return data


def _from_jsonl(path: Path) -> list[EvalTask]:
    tasks = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        data = _json_object(line, f"{path} line {n}")
        if "instruction" not in data and "task_family" not in data:
            data = _family_record(data)
        tasks.append(EvalTask(str(data.get("task_id") or f"line{n}"), str(path), data))
    return tasks


def _from_json_files(root: Path) -> list[EvalTask]:
    tasks = []
    for p in sorted(root.glob("*.json")):
        data = _json_object(p.read_text(), f"task file {p}")
        tasks.append(EvalTask(str(data.get("task_id") or p.stem), str(p), data))
    return tasks


def _harness_tasks(root: Path, split: str | None) -> list[EvalTask] | None:
    """The tasks at `root` as the first registered harness that claims it reads them (its
    local_tasks); None when none does."""
    from harness_env.envs import HARNESSES

    for name, cls in HARNESSES.items():
        found = cls().local_tasks(root, split)
        if found is not None:
            return [EvalTask(t.name, str(root.resolve()), None, t.index, name, t.harness_options) for t in found]
    return None


def load_tasks(path: str | Path, *, split: str | None = None) -> list[EvalTask]:
    """The tasks `path` names (see the module's docstring), ids made unique and safe as file names.
    Raises InvalidRequestError for what is none of those, or holds no task."""
    root = Path(path).expanduser()
    if root.is_file():
        tasks = _from_jsonl(root)
    elif not root.is_dir():
        raise InvalidRequestError(f"TASKS {path}: no such file or directory")
    elif (root / "tasks.jsonl").is_file():
        tasks = _from_jsonl(root / "tasks.jsonl")
    else:
        tasks = _harness_tasks(root, split)
        if tasks is None:
            tasks = _from_json_files(root)
    if not tasks:
        raise InvalidRequestError(
            f"TASKS {path} holds no task (a JSONL of tasks, a directory of task JSON files, "
            "a family's dataset with tasks.jsonl, or a task or dataset directory of a harness)"
        )
    return _unique(tasks)


TASK_KEYS = ("instruction", "setup", "verify", "files", "task_id", "metadata")


def split_family_task(data: dict, task_file: str) -> tuple[dict, str | None, dict, dict]:
    """A task file with a top-level `task_family` (a family's record: {"task_family": NAME, the
    family's own keys ...}): (task, family, family_options, request limits), as
    the family's record declares them (families/base.py): its instruction_key is the instruction,
    its request_keys are limits, its path_keys are relative to the task file."""
    from harness_env.families import get_family

    data = dict(data)
    name = data.pop("task_family", None)
    if name is None:
        return data, None, {}, {}
    family = get_family(name)  # InvalidRequestError naming the registered ones
    if family.instruction_key in data:
        data["instruction"] = data.pop(family.instruction_key)
    task = {k: data.pop(k) for k in TASK_KEYS if k in data}
    limits = {k: data.pop(k) for k in family.request_keys if data.get(k) is not None}
    for key in family.path_keys:
        path = data.get(key)
        if isinstance(path, str) and path and not os.path.isabs(path):
            data[key] = os.path.join(os.path.dirname(os.path.abspath(task_file)), path)
    return task, name, data, limits


def task_request(task: EvalTask, request: dict[str, Any]) -> dict[str, Any]:
    """The request (a dict RolloutRequest validates) for `task` with the shared fields of
    `request` (endpoint, harness, options): for code, as `harness-env eval` makes them from its flags.
    A harness's own task runs with that harness, what names it in harness_options."""
    if task.data is None:
        return {**request, "harness": task.harness, "harness_options": {**request.get("harness_options", {}), **task.harness_options}}
    data, family, family_options, limits = split_family_task(task.data, task.source)
    raw = {**limits, **request, "task": {"task_id": task.task_id, **data}}
    if family is not None:
        raw["task_family"] = family
        raw["family_options"] = {**family_options, **request.get("family_options", {})}
    return raw
