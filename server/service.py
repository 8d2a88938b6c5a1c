"""What the server's surfaces (HTTP, MCP, OpenEnv's client, the web UI) call: one implementation
of each tool. Their rollouts are resolved by core/runner.resolve (a remote caller's: untrusted)
and run as jobs (server/jobs/manager.py), on the one Runner of the app."""

from __future__ import annotations

from harness_env import envs, families  # noqa: F401 - registers the harnesses and task families
from harness_env.core import catalog
from harness_env.core.errors import InvalidRequestError
from harness_env.core.phases import EventSink
from harness_env.core.pipeline import PreparedRollout
from harness_env.core.registry import HARNESSES, get_harness
from harness_env.models import DatasetTaskInfo, HarnessInfo, RolloutResult
from harness_env.server.jobs.manager import JobManager


class RolloutService:
    def __init__(self, jobs: JobManager) -> None:
        self.jobs = jobs

    async def run(self, prepared: PreparedRollout, on_event: EventSink | None = None) -> RolloutResult:
        """A called rollout (POST /rollout, MCP run_rollout, the web UI): a job, stored like a
        submitted one, cancelled when its caller goes away. Raises ServerBusy when the queue is
        full; otherwise always returns a result."""
        return await self.jobs.run_attached(prepared, on_event)

    @staticmethod
    def list_harnesses() -> list[HarnessInfo]:
        out = []
        for name, cls in HARNESSES.items():
            h = cls()
            version = h.version()
            pin = h.pin
            out.append(
                HarnessInfo(
                    name=name,
                    installed=version is not None,
                    version=version,
                    # No pin: the harness is bundled with this package (whitebox).
                    pinned_version=pin.version if pin else version,
                    capabilities=list(h.capabilities),
                )
            )
        return out

    @staticmethod
    def list_tasks(dataset: str = "", split: str | None = None, harness: str | None = None) -> list[DatasetTaskInfo]:
        """The tasks of `dataset` on the server, as the harness that brings them lists them (its
        `list_tasks`; `harness` None: the first registered harness that lists tasks). Raises
        InvalidRequestError for a dataset the caller may not name, or a harness that lists none."""
        names = [harness] if harness is not None else list(HARNESSES)
        for name in names:
            tasks = get_harness(name).list_tasks(dataset, split or None)
            if tasks is not None:
                return tasks
        raise InvalidRequestError(f"harness {harness!r} brings no tasks of its own" if harness else "no registered harness lists tasks")

    @staticmethod
    def catalog() -> list[dict]:
        return catalog.describe()
