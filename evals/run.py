"""`evaluate()`: K attempts of every task, one compact result file per attempt, resumable.

Layout of the output directory:
  eval.json                        what was evaluated (tasks, attempts, harness, model, threshold)
  results/<task_id>/<attempt>.json one compact result (storage.pack) per finished attempt
  summary.json                     the numbers (report.summarize)
A result file is written to a temporary name and renamed, so a file that exists is whole: a run
killed midway loses only the attempts in flight, and running again runs only the missing ones.
With a `recorder` (the CLI passes its data directory's store: server/store/eval_runs.py), the run
and each attempt are recorded as they finish, and a resumed run records the attempts an earlier
one left unrecorded; a recording that fails is logged, never the end of the evaluation.
In-process by default; with `server` each attempt is submitted to a harness-env server as a job
whose idempotency key is the attempt's, so a resumed run waits for a job it had already submitted
instead of running it again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from harness_env.evals.report import Outcome, summarize
from harness_env.evals.tasks import safe_id
from harness_env.models import RolloutRequest, RolloutResult
from harness_env.storage import pack

if TYPE_CHECKING:
    from harness_env.core.sandbox.base import SandboxFactory

RESULTS = "results"
logger = logging.getLogger("harness_env.evals")


@dataclass
class Progress:
    total: int
    done: int = 0
    resumed: int = 0
    running: int = 0
    failed: int = 0
    reward_sum: float = 0.0  # over this run's and the resumed attempts that have a reward
    scored: int = 0
    started: float = field(default_factory=time.monotonic)

    def add(self, outcome: Outcome) -> None:
        if outcome.reward is not None:
            self.reward_sum, self.scored = self.reward_sum + outcome.reward, self.scored + 1

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.scored if self.scored else None


class Recorder(Protocol):
    """Where an eval run is recorded as it goes (synchronous; called off the event loop)."""

    def begin(
        self, run_id: str, out_dir: str, first: RolloutRequest | None, tasks: list[str], attempts: int, threshold: float, servers: list[str] | None
    ) -> None: ...
    def recorded(self) -> set[tuple[str, int]]: ...
    def attempt(self, task_id: str, attempt: int, request: RolloutRequest, result: RolloutResult) -> None: ...
    def end(self, status: str, summary: dict[str, Any]) -> None: ...


def attempt_path(out: Path, task_id: str, attempt: int) -> Path:
    """Where an attempt's result goes: any task id is made a safe directory name (evals/tasks.py)."""
    return out / RESULTS / safe_id(task_id) / f"{attempt}.json"


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` so that `path`, once it exists, is whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_outcome(path: Path) -> Outcome | None:
    """A finished attempt's outcome, or None when the file is missing or not a whole result."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or "reward" not in data:
        return None
    return Outcome(data["reward"], data.get("error_kind"))


def attempt_errors(out: Path, task_ids: list[str], attempts: int) -> list[tuple[str | None, str | None]]:
    """(error kind, error message) of every finished attempt that has an error kind."""
    found = []
    for tid in task_ids:
        for i in range(attempts):
            try:
                data = json.loads(attempt_path(out, tid, i).read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and data.get("error_kind"):
                found.append((data["error_kind"], data.get("error")))
    return found


def outcomes(out: Path, task_ids: list[str], attempts: int) -> dict[str, list[Outcome]]:
    """The finished attempts' outcomes, per task."""
    found: dict[str, list[Outcome]] = {}
    for tid in task_ids:
        found[tid] = [o for i in range(attempts) if (o := read_outcome(attempt_path(out, tid, i))) is not None]
    return found


def to_args(request: RolloutRequest) -> dict[str, Any]:
    """A RolloutRequest as the flat arguments a server takes (RolloutArgs)."""
    data = request.model_dump(mode="json", exclude={"task", "endpoint"}, exclude_none=True)
    task = request.task
    data.update(instruction=task.instruction, setup=task.setup, verify=task.verify, files=task.files, task_id=task.task_id or "")
    data.update(
        base_url=request.endpoint.base_url,
        model=request.endpoint.model,
        api_key=request.endpoint.api_key.get_secret_value(),
        wire_api=request.endpoint.wire_api,
    )
    return {k: v for k, v in data.items() if v is not None}


def _meta(out: Path, requests: list[tuple[str, RolloutRequest]], attempts: int, threshold: float) -> dict[str, Any]:
    path = out / "eval.json"
    old: dict[str, Any] = {}
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            old = {}
    first = requests[0][1] if requests else None
    harness, model = (first.harness, first.endpoint.model) if first else ("", "")
    if old and (old.get("harness"), old.get("model")) != (harness, model):
        raise ValueError(
            f"{out} holds an evaluation of harness {old.get('harness')!r} with model {old.get('model')!r}, not "
            f"{harness!r} with {model!r}: give another output directory"
        )
    meta = {
        "run_key": old.get("run_key") or uuid.uuid4().hex,  # kept across resumes: the attempts' idempotency keys
        "attempts": attempts,
        "threshold": threshold,
        "harness": harness,
        "model": model,
        "tasks": [tid for tid, _ in requests],
    }
    write_atomic(path, json.dumps(meta, indent=2) + "\n")
    return meta


async def _run_local(request: RolloutRequest, sandbox_factory: SandboxFactory | None) -> RolloutResult:
    from harness_env.core.errors import InvalidRequestError
    from harness_env.rollout import run_rollout

    try:
        return await run_rollout(request, sandbox_factory=sandbox_factory)
    except InvalidRequestError as e:
        return RolloutResult(task_id=request.task.task_id, error=str(e), error_kind="invalid_request")


async def evaluate_async(
    requests: list[tuple[str, RolloutRequest | dict]],
    out: str | Path,
    *,
    attempts: int = 1,
    concurrency: int = 8,
    threshold: float = 1.0,
    server: str | Sequence[str] | None = None,
    token: str | None = None,
    sandbox_factory: SandboxFactory | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    recorder: Recorder | None = None,
) -> dict[str, Any]:
    """Run `attempts` attempts of every (task_id, request) not already finished in `out`, at most
    `concurrency` at a time; write each result as it finishes, then summary.json. Returns the
    summary (report.summarize). Never raises for a failed rollout: it is a result. In process,
    `sandbox_factory` makes the sandboxes (default: rollout.run_rollout's)."""
    if attempts < 1 or concurrency < 1:
        raise ValueError("attempts and concurrency must be at least 1")
    if server:  # first: a bad address is refused before anything is written
        from harness_env.client.servers import server_urls

        urls = server_urls(None, [server] if isinstance(server, str) else list(server))
    out = Path(out)
    checked = [(tid, r if isinstance(r, RolloutRequest) else RolloutRequest.model_validate(r)) for tid, r in requests]
    if len({safe_id(tid) for tid, _ in checked}) != len(checked):
        raise ValueError("task ids must be unique, also as directory names (only letters, digits, '.', '_' and '-' are kept)")
    meta = _meta(out, checked, attempts, threshold)
    todo = [(tid, req, i) for tid, req in checked for i in range(attempts) if read_outcome(attempt_path(out, tid, i)) is None]
    progress = Progress(total=len(checked) * attempts)
    progress.done = progress.resumed = progress.total - len(todo)
    for outs in outcomes(out, [tid for tid, _ in checked], attempts).values():
        for o in outs:
            progress.add(o)
    if recorder is not None:
        await _record(_begin_record, recorder, meta, out, checked, attempts, threshold, urls if server else None)
    report = on_progress or (lambda p: None)
    report(progress)
    sem = asyncio.Semaphore(concurrency)
    client = None
    if server:
        from harness_env.client.http import AsyncHarnessEnv

        client = AsyncHarnessEnv(base_urls=urls, token=token)

    async def one(tid: str, req: RolloutRequest, i: int) -> None:
        async with sem:
            progress.running += 1
            report(progress)
            try:
                if client is None:
                    result = await _run_local(req, sandbox_factory)
                else:
                    result = await _run_remote(client, req, f"{meta['run_key']}-{safe_id(tid)}-{i}")  # within the key's bound
                write_atomic(attempt_path(out, tid, i), json.dumps(pack(result), separators=(",", ":")))
                if recorder is not None:
                    await _record(recorder.attempt, tid, i, req, result)
            finally:
                progress.running -= 1
            progress.done += 1
            progress.add(Outcome(result.reward, result.error_kind))
            progress.failed += result.error is not None and Outcome(result.reward, result.error_kind).infra_failed
            report(progress)

    try:
        await asyncio.gather(*(one(tid, req, i) for tid, req, i in todo))
    except BaseException:  # stopped (Ctrl-C) or broken: the run is recorded as stopped, its attempts so far kept
        if recorder is not None:
            await asyncio.shield(_record(recorder.end, "stopped", _summary(out, checked, meta, attempts, threshold)))
        raise
    finally:
        if client is not None:
            await client.aclose()
    summary = _summary(out, checked, meta, attempts, threshold)
    write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    if recorder is not None:
        await _record(recorder.end, "finished", summary)
    return summary


async def _record(fn: Callable[..., None], *args: Any) -> None:
    """A recorder's call, off the event loop; its failure (the store gone, full, locked) is logged:
    the result files are the evaluation's record, the store a view of them."""
    try:
        await asyncio.to_thread(fn, *args)
    except Exception as e:
        logger.warning(
            "could not record the eval run in the store (%s: %s); its results are in the output directory",
            type(e).__name__,
            str(e).splitlines()[0] if str(e) else "",
        )


def _summary(out: Path, checked: list[tuple[str, RolloutRequest]], meta: dict[str, Any], attempts: int, threshold: float) -> dict[str, Any]:
    summary = summarize(outcomes(out, [tid for tid, _ in checked], attempts), attempts, threshold)
    summary["harness"], summary["model"] = meta["harness"], meta["model"]
    return summary


def _begin_record(
    recorder: Recorder, meta: dict[str, Any], out: Path, checked: list[tuple[str, RolloutRequest]], attempts: int, threshold: float, servers: list[str] | None
) -> None:
    """Record the run, and the finished attempts in `out` it does not hold yet (an earlier run's)."""
    from harness_env.storage import load

    recorder.begin(meta["run_key"], str(out.resolve()), checked[0][1] if checked else None, [tid for tid, _ in checked], attempts, threshold, servers)
    have = recorder.recorded()
    for tid, req in checked:
        for i in range(attempts):
            path = attempt_path(out, tid, i)
            if (tid, i) not in have and read_outcome(path) is not None:
                recorder.attempt(tid, i, req, load(path))


async def _run_remote(client: Any, request: RolloutRequest, key: str) -> RolloutResult:
    from harness_env.client.jobs import REFUSED_OR_LOST, failed

    args = to_args(request)
    try:
        accepted = await client.submit(args, idempotency_key=key, retry_busy=True)
        return await client.wait(accepted.rollout_id)
    except REFUSED_OR_LOST as e:  # a result, as in the client's run_many
        return failed(args, e)


def evaluate(requests: list[tuple[str, RolloutRequest | dict]], out: str | Path, **kwargs: Any) -> dict[str, Any]:
    """The synchronous twin of `evaluate_async` (what `harness-env eval` runs)."""
    return asyncio.run(evaluate_async(requests, out, **kwargs))
