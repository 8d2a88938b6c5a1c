"""What the engine needs from a harness package (envs/*): how to launch its CLI and read it.

Everything shared (sandbox, proxy, phases, reward) stays in core; a harness only says what
differs: which tools it needs installed, the files and command line that configure and launch it,
and how to read its output.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from harness_env.core import toolchain
from harness_env.core.sandbox.base import ExecResult
from harness_env.models import RolloutRequest

if TYPE_CHECKING:
    from harness_env.core.sandbox.local import LocalSandbox


@dataclass(frozen=True)
class LaunchContext:
    request: RolloutRequest
    workspace: str  # the agent's working directory (inside the sandbox)
    home: str  # the sandbox's HOME
    proxy_base_url: str  # OpenAI-compatible base URL of the capture proxy, ends in /v1
    session_key: str  # the per-rollout capture key: the only key the harness ever sees


@dataclass
class LaunchSpec:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the sandbox environment
    files: dict[str, str] = field(default_factory=dict)  # absolute path -> content, written before launch


@dataclass
class AgentOutcome:
    final_text: str = ""
    tool_calls: int | None = None
    error: str | None = None  # the harness reported a failed model call or run
    events: int = 0
    turn_limit_hit: bool = False  # the harness itself stopped at max_turns


class OutputParser(Protocol):
    def feed_line(self, line: str) -> None: ...

    def outcome(self) -> AgentOutcome: ...


class Harness(Protocol):
    name: str
    capabilities: tuple[str, ...]

    def version(self) -> str | None:
        """Installed version, or None when not installed."""
        ...

    def check_installed(self) -> None:
        """Raise ToolMissingError naming the install command when the CLI is missing."""
        ...

    def readonly_paths(self) -> list[str]:
        """Host paths the sandbox must expose read-only (the CLI and its runtime)."""
        ...

    async def run_agent(self, ctx: LaunchContext, sandbox: LocalSandbox, stop: asyncio.Event) -> tuple[ExecResult, AgentOutcome]:
        """Run the agent in `sandbox` until it ends, `ctx.request.agent_timeout_s` passes (then
        `timed_out`) or `stop` is set (then `stopped`)."""
        ...


class PinnedCliHarness:
    """What every harness whose CLI comes from the pinned toolchain shares (its `name` is its
    entry in toolchain.PINS): the agent is that CLI, launched in the sandbox, its stdout parsed
    line by line."""

    name: str

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        raise NotImplementedError

    def parser(self) -> OutputParser:
        raise NotImplementedError

    async def run_agent(self, ctx: LaunchContext, sandbox: LocalSandbox, stop: asyncio.Event) -> tuple[ExecResult, AgentOutcome]:
        spec = self.launch(ctx)
        for path, content in spec.files.items():
            sandbox.write_file(path, content)
        parser = self.parser()
        r = await sandbox.exec(
            spec.argv,
            timeout=ctx.request.agent_timeout_s,
            env=spec.env,
            max_output=256 * 1024,
            on_stdout_line=parser.feed_line,
            stop=stop,
        )
        return r, parser.outcome()

    def version(self) -> str | None:
        return toolchain.installed_version(self.name)

    def check_installed(self) -> None:
        toolchain.harness_command(self.name)

    def readonly_paths(self) -> list[str]:
        return [str(toolchain.tools_dir())]

    def command(self) -> list[str]:
        return toolchain.harness_command(self.name)
