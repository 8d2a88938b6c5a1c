"""Harbor's own agents, preinstalled for our local environment.

Harbor's installed agents (harbor/agents/installed/*) install their CLI inside the environment at
setup, from the internet (nvm, npm). Our `local` environment has no internet and shares the host's
read-only system, so there the CLI comes from `harness-env install` (the pinned toolchain) instead:
these subclasses keep everything Harbor's agent does (its config files, command line, log parsing,
ATIF trajectory) and replace only `install` by a check that the pinned CLI is on the sandbox's
PATH (LocalHarborEnvironment puts it there).

An agent without an entry here runs as Harbor ships it (by name): oracle and nop need no install;
on a provider environment (docker, e2b, ...) Harbor's own installers work as designed.
"""

from __future__ import annotations

import shlex

from harbor.agents.installed.opencode import OpenCode
from harbor.agents.installed.pi import Pi
from harbor.environments.base import BaseEnvironment

from harness_env.core import toolchain
from harness_env.envs.opencode import config as opencode_config
from harness_env.envs.pi import config as pi_config


class _Preinstalled:
    """Mixin: `install` checks the pinned CLI instead of downloading one."""

    TOOL: str

    async def install(self, environment: BaseEnvironment) -> None:
        r = await environment.exec(command=f"command -v {shlex.quote(self.TOOL)}")
        if r.return_code != 0:
            raise RuntimeError(
                f"{self.TOOL} is not available in the environment; run `harness-env install {self.TOOL}` on the server"
            )
        if getattr(self, "_version", None) is None:
            self._version = toolchain.installed_version(self.TOOL)  # type: ignore[attr-defined]


class PreinstalledPi(_Preinstalled, Pi):
    TOOL = "pi"


class PreinstalledOpenCode(_Preinstalled, OpenCode):
    TOOL = "opencode"


# Harbor agent name -> (our pinned tool, import path of the preinstalled subclass)
PREINSTALLED: dict[str, tuple[str, str]] = {
    "pi": ("pi", f"{__name__}:PreinstalledPi"),
    "opencode": ("opencode", f"{__name__}:PreinstalledOpenCode"),
}

# Extra environment each agent's CLI needs offline: the table of our own harness of that CLI.
OFFLINE_ENV: dict[str, dict[str, str]] = {
    "pi": pi_config.OFFLINE_ENV,
    "opencode": opencode_config.OFFLINE_ENV,
}
