"""What a test needs from the machine: a missing part fails the test with the command that
installs it, never a skip (a skip would hide it in CI, where `./dev test` installs everything)."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from harness_env.core.sandbox.local import bwrap_available

BWRAP = "bubblewrap is not installed: apt-get install bubblewrap (./dev test installs it)"


def bwrap() -> None:
    if not bwrap_available():
        pytest.fail(BWRAP)


def module(name: str, install: str) -> ModuleType:
    """Import `name`, or fail (at collection, when called at module level) saying what to install."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        pytest.fail(f"{name} cannot be imported ({e}): {install}", pytrace=False)
