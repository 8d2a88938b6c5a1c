"""What the engine needs from a harness package (envs/*): how to launch its CLI and read it.

Everything shared (sandbox, proxy, phases, reward) stays in core; a harness only says what
differs: which tools it needs installed, the files and command line that configure and launch it,
and how to read its output.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from harness_env.core import toolchain
from harness_env.core.sandbox.base import ExecResult
from harness_env.models import CommandResult, RolloutRequest

if TYPE_CHECKING:
    from harness_env.core.sandbox.local import LocalSandbox


@dataclass(frozen=True)
class LaunchContext:
    request: RolloutRequest
    workspace: str  # the agent's working directory (inside the sandbox)
    home: str  # the sandbox's HOME
    proxy_base_url: str  # OpenAI-compatible base URL of the capture proxy as the sandbox sees it, ends in /v1
    session_key: str  # the per-rollout capture key: the only key the harness ever sees
    host_proxy_base_url: str = ""  # the same proxy as the server process reaches it (default: proxy_base_url)


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


@dataclass
class PhaseRecord:
    name: str
    started: float  # wall-clock seconds
    duration_s: float
    ok: bool = True
    detail: str = ""


@dataclass
class TrialReport:
    """What a harness that owns its whole environment (Harbor: sandbox, setup, agent and verifier
    in one trial) hands back to the engine, which keeps the endpoint check, the capture session
    and the result's shape the same as for every other harness."""

    failure: tuple[str, str] | None = None  # (error_kind, message), when something broke
    reward: float | None = None
    reward_source: str | None = None
    reward_notes: list[str] = field(default_factory=list)
    agent: AgentOutcome = field(default_factory=AgentOutcome)
    agent_exit_code: int | None = None
    agent_log_tail: str = ""
    setup_results: list[CommandResult] = field(default_factory=list)
    verify_results: list[CommandResult] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    sandbox_id: str = ""
    sandbox_backend: str = ""
    sandbox_notes: list[str] = field(default_factory=list)
    phases: list[PhaseRecord] = field(default_factory=list)
    result_fields: dict[str, Any] = field(default_factory=dict)  # RolloutResult fields only this harness fills


@runtime_checkable
class EnvironmentOwner(Protocol):
    """A harness that runs the whole rollout in an environment of its own making."""

    name: str

    def preflight(self, request: RolloutRequest, proxy_base_url: str) -> None:
        """Raise a HarnessEnvError (what is missing, how to fix it) before any work starts."""
        ...

    async def run_trial(
        self, ctx: LaunchContext, stop: asyncio.Event, emit: Callable[[str, str, str], None]
    ) -> TrialReport:
        """Run setup, agent and verify; never raise for what the trial itself did."""
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
