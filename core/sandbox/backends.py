"""The registry of sandbox backends a server can run its rollouts in, by name.

A server is told one name (`harness-env serve --sandbox-backend`, $HARNESS_ENV_SANDBOX_BACKEND;
default `local`) and asks this registry for the factory; it imports no backend itself. A backend
registers a maker: the server's sandbox settings in, a SandboxFactory (core/sandbox/base.py) out.
`local` is registered here; another backend is one module plus one `register_sandbox_backend`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from harness_env.core.errors import InvalidRequestError
from harness_env.core.sandbox.base import SandboxFactory

DEFAULT_BACKEND = "local"
BACKEND_VAR = "HARNESS_ENV_SANDBOX_BACKEND"


@dataclass(frozen=True)
class SandboxSettings:
    """What a server knows about how its sandboxes should be made; a backend reads what it uses."""

    use_bwrap: bool | None = None  # local: None bubblewrap when it works here, False plain processes


SandboxMaker = Callable[[SandboxSettings], SandboxFactory]


def _local(settings: SandboxSettings) -> SandboxFactory:
    from harness_env.core.sandbox.factory import LocalSandboxFactory  # imported on first use

    return LocalSandboxFactory(settings.use_bwrap)


SANDBOX_BACKENDS: dict[str, SandboxMaker] = {DEFAULT_BACKEND: _local}


def register_sandbox_backend(name: str, make: SandboxMaker) -> None:
    SANDBOX_BACKENDS[name] = make


def default_backend() -> str:
    return os.environ.get(BACKEND_VAR) or DEFAULT_BACKEND


def check_backend(name: str, given: str = "sandbox backend") -> str:
    """`name` when registered; else InvalidRequestError naming the registered ones (`given`: what
    named it, as the user wrote it)."""
    if name not in SANDBOX_BACKENDS:
        raise InvalidRequestError(f"unknown {given} {name!r}; choose one of: {', '.join(sorted(SANDBOX_BACKENDS))}")
    return name


def sandbox_factory(name: str, settings: SandboxSettings) -> SandboxFactory:
    """The factory of backend `name`; InvalidRequestError naming the registered ones when unknown."""
    return SANDBOX_BACKENDS[check_backend(name)](settings)
