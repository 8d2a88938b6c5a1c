"""One package per harness; this registry maps the request's `harness` name to it."""

from __future__ import annotations

from harness_env.core.errors import InvalidRequestError
from harness_env.core.harness import Harness
from harness_env.envs.harbor.harness import HarborHarness
from harness_env.envs.opencode import OpenCodeHarness
from harness_env.envs.pi import PiHarness
from harness_env.envs.whitebox import WhiteboxHarness

HARNESSES: dict[str, type] = {"pi": PiHarness, "opencode": OpenCodeHarness, "whitebox": WhiteboxHarness, "harbor": HarborHarness}


def get_harness(name: str) -> Harness:
    cls = HARNESSES.get(name)
    if cls is None:
        raise InvalidRequestError(f"unknown harness {name!r}; choose one of: {', '.join(sorted(HARNESSES))}")
    return cls()
