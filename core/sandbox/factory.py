"""The default SandboxFactory: a LocalSandbox per rollout (bubblewrap when it works here)."""

from __future__ import annotations

from dataclasses import dataclass

from harness_env.core.sandbox.local import Limits, LocalSandbox, create_local_sandbox


@dataclass(frozen=True)
class LocalSandboxFactory:
    use_bwrap: bool | None = None  # None: bubblewrap when it works here; False: plain processes

    def __call__(self, *, readonly_paths: list[str], limits: Limits, capture_socket: str | None) -> LocalSandbox:
        return create_local_sandbox(use_bwrap=self.use_bwrap, ro_paths=readonly_paths, limits=limits, capture_socket=capture_socket,
                                    image=limits.image)
