"""The harnesses the end-to-end suites run in our sandbox, and the check a parametrised fixture
makes that one is installed (a missing CLI is a failure that says how to install it, never a skip)."""

import pytest

from harness_env.core.errors import ToolMissingError
from harness_env.core.harness import PinnedCliHarness
from harness_env.envs import HARNESSES as REGISTERED
from harness_env.envs import get_harness

# Every registered harness that runs in our sandbox (a harness that owns its environment, Harbor,
# has its own suite); those with a CLI process of their own (the white-box loop has none and does
# not stream).
HARNESSES = [name for name, cls in REGISTERED.items() if not hasattr(cls, "run_trial")]
CLI_HARNESSES = {name for name in HARNESSES if issubclass(REGISTERED[name], PinnedCliHarness)}


def installed(name: str) -> str:
    """`name`, once its CLI is known to be installed."""
    try:
        get_harness(name).check_installed()
    except ToolMissingError as e:
        pytest.fail(f"{e} (./dev test installs it)")
    return name
