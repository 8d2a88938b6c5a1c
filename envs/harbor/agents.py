"""Harbor's own agents, preinstalled for our local environment.

Harbor's installed agents (harbor/agents/installed/*) install their CLI inside the environment at
setup, from the internet (nvm, npm). Our `local` environment has no internet and shares the host's
read-only system, so there the CLI comes from `harness-env install` (the pinned toolchain) instead:
these subclasses keep everything Harbor's agent does (its config files, command line, log parsing,
ATIF trajectory) and replace only `install` by a check that the pinned CLI is on the sandbox's
PATH (LocalHarborEnvironment puts it there).

An agent without an entry here runs as Harbor ships it (by name): oracle and nop need no install;
on a provider environment (docker, e2b, ...) Harbor's own installers work as designed, and only
what differs in our configuration is kept there too (PROVIDER_AGENTS: Gemini CLI's offline settings).
"""

from __future__ import annotations

import shlex
from typing import Any

from harbor.agents.installed.claude_code import ClaudeCode
from harbor.agents.installed.codex import Codex
from harbor.agents.installed.gemini_cli import GeminiCli
from harbor.agents.installed.opencode import OpenCode
from harbor.agents.installed.pi import Pi
from harbor.environments.base import BaseEnvironment

from harness_env.core import toolchain
from harness_env.envs.claude_code import config as claude_config
from harness_env.envs.codex import config as codex_config
from harness_env.envs.common.config import deep_merge
from harness_env.envs.gemini_cli import config as gemini_config
from harness_env.envs.opencode import config as opencode_config
from harness_env.envs.pi import config as pi_config


class _Preinstalled:
    """Mixin: `install` checks the pinned CLI instead of downloading one."""

    TOOL: str  # our pinned tool's name (a harness's pin); its command is the pin's `bin`

    async def install(self, environment: BaseEnvironment) -> None:
        command = toolchain.pin_of(self.TOOL).bin
        r = await environment.exec(command=f"command -v {shlex.quote(command)}")
        if r.return_code != 0:
            raise RuntimeError(f"{self.TOOL} is not available in the environment; run `harness-env install {self.TOOL}` on the server")
        if getattr(self, "_version", None) is None:
            self._version = toolchain.installed_version(self.TOOL)  # type: ignore[attr-defined]


class PreinstalledPi(_Preinstalled, Pi):
    TOOL = "pi"


class PreinstalledOpenCode(_Preinstalled, OpenCode):
    TOOL = "opencode"


class PreinstalledCodex(_Preinstalled, Codex):
    TOOL = "codex"


class PreinstalledClaudeCode(_Preinstalled, ClaudeCode):
    TOOL = "claude-code"


class OfflineGeminiCli(GeminiCli):
    """Harbor's Gemini CLI, installed as Harbor does, with Harbor's settings.json (the API-key auth
    type) plus our offline settings: no updates, usage statistics, telemetry, ripgrep download or
    web tools (envs/gemini_cli/config.py's table). On a provider's sandbox the CLI would otherwise
    call Google's services besides the proxy."""

    def _build_settings_config(self, model: str | None = None, auth_type: str | None = None) -> tuple[dict[str, Any] | None, str | None]:
        config, alias = super()._build_settings_config(model, auth_type)
        return deep_merge(gemini_config.settings_dict(), config or {}), alias


class PreinstalledGeminiCli(_Preinstalled, OfflineGeminiCli):
    TOOL = "gemini-cli"


# Harbor agent name -> (our pinned tool, import path of the preinstalled subclass)
PREINSTALLED: dict[str, tuple[str, str]] = {
    "pi": ("pi", f"{__name__}:PreinstalledPi"),
    "opencode": ("opencode", f"{__name__}:PreinstalledOpenCode"),
    "codex": ("codex", f"{__name__}:PreinstalledCodex"),
    "claude-code": ("claude-code", f"{__name__}:PreinstalledClaudeCode"),
    "gemini-cli": ("gemini-cli", f"{__name__}:PreinstalledGeminiCli"),
}

# Harbor agent name -> import path of the class that runs it on a provider's sandbox, where it is
# not Harbor's own (Harbor installs it there either way).
PROVIDER_AGENTS: dict[str, str] = {"gemini-cli": f"{__name__}:OfflineGeminiCli"}

# Extra environment each agent's CLI needs offline: the table of our own harness of that CLI.
OFFLINE_ENV: dict[str, dict[str, str]] = {
    "pi": pi_config.OFFLINE_ENV,
    "opencode": opencode_config.OFFLINE_ENV,
    "codex": codex_config.OFFLINE_ENV,
    # Claude Code: also every tool's schema in the request (no server-side tool search) and one retry.
    "claude-code": {**claude_config.OFFLINE_ENV, **claude_config.WIRE_ENV},
    "gemini-cli": gemini_config.OFFLINE_ENV,
}
