"""The registries of harnesses and task families.

Core names none of them: each harness package registers itself when `harness_env.envs` is
imported, each family when `harness_env.families` is (the entry points import both). Adding a
harness or a family is one registration; the pipeline, the server, the CLI and the tests find it
here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harness_env.core.errors import InvalidRequestError

if TYPE_CHECKING:
    from harness_env.core.harness import Harness

HARNESSES: dict[str, type] = {}  # name -> harness class
_FAMILY_LOADERS: dict[str, Callable[[], type]] = {}  # name -> a loader of the family class (imported on first use)
# A `harness-env` command of a family's own, with its own parser: name -> (help, a loader of its main(argv) -> exit code).
FamilyCommand = tuple[str, Callable[[], Callable[[list[str]], int]]]
FAMILY_COMMANDS: dict[str, FamilyCommand] = {}


def register_harness(name: str, cls: type) -> None:
    HARNESSES[name] = cls


def get_harness(name: str) -> Harness:
    cls = HARNESSES.get(name)
    if cls is None:
        raise InvalidRequestError(f"unknown harness {name!r}; choose one of: {', '.join(sorted(HARNESSES))}")
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
        raise InvalidRequestError(f"unknown task_family {name!r}; choose one of: {', '.join(family_names())}")
    return loader()()
