"""The default SandboxFactory: a LocalSandbox per rollout (bubblewrap when it works here).

It pulls a task's image before the rollout takes a start place (`prepare`), and lets the members
of a group start from one setup (setuplayers.py, the SharesSetup protocol of setupgroups.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from harness_env.core.sandbox.images import ensure_image, release_image
from harness_env.core.sandbox.local import Limits, LocalSandbox, create_local_sandbox
from harness_env.core.sandbox.rolloutdir import AGENT_DIRS, image_upper
from harness_env.core.sandbox.setuplayers import SetupLayer, SetupLayers, process_setup_layers


@dataclass(frozen=True)
class LocalSandboxFactory:
    use_bwrap: bool | None = None  # None: bubblewrap when it works here; False: plain processes
    # None: every rollout runs its own setup (HARNESS_ENV_SETUP_CACHE_MB=0)
    setup_layers: SetupLayers | None = field(default_factory=process_setup_layers, compare=False)

    def __call__(self, *, readonly_paths: list[str], limits: Limits, capture_socket: str | None) -> LocalSandbox:
        return create_local_sandbox(
            use_bwrap=self.use_bwrap,
            ro_paths=readonly_paths,
            limits=limits,
            capture_socket=capture_socket,
            image=limits.task_image or limits.image,
            setup_layer=limits.setup_layer,
        )

    def prepare(self, limits: Limits) -> Limits:
        """`limits` with the task's image pulled (blocking: minutes for a large image, the first time)
        and held from eviction until a sandbox mounts it, or `release`."""
        if limits.image and limits.task_image is None:
            return dataclasses.replace(limits, task_image=ensure_image(limits.image))
        return limits

    def release(self, limits: Limits) -> None:
        """What `prepare` held for a rollout that will make no sandbox from it."""
        if limits.task_image is not None:
            release_image(limits.task_image.digest)

    # -- SharesSetup ------------------------------------------------------------------------
    def setup_group(self, limits: Limits, readonly_paths: list[str]) -> str | None:
        if self.setup_layers is None:
            return None
        image = limits.task_image.digest if limits.task_image is not None else limits.image
        sized = dataclasses.replace(limits, image=None, task_image=None, setup_layer=None)
        return repr((self.use_bwrap, image, sized, sorted(readonly_paths)))

    def find_setup(self, key: str) -> SetupLayer | None:
        assert self.setup_layers is not None
        return self.setup_layers.find(key)

    def save_setup(self, sandbox: LocalSandbox, key: str, results: list[dict[str, Any]]) -> SetupLayer:
        assert self.setup_layers is not None
        upper = image_upper(sandbox.root) if sandbox.image is not None else None
        return self.setup_layers.save(key, sandbox.root, AGENT_DIRS, upper, results)

    def hold_setup(self, layer: SetupLayer) -> bool:
        return self.setup_layers is not None and self.setup_layers.hold(layer)

    def release_setup(self, layer: SetupLayer) -> None:
        if self.setup_layers is not None:
            self.setup_layers.release(layer)
