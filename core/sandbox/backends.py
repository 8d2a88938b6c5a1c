"""The registry of sandbox backends a server can run its rollouts in, by name.

A server is told one name (`harness-env serve --sandbox-backend`, $HARNESS_ENV_SANDBOX_BACKEND;
default `local`) and asks this registry for the factory; it imports no backend itself. A backend
registers a maker: the server's sandbox settings in, a SandboxFactory (core/sandbox/base.py) out;
and, when it leaves anything on the host a killed owner cannot remove, its own clean-up: `sweep`
(every start of a server or a run sweeps what dead owners left) and `remove` (one rollout of a
server the job store knows died). Shared code calls every registered backend's, knowing no
backend's layout. `local` is registered here; another backend is one module plus one
`register_sandbox_backend`, in the package or, from another distribution, named by an entry point
of group `harness_env.sandbox_backends` (a `SandboxBackend`, or a function that registers;
core/plugins.py), loaded when this registry is first read.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from harness_env.core.errors import InvalidRequestError
from harness_env.core.plugins import PluginGroup, PluginRegistry
from harness_env.core.sandbox.base import SandboxFactory

DEFAULT_BACKEND = "local"
BACKEND_VAR = "HARNESS_ENV_SANDBOX_BACKEND"


@dataclass(frozen=True)
class SandboxSettings:
    """What a server knows about how its sandboxes should be made; a backend reads what it uses."""

    use_bwrap: bool | None = None  # local: None bubblewrap when it works here, False plain processes


SandboxMaker = Callable[[SandboxSettings], SandboxFactory]
# At start, off the event loop: remove what this backend's dead owners left; one sentence per thing
# done or left. Must touch only what is provably a dead owner's.
Sweep = Callable[[], list[str]]
# A rollout of a server known dead, by the sandbox path its rollout reported: None when the path is
# not this backend's, else one sentence (what was removed, or what is left).
Remove = Callable[[str], str | None]


@dataclass(frozen=True)
class SandboxBackend:
    name: str
    make: SandboxMaker
    sweep: Sweep | None = None
    remove: Remove | None = None


def _local(settings: SandboxSettings) -> SandboxFactory:
    from harness_env.core.sandbox.factory import LocalSandboxFactory  # imported on first use

    return LocalSandboxFactory(settings.use_bwrap)


def _local_sweep() -> list[str]:
    from harness_env.core.sandbox.sweep import sweep_local

    return sweep_local()


def _local_remove(path: str) -> str | None:
    from harness_env.core.sandbox.sweep import remove_rollout

    return remove_rollout(path)


def _register(backend: SandboxBackend) -> None:
    if not isinstance(backend, SandboxBackend):
        raise TypeError(f"names a {type(backend).__name__}: name a SandboxBackend, or a function that calls register_sandbox_backend")
    SANDBOX_BACKENDS[backend.name] = backend


SANDBOX_PLUGINS = PluginGroup("harness_env.sandbox_backends", _register)
SANDBOX_BACKENDS: dict[str, SandboxBackend] = PluginRegistry(
    SANDBOX_PLUGINS, {DEFAULT_BACKEND: SandboxBackend(DEFAULT_BACKEND, _local, _local_sweep, _local_remove)}
)


def register_sandbox_backend(name: str, make: SandboxMaker, *, sweep: Sweep | None = None, remove: Remove | None = None) -> None:
    SANDBOX_BACKENDS[name] = SandboxBackend(name, make, sweep, remove)


def default_backend() -> str:
    return os.environ.get(BACKEND_VAR) or DEFAULT_BACKEND


def check_backend(name: str, given: str = "sandbox backend") -> str:
    """`name` when registered; else InvalidRequestError naming the registered ones (`given`: what
    named it, as the user wrote it)."""
    if name not in SANDBOX_BACKENDS:
        raise InvalidRequestError(SANDBOX_PLUGINS.unknown(given, name, sorted(SANDBOX_BACKENDS)))
    return name


def sandbox_factory(name: str, settings: SandboxSettings) -> SandboxFactory:
    """The factory of backend `name`; InvalidRequestError naming the registered ones when unknown."""
    return SANDBOX_BACKENDS[check_backend(name)].make(settings)


def sweep_backends() -> list[str]:
    """Every registered backend's start-up sweep (blocking). Never raises: a backend's failure is
    one sentence, and the others still sweep."""
    notes: list[str] = []
    for backend in list(SANDBOX_BACKENDS.values()):
        if backend.sweep is None:
            continue
        try:
            notes += backend.sweep()
        except Exception as e:  # one backend's bug must not keep the others' leftovers
            notes.append(f"sandbox backend {backend.name!r}: its start-up sweep failed ({type(e).__name__}: {e})")
    return notes


def remove_leftover(path: str) -> str | None:
    """Clean up after one rollout of a dead server (blocking): the note of the backend whose
    sandbox `path` is, or None when none claims it. Never raises."""
    for backend in list(SANDBOX_BACKENDS.values()):
        if backend.remove is None:
            continue
        try:
            note = backend.remove(path)
        except Exception as e:
            note = f"sandbox backend {backend.name!r} failed to remove it ({type(e).__name__}: {e})"
        if note is not None:
            return note
    return None
