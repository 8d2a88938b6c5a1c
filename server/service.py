"""What the server's surfaces (HTTP, MCP, OpenEnv's client, the web UI) call: one implementation
of each tool."""

from __future__ import annotations

from harness_env import families
from harness_env.core import toolchain
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.engine import EventSink, run_rollout_with
from harness_env.envs import HARNESSES, get_harness
from harness_env.envs.harbor import resolve as harbor_resolve
from harness_env.models import HarnessInfo, RolloutArgs, RolloutRequest, RolloutResult
from harness_env.server import catalog
from harness_env.server.slots import RolloutSlots


class RolloutService:
    def __init__(self, proxy: CaptureProxy, proxy_base_url: str, slots: RolloutSlots, use_bwrap: bool | None = None) -> None:
        self.proxy = proxy
        self.proxy_base_url = proxy_base_url
        self.slots = slots
        self.use_bwrap = use_bwrap

    def resolve(self, args: RolloutArgs) -> RolloutRequest:
        """Raises InvalidRequestError with a clear message for bad arguments."""
        request = catalog.to_request(args)
        get_harness(request.harness)
        request = harbor_resolve.prepare(request, trusted=False)
        request, _grader = families.prepare(request, trusted=False)
        return request

    async def run(self, request: RolloutRequest, on_event: EventSink | None = None) -> RolloutResult:
        """Raises ServerBusy when the queue is full; otherwise always returns a result."""
        harness = get_harness(request.harness)
        grader = families.grader_for(request)
        async with self.slots.slot():
            return await run_rollout_with(
                request, harness, proxy=self.proxy, proxy_base_url=self.proxy_base_url, on_event=on_event,
                use_bwrap=self.use_bwrap, grader=grader,
            )

    @staticmethod
    def list_harnesses() -> list[HarnessInfo]:
        out = []
        for name, cls in HARNESSES.items():
            h = cls()
            version = h.version()
            pin = toolchain.PINS.get(name)
            out.append(HarnessInfo(name=name, installed=version is not None, version=version,
                                   # No pin: the harness is bundled with this package (whitebox).
                                   pinned_version=pin.version if pin else version,
                                   capabilities=list(getattr(h, "capabilities", ()))))
        return out

    @staticmethod
    def catalog() -> list[dict]:
        return catalog.describe()
