"""The registries of harnesses and task families.

Core names none of them: each harness package registers itself when `harness_env.envs` is
imported, each family when `harness_env.families` is (the entry points import both); another
distribution's are loaded from its entry points (groups `harness_env.harnesses`: a harness class,
`harness_env.families`: a family class, or a function that registers; core/plugins.py) when a
registry is first read. Adding a harness or a family is one registration; the pipeline, the
server, the CLI and the tests find it here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harness_env.core.errors import InvalidRequestError
from harness_env.core.plugins import PluginGroup, PluginRegistry
from harness_env.models import use_harness_registry

if TYPE_CHECKING:
    from harness_env.core.harness import Harness

HARNESS_PLUGINS = PluginGroup("harness_env.harnesses", lambda cls: register_harness(cls.name, cls))
FAMILY_PLUGINS = PluginGroup("harness_env.families", lambda cls: register_family(cls.name, lambda: cls))
HARNESSES: dict[str, type] = PluginRegistry(HARNESS_PLUGINS)  # name -> harness class
use_harness_registry(HARNESSES)  # the wire types type a harness's options by its options model
# name -> a loader of the family class (imported on first use)
_FAMILY_LOADERS: dict[str, Callable[[], type]] = PluginRegistry(FAMILY_PLUGINS)
# A `harness-env` command of a family's own, with its own parser: name -> (help, a loader of its main(argv) -> exit code).
FamilyCommand = tuple[str, Callable[[], Callable[[list[str]], int]]]
FAMILY_COMMANDS: dict[str, FamilyCommand] = PluginRegistry(FAMILY_PLUGINS)


def register_harness(name: str, cls: type) -> None:
    HARNESSES[name] = cls


def get_harness(name: str) -> Harness:
    cls = HARNESSES.get(name)
    if cls is None:
        raise InvalidRequestError(HARNESS_PLUGINS.unknown("harness", name, sorted(HARNESSES)))
    return cls()


def register_family(name: str, loader: Callable[[], type], commands: dict[str, FamilyCommand] | None = None) -> None:
    """`commands`: the family's own `harness-env` commands, declared here so the command line
    lists them without importing the family."""
    _FAMILY_LOADERS[name] = loader
    FAMILY_COMMANDS.update(commands or {})


def family_names() -> list[str]:
    return sorted(_FAMILY_LOADERS)


def get_family(name: str) -> Any:
    loader = _FAMILY_LOADERS.get(name)
    if loader is None:
        raise InvalidRequestError(FAMILY_PLUGINS.unknown("task_family", name, family_names()))
    return loader()()
