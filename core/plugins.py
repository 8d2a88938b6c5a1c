"""Plug-ins from other distributions, by Python entry points (as vLLM and Harbor load theirs).

A distribution declares, in its `entry_points.txt` (pyproject's `[project.entry-points.<group>]`),
one entry per plug-in in a group: `harness_env.harnesses`, `harness_env.dialects`,
`harness_env.families`, `harness_env.sandbox_backends`. An entry names either the plug-in itself
(registered under its own name, as the group's registry says) or a function of no arguments that
registers what the distribution brings. A group is loaded once, when its registry is first read,
so importing harness_env stays cheap and a plug-in module may import harness_env freely.

A plug-in that fails to load (its import raises, or its registration is refused) is logged once,
naming its distribution and entry point, and kept in `PluginGroup.failures`: the built-ins and the
other plug-ins still load, and a lookup of a name that is not registered says what failed.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, TypeVar

logger = logging.getLogger("harness_env.plugins")
V = TypeVar("V")


def _origin(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    where = f"distribution {dist.name} {dist.version}" if dist is not None else "an unnamed distribution"
    return f"entry point {ep.name!r} = {ep.value!r} (group {ep.group}) of {where}"


@dataclass
class PluginGroup:
    """One entry-point group and how an object it names is registered (`register`); a plain
    function is called instead (it registers for itself)."""

    name: str
    register: Callable[[Any], None]
    loaded: bool = False
    failures: list[str] = field(default_factory=list)

    def load(self) -> None:
        """Load every entry point of the group, once. Never raises (see the module docstring)."""
        if self.loaded:
            return
        self.loaded = True  # first: a plug-in reading its registry while it loads does not load it again
        seen: set[tuple[str, str]] = set()
        for ep in entry_points(group=self.name):
            if (ep.name, ep.value) in seen:  # one distribution found twice on sys.path
                continue
            seen.add((ep.name, ep.value))
            try:
                obj = ep.load()
                if inspect.isfunction(obj) or inspect.ismethod(obj):
                    obj()
                else:
                    self.register(obj)
            except Exception as e:  # a broken plug-in must not take the built-ins down
                failure = f"{_origin(ep)} failed to load: {type(e).__name__}: {e}"
                self.failures.append(failure)
                logger.error("plug-in not loaded: %s", failure)

    def unknown(self, what: str, name: str, known: list[str]) -> str:
        """The message for a name that is not registered: the registered ones, and any plug-in
        of this group that failed to load (it may have been the one meant)."""
        text = f"unknown {what} {name!r}; choose one of: {', '.join(known)}"
        if self.failures:
            text += "; " + "; ".join(self.failures) + " (fix or uninstall that distribution)"
        return text


class PluginRegistry(dict[str, V]):
    """A registry (name -> plug-in) whose group's entry points are loaded when it is first read.
    Writes (the package's own registrations at import) do not load them."""

    def __init__(self, group: PluginGroup, *args: Any) -> None:
        super().__init__(*args)
        self.group = group

    def _load(self) -> None:
        if not self.group.loaded:
            self.group.load()

    def __getitem__(self, key: str) -> V:
        self._load()
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self._load()
        return super().__contains__(key)

    def __iter__(self) -> Iterator[str]:
        self._load()
        return super().__iter__()

    def __len__(self) -> int:
        self._load()
        return super().__len__()

    def get(self, key: str, default: Any = None) -> Any:
        self._load()
        return super().get(key, default)

    def keys(self):  # type: ignore[override]
        self._load()
        return super().keys()

    def values(self):  # type: ignore[override]
        self._load()
        return super().values()

    def items(self):  # type: ignore[override]
        self._load()
        return super().items()
