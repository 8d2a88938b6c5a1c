"""What the server's surfaces (HTTP, MCP, OpenEnv's client, the web UI) call: one implementation
of each tool."""

from __future__ import annotations

from harness_env import envs, families  # noqa: F401 - registers the harnesses and task families
from harness_env.core import catalog
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.engine import CaptureAccess, execute
from harness_env.core.errors import InvalidRequestError
from harness_env.core.phases import EventSink
from harness_env.core.pipeline import PreparedRollout, prepare
from harness_env.core.registry import HARNESSES, get_harness
from harness_env.core.sandbox.backends import DEFAULT_BACKEND, SandboxSettings, sandbox_factory
from harness_env.core.sandbox.policy import sandbox_limits
from harness_env.models import DatasetTaskInfo, HarnessInfo, RolloutArgs, RolloutResult
from harness_env.server.slots import RolloutSlots


class RolloutService:
    def __init__(
        self, proxy: CaptureProxy, proxy_base_url: str, slots: RolloutSlots, use_bwrap: bool | None = None, sandbox_backend: str = DEFAULT_BACKEND
    ) -> None:
        self.proxy = proxy
        self.proxy_base_url = proxy_base_url
        self.slots = slots
        # From the registry (core/sandbox/backends.py), once: an unknown name stops the server at start.
        self.sandbox_factory = sandbox_factory(sandbox_backend, SandboxSettings(use_bwrap=use_bwrap))
        # The proxy's Unix socket (set while the app's lifespan runs): a network-isolated
        # sandbox's only way out, serving the capture routes and nothing of the server's API.
        self.capture_socket: str | None = None

    def resolve(self, args: RolloutArgs) -> PreparedRollout:
        """The request of a remote caller, prepared (core/pipeline.py); raises InvalidRequestError
        with a clear message for bad arguments. May read task directories: call it off the loop."""
        request = catalog.to_request(args, trusted=False)  # a registry image only: a local transport would read the server's files
        prepared = prepare(request, trusted=False)
        sandbox_limits(prepared.request)  # over this server's maximums: refused before any work
        return prepared

    async def run(self, prepared: PreparedRollout, on_event: EventSink | None = None) -> RolloutResult:
        """Raises ServerBusy when the queue is full; otherwise always returns a result."""
        async with self.slots.slot():
            capture = CaptureAccess(self.proxy, self.proxy_base_url, self.capture_socket)
            return await execute(prepared, capture, sandbox_factory=self.sandbox_factory, on_event=on_event, start_gate=self.slots.starting)

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
