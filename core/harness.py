"""What the engine needs from a harness package (envs/*): how to launch its CLI and read it.

Everything shared (sandbox, proxy, phases, reward) stays in core; a harness only says what
differs: which tools it needs installed, the files and command line that configure and launch it,
and how to read its output.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from harness_env.core import toolchain
from harness_env.core.capture import fastjson
from harness_env.core.sandbox.base import ExecResult
from harness_env.models import RolloutRequest

if TYPE_CHECKING:
    from pathlib import Path

    from pydantic import BaseModel

    from harness_env.core.sandbox.base import Sandbox
    from harness_env.models import DatasetTaskInfo, RolloutResult


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
    stdin: str | None = None  # what the CLI reads on stdin (else /dev/null): a message no argv handling can rewrite


STDIN_FILE = ".cache/harness-env/stdin"  # below HOME: never in the workspace, never a task file


def reading_stdin_from(path: str, argv: list[str]) -> list[str]:
    """`argv` with `path` as its stdin. The file is opened, then removed before the CLI starts, so
    the agent never finds a second copy of its task in HOME."""
    return ["bash", "-c", 'exec 0<"$0" && rm -f -- "$0" && exec "$@"', path, *argv]


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


class JsonEventParser:
    """An OutputParser for a CLI that prints one JSON event per line, mixed with log lines: each
    object is counted and handed to `on_event`, which keeps the final text, the error and the tool
    calls as that CLI reports them."""

    def __init__(self) -> None:
        self.final_text = ""
        self.error: str | None = None
        self.events = 0

    def feed_line(self, line: str) -> None:
        line = line.strip()
        if not line.startswith("{"):
            return
        try:  # lone surrogates made U+FFFD, nesting bounded: what it keeps goes into the result
            event = fastjson.loads(line)
        except ValueError:
            return
        if isinstance(event, dict):
            self.events += 1
            self.on_event(event)

    def on_event(self, event: dict[str, Any]) -> None:
        raise NotImplementedError


class CallResultParser(JsonEventParser):
    """A JsonEventParser for a CLI that reports a tool call and its result as two events: a call
    counts when both were seen, each id once (a call that never got its result did not run)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: set[str] = set()
        self.results: set[str] = set()

    def outcome(self) -> AgentOutcome:
        return AgentOutcome(final_text=self.final_text, tool_calls=len(self.calls & self.results), error=self.error, events=self.events)


@dataclass(frozen=True)
class LocalTask:
    """A task of a harness's own at a local path: its name, its index in the dataset (None: the
    path is the task itself) and the harness options that name it."""

    name: str
    index: int | None
    harness_options: dict[str, Any]


# A fact a harness shows about what it ran, on its own tab of the web page: a label, and a text, a
# map (shown as a table) or None (shown as "none").
RunFact = tuple[str, "str | dict[str, float] | None"]


class Harness(Protocol):
    name: str
    capabilities: tuple[str, ...]
    options_model: type[BaseModel] | None  # the harness's own options (request.harness_options), if any
    # The wire dialect it speaks to the proxy (core/capture/dialects), and so the only native
    # upstream it can be passed through to; None: it checks for itself in prepare (Harbor's agents).
    dialect: str | None
    pin: toolchain.ToolPin | None  # its CLI as `harness-env install` fetches it (core/toolchain.py); None: not from npm

    def prepare(self, request: RolloutRequest, *, trusted: bool) -> RolloutRequest:
        """The request as this harness needs it (Harbor resolves its task directory); raise
        InvalidRequestError for what is wrong. `trusted`: the caller may name server paths."""
        ...

    def version(self) -> str | None:
        """Installed version, or None when not installed."""
        ...

    def check_installed(self) -> None:
        """Raise ToolMissingError naming the install command when the CLI is missing."""
        ...

    def readonly_paths(self) -> list[str]:
        """Host paths the sandbox must expose read-only (the CLI and its runtime)."""
        ...

    async def run_agent(self, ctx: LaunchContext, sandbox: Sandbox, stop: asyncio.Event) -> tuple[ExecResult, AgentOutcome]:
        """Run the agent in `sandbox` until it ends, `ctx.request.agent_timeout_s` passes (then
        `timed_out`) or `stop` is set (then `stopped`)."""
        ...

    def list_tasks(self, dataset: str, split: str | None) -> list[DatasetTaskInfo] | None:
        """The tasks of a dataset on the server, for a remote caller (`list_tasks`, GET
        /<harness>/tasks); None: this harness brings no tasks of its own. Raise InvalidRequestError
        for a dataset the caller may not name or that does not exist."""
        ...

    def local_tasks(self, path: Path, split: str | None) -> list[LocalTask] | None:
        """The tasks at a local path (`harness-env eval TASKS`, a trusted caller) when it is a task
        or dataset of this harness's own; None: it is not (other readers are asked)."""
        ...

    def result_facts(self, result: RolloutResult) -> list[RunFact] | None:
        """What this harness ran, for its own tab on the web page (the agent's trajectory is shown
        under them); None: `result` holds nothing of this harness's own, and no tab is shown."""
        ...


