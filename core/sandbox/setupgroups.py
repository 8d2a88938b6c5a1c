"""Who runs a group's setup (setuplayers.py): the first member of a key leads; the members that
come while it runs wait for its outcome; the ones after find the saved layer. Backend-neutral: a
sandbox factory that can share a setup implements SharesSetup, and the engine asks this module."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


def group_key(*parts: Any) -> str:
    """The key of a group: a digest of everything that decides what setup leaves."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


@runtime_checkable
class SharesSetup(Protocol):
    """A sandbox factory whose sandboxes can start from a group's saved setup (blocking methods)."""

    def setup_group(self, limits: Any, readonly_paths: list[str]) -> str | None:
        """The sandbox's part of a group's key (e.g. the image's digest); None: no sharing here."""
        ...

    def find_setup(self, key: str) -> Any | None:
        """The saved setup of `key`, or None."""
        ...

    def save_setup(self, sandbox: Any, key: str, results: list[dict[str, Any]]) -> Any:
        """Save what setup left in `sandbox` as the layer of `key`; raises SandboxError."""
        ...

    def hold_setup(self, layer: Any) -> bool:
        """Keep `layer` while a sandbox is made from it; False when it is gone."""
        ...

    def release_setup(self, layer: Any) -> None: ...


@dataclass
class Outcome:
    """A group's setup as a member starts from it: a saved layer, or the setup's failure, or
    neither (the leader could not make its sandbox, or save its layer: the member runs its own)."""

    layer: Any = None
    failure: str | None = None
    results: list[dict[str, Any]] = field(default_factory=list)


class SetupGroups:
    def __init__(self) -> None:
        self._leaders: dict[str, asyncio.Future[Outcome]] = {}

    async def join(self, key: str, find: Callable[[str], Any]) -> tuple[Outcome | None, asyncio.Future[Outcome] | None]:
        """(the outcome to start from, None), or (None, a future this member must settle: it leads)."""
        while (running := self._leaders.get(key)) is not None:
            outcome = await asyncio.shield(running)
            if outcome.layer is not None or outcome.failure is not None:
                return outcome, None
        lead: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._leaders[key] = lead  # before looking: a member that comes meanwhile waits for this answer
        try:
            found = await asyncio.to_thread(find, key)
        except BaseException:
            self.settle(key, lead, Outcome())
            raise
        if found is None:
            return None, lead
        outcome = Outcome(layer=found, results=list(found.results))
        self.settle(key, lead, outcome)
        return outcome, None

    def settle(self, key: str, lead: asyncio.Future[Outcome], outcome: Outcome) -> None:
        if not lead.done():
            lead.set_result(outcome)
        if self._leaders.get(key) is lead:
            del self._leaders[key]


GROUPS = SetupGroups()  # one per process: the server's rollouts run on one event loop
