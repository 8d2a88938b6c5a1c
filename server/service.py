"""What the server's surfaces (HTTP, MCP, OpenEnv's client, the web UI) call: one implementation
of each tool."""

from __future__ import annotations

import re

from harness_env import envs, families  # noqa: F401 - registers the harnesses and task families
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.engine import CaptureAccess, execute
from harness_env.core.errors import InvalidRequestError
from harness_env.core.phases import EventSink
from harness_env.core.pipeline import PreparedRollout, prepare
from harness_env.core.registry import HARNESSES
from harness_env.core.sandbox.backends import DEFAULT_BACKEND, SandboxSettings, sandbox_factory
from harness_env.core.sandbox.policy import sandbox_limits
from harness_env.envs.harbor import resolve as harbor_resolve
from harness_env.envs.harbor.options import HARBOR_NAME_PATTERN
from harness_env.models import DatasetTaskInfo, HarnessInfo, RolloutArgs, RolloutResult
from harness_env.server import catalog
from harness_env.server.slots import RolloutSlots

# The bounds HarborOptions puts on harbor.dataset and harbor.split.
MAX_DATASET_CHARS = 1024
MAX_SPLIT_CHARS = 128


class RolloutService:
    def __init__(self, proxy: CaptureProxy, proxy_base_url: str, slots: RolloutSlots, use_bwrap: bool | None = None,
                 sandbox_backend: str = DEFAULT_BACKEND) -> None:
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
        prepared = prepare(catalog.to_request(args), trusted=False)
        sandbox_limits(prepared.request)  # over this server's maximums: refused before any work
        return prepared

    async def run(self, prepared: PreparedRollout, on_event: EventSink | None = None) -> RolloutResult:
        """Raises ServerBusy when the queue is full; otherwise always returns a result."""
        async with self.slots.slot():
            capture = CaptureAccess(self.proxy, self.proxy_base_url, self.capture_socket)
            return await execute(prepared, capture, sandbox_factory=self.sandbox_factory, on_event=on_event,
                                 start_gate=self.slots.starting)

    @staticmethod
    def list_harnesses() -> list[HarnessInfo]:
        out = []
        for name, cls in HARNESSES.items():
            h = cls()
            version = h.version()
            pin = h.pin
            out.append(HarnessInfo(name=name, installed=version is not None, version=version,
                                   # No pin: the harness is bundled with this package (whitebox).
                                   pinned_version=pin.version if pin else version,
                                   capabilities=list(h.capabilities)))
        return out

    @staticmethod
    def list_tasks(dataset: str = "", split: str | None = None) -> list[DatasetTaskInfo]:
        """The Harbor tasks of `dataset` (relative to $HARNESS_ENV_HARBOR_TASKS_DIR; empty: that
        directory itself), optionally its subdirectory `split`, in task_index order. Raises
        InvalidRequestError for a path outside the tasks root or that does not exist, and
        ToolMissingError when Harbor is not installed."""
        if not isinstance(dataset, str) or len(dataset) > MAX_DATASET_CHARS:
            raise InvalidRequestError(f"dataset must be a path of at most {MAX_DATASET_CHARS} characters")
        if split is not None and not isinstance(split, str):
            raise InvalidRequestError("split must be a string")
        if split and (len(split) > MAX_SPLIT_CHARS or not re.fullmatch(HARBOR_NAME_PATTERN, split)):
            raise InvalidRequestError(f"split {split[:MAX_SPLIT_CHARS]!r} must be a plain subdirectory name (letters, digits, '.', '_', '-')")
        return harbor_resolve.list_tasks(dataset, split or None, trusted=False)

    @staticmethod
    def catalog() -> list[dict]:
        return catalog.describe()