@dataclass
class AgentEnd:
    """How the agent's run ended, as facts; core/agent_end.py's classify_agent_end turns them into
    the rollout's error (or none), the same way for every harness."""

    exit_code: int | None = None  # None: killed, or the harness reports no exit code
    timed_out: bool = False
    stopped: bool = False  # stopped early because the policy's calls kept failing
    turn_limit_hit: bool = False  # the harness itself stopped at max_turns
    error: str | None = None  # the run failed, in words ("pi exited 1: ...", Harbor's agent error)
    timeout_message: str | None = None  # the owner's own words for a timeout
    endpoint_detail: str = ""  # what to quote if the failure turns out to be the endpoint's
    failure: tuple[str, str] | None = None  # (error_kind, message) of a phase that is not the agent's (setup, sandbox, verify)


@dataclass
class TrialEnd:
    """What a harness that owns its environment reports back besides the result fields it filled:
    how the agent's run ended, and the reward."""

    agent: AgentEnd = field(default_factory=AgentEnd)
    outcome: AgentOutcome = field(default_factory=AgentOutcome)
    reward: float | None = None
    reward_source: str | None = None
    reward_notes: list[str] = field(default_factory=list)


@runtime_checkable
class OwnsEnvironment(Protocol):
    """A harness that runs the whole rollout (sandbox, setup, agent, verify) in an environment of
    its own making, e.g. a Harbor trial. It fills the same result the engine fills for the others
    (phases, commands' results, files, sandbox fields, its own extra fields) and says how its agent
    ended; the engine keeps the endpoint check, the capture session, the failure classification
    and the reward rules."""

    name: str

    def preflight(self, request: RolloutRequest, proxy_base_url: str) -> None:
        """Raise a HarnessEnvError (what is missing, how to fix it) before any work starts."""
        ...

    async def run_trial(self, ctx: LaunchContext, stop: asyncio.Event, emit: Callable[[str, str, str], None], result: RolloutResult) -> TrialEnd:
        """Run setup, agent and verify, filling `result`; never raise for what the trial itself did."""
        ...


class HarnessBase:
    """Defaults every harness shares: no options of its own, chat completions, no pinned CLI,
    nothing to prepare."""

    options_model: type[BaseModel] | None = None
    dialect: str | None = "chat_completions"
    pin: toolchain.ToolPin | None = None
    # A harness that owns its environment and makes leased directories of its own in the sandbox
    # directory (`<prefix>-<12 hex>`, lease beside: core/sandbox/lease.py) names their prefixes, so
    # the local backend's start-up sweep removes what a killed server left of them.
    leased_dir_prefixes: tuple[str, ...] = ()

    def prepare(self, request: RolloutRequest, *, trusted: bool) -> RolloutRequest:
        return request

    def list_tasks(self, dataset: str, split: str | None) -> list[DatasetTaskInfo] | None:
        return None

    def local_tasks(self, path: Path, split: str | None) -> list[LocalTask] | None:
        return None

    def result_facts(self, result: RolloutResult) -> list[RunFact] | None:
        return None


class PinnedCliHarness(HarnessBase):
    """What every harness whose CLI comes from the pinned toolchain shares (its `pin` says which
    npm package and version; `pin.name` is its `name`): the agent is that CLI, launched in the
    sandbox, its stdout parsed line by line."""

    name: str
    pin: toolchain.ToolPin
    # The CLI says why a run failed only in its JSON events on stdout (its stderr holds start-up
    # notices): the rollout's error quotes stderr's tail, so the parser's error is appended to it.
    reason_in_events: bool = False

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        raise NotImplementedError

    def parser(self) -> OutputParser:
        raise NotImplementedError

    async def run_agent(self, ctx: LaunchContext, sandbox: Sandbox, stop: asyncio.Event) -> tuple[ExecResult, AgentOutcome]:
        spec = self.launch(ctx)
        for path, content in spec.files.items():
            sandbox.write_file(path, content)
        argv = spec.argv
        if spec.stdin is not None:
            stdin_path = os.path.join(ctx.home, STDIN_FILE)
            sandbox.write_file(stdin_path, spec.stdin)
            argv = reading_stdin_from(stdin_path, argv)
        parser = self.parser()
        r = await sandbox.exec(argv, timeout=ctx.request.agent_timeout_s, env=spec.env, max_output=256 * 1024, on_stdout_line=parser.feed_line, stop=stop)
        outcome = parser.outcome()
        if self.reason_in_events and r.exit_code not in (0, None) and outcome.error:
            r = replace(r, stderr=f"{r.stderr.rstrip()}\n{outcome.error}")
        return r, outcome

    def version(self) -> str | None:
        return toolchain.installed_version(self.pin)

    def check_installed(self) -> None:
        toolchain.harness_command(self.pin)

    def readonly_paths(self) -> list[str]:
        return [str(toolchain.tools_dir())]

    def command(self) -> list[str]:
        return toolchain.harness_command(self.pin)
