"""harness="harbor": one rollout is one Harbor trial (Harbor's task format, agents, environments
and verifier), with the agent's model calls going through our capture proxy.

The engine keeps what every harness shares (endpoint check and probe, the capture session, the
result's shape, failure classification); this module builds the trial (envs/harbor/config.py),
runs it (envs/harbor/trial.py) and turns Harbor's outcome into a TrialEnd (filling the result as it goes). A uniform Task is
converted into a Harbor task directory first (envs/harbor/task_dir.py).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from harness_env.core import toolchain
from harness_env.core.capture.passthrough import check_wire_api
from harness_env.core.collect import LOG_TAIL_CHARS
from harness_env.core.errors import InvalidRequestError, SandboxError
from harness_env.core.harness import AgentEnd, AgentOutcome, HarnessBase, LaunchContext, LocalTask, RunFact, TrialEnd
from harness_env.core.sandbox import safefs
from harness_env.core.sandbox.lease import lease_path, write_lease
from harness_env.core.sandbox.local import bwrap_available, sandboxes_root
from harness_env.envs.harbor.config import (
    AGENT_API_FORMATS,
    CHAT_API_FORMAT,
    FORMAT_DIALECTS,
    LOCAL_SANDBOX,
    MODEL_FREE_AGENTS,
    SERVED_API_FORMATS,
    check_agent_and_sandbox,
    declared_api_formats,
    served_api_format,
    trial_config,
    trial_deadline,
)
from harness_env.envs.harbor.options import HARNESS_NAME, HarborOptions, HarborRunInfo
from harness_env.envs.harbor.task_dir import VERIFY_RESULTS_FILE, harbor_task_model, load_task_dir, script_budget, task_to_task_dir
from harness_env.envs.harbor.trial import HarborTrialOutcome, count_tool_calls, read_trajectory, run_harbor_trial
from harness_env.models import CommandResult, DatasetTaskInfo, Phase, RolloutRequest, RolloutResult

# Harbor's exception class names -> our error kinds (the rest: by the phase it stopped in).
EXCEPTION_KINDS = {
    "AgentTimeoutError": "agent_timeout",
    "NonZeroAgentExitCodeError": "agent_error",
    "AgentSetupTimeoutError": "sandbox",
    "EnvironmentStartTimeoutError": "sandbox",
    "SandboxError": "sandbox",
    "VerifierTimeoutError": "verify",
    "RewardFileNotFoundError": "verify",
    "RewardFileEmptyError": "verify",
    "VerifierOutputParseError": "verify",
    "ImportError": "sandbox",
}
NO_REWARD_EXCEPTIONS = frozenset({"RewardFileNotFoundError", "RewardFileEmptyError"})
PHASES = (("environment_setup", "sandbox"), ("agent_setup", "setup"), ("agent_execution", "agent"), ("verifier", "verify"))
VERIFY_RESULTS_MAX_BYTES = 1024 * 1024
MAX_AGENT_LOG_ENTRIES = 1000  # entries of the agent's log directory looked at for *.txt logs
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0"})


def load_harbor_runtime() -> None:
    """Import Harbor's trial machinery (it pulls in LiteLLM: about 10 s of CPU the first time in a
    process). Called in a worker thread so the event loop, and other rollouts' proxying, go on."""
    import harbor.llms.litellm_config
    import harbor.trial.trial  # noqa: F401 - loaded, not used (both lines; ruff flags only the last binding of `harbor`)


def run_preflight(sandbox: str) -> None:
    """Harbor's own credential check for a provider (it names the missing variables), as a
    SandboxError instead of Harbor's SystemExit."""
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.environment_type import EnvironmentType

    try:
        EnvironmentFactory.run_preflight(EnvironmentType(sandbox))
    except SystemExit as e:
        raise SandboxError(f"sandbox {sandbox!r} cannot start here: {e}") from None
    except ImportError as e:
        raise SandboxError(f"sandbox {sandbox!r} needs a package that is not installed ({e}); install Harbor's extra for it") from None


def check_agent_speaks_served_format(agent: str) -> None:
    """The capture proxy serves OpenAI chat completions, the Responses API, Anthropic Messages and
    Gemini's generateContent; each Harbor agent declares the wire formats it speaks
    (MODEL_CONNECTION). Refuse the others here, before a provider sandbox is paid for: Harbor itself
    would say so only when it builds the trial. Imports the agent's module (and LiteLLM, which the
    trial needs anyway): call it off the event loop."""
    if agent in MODEL_FREE_AGENTS:
        return
    formats = declared_api_formats(agent)
    if served_api_format(formats) is None:
        speaks = f"it speaks only {', '.join(formats)}" if formats else "it takes no custom model endpoint"
        raise InvalidRequestError(
            f"Harbor agent {agent!r} cannot be pointed at the capture proxy, which serves {', '.join(SERVED_API_FORMATS)} ({speaks}); "
            "choose an agent that speaks one of them, e.g. pi, opencode, codex, claude-code, gemini-cli, terminus-2, mini-swe-agent"
        )


def _phase_records(result: Any) -> list[Phase]:
    out = []
    for attr, name in PHASES:
        timing = getattr(result, attr, None) if result is not None else None
        if timing is None or timing.started_at is None:
            continue
        end: datetime | None = timing.finished_at
        duration = (end - timing.started_at).total_seconds() if end else 0.0
        out.append(Phase(name=name, started=timing.started_at.timestamp(), duration_s=round(duration, 4), ok=end is not None))
    return out


def _subclass_names(cls: type) -> set[str]:
    names, todo = set(), [cls]
    while todo:
        c = todo.pop()
        names.add(c.__name__)
        todo.extend(c.__subclasses__())
    return names


def agent_error_names() -> set[str]:
    """Harbor's failed-agent exceptions: NonZeroAgentExitCodeError and its subclasses
    (ContextWindowExceededError, ApiRateLimitError, NetworkConnectionError, ...)."""
    from harbor.agents.installed.base import NonZeroAgentExitCodeError

    return _subclass_names(NonZeroAgentExitCodeError)


# Where a trial that hit our deadline (or failed in an unnamed way) was: the last phase it started.
# A trial's directory in the sandbox directory: trial-<id>, leased (`harbor-` is the name trials had
# before: an upgraded server still sweeps what an older one left).
TRIAL_PREFIX = "trial"
PHASE_KINDS = {None: "sandbox", "sandbox": "sandbox", "agent": "agent_error", "verify": "verify"}


def classify(out: HarborTrialOutcome) -> tuple[str, str] | None:
    """(error_kind, message) for what stopped the trial, None when it ran through."""
    if out.exception is None:
        return None
    name = out.exception_type or ""
    if name == "TimeoutError":  # our one deadline: blame the phase it was in
        kind = "agent_timeout" if out.last_phase == "agent" else PHASE_KINDS.get(out.last_phase, "sandbox")
    elif name in EXCEPTION_KINDS:
        kind = EXCEPTION_KINDS[name]
    elif name in agent_error_names():
        kind = "agent_error"
    elif out.result is None and name in ("ValueError", "TypeError", "ValidationError"):
        kind = "invalid_request"  # Harbor refused the trial's configuration (e.g. agent_kwargs)
    else:
        kind = PHASE_KINDS.get(out.last_phase, "sandbox")
    if "environment/setup.sh" in out.exception:
        kind = "setup"
    return kind, f"Harbor: {out.exception[:2000]}"


def _read_tail(directory: Path, name: str, chars: int) -> str:
    """The last `chars` characters of a file the agent or the verifier wrote, without reading the
    whole of it (it can be as large as they like), a link never followed, a FIFO never waited on
    (those read as ""). Blocking: call it off the event loop."""
    data = safefs.read_regular(directory, name, 4 * chars, tail=True)  # at most 4 bytes per UTF-8 character
    return "" if data is None else data.decode("utf-8", errors="replace")[-chars:]


def _agent_log_tail(agent_dir: Path | None) -> str:
    if agent_dir is None:
        return ""
    try:
        entries, _ = safefs.scan_dir(agent_dir, max_entries=MAX_AGENT_LOG_ENTRIES)
    except OSError:
        return ""
    parts = []
    for entry in entries:
        if entry.kind == "file" and entry.name.endswith(".txt"):
            parts.append(f"[{entry.name}]\n{_read_tail(agent_dir, entry.name, LOG_TAIL_CHARS)}")
    return "\n".join(parts)[-LOG_TAIL_CHARS:]


def _final_text(trajectory: dict[str, Any] | None) -> str:
    for step in reversed((trajectory or {}).get("steps") or []):
        if isinstance(step, dict) and step.get("source") == "agent" and isinstance(step.get("message"), str) and step["message"].strip():
            return step["message"]
    return ""


def _verify_results(out: HarborTrialOutcome, verify: list[str] | None) -> list[CommandResult]:
    """Per-command results for a converted Task (test.sh logs each exit code); for a Harbor task,
    one entry for tests/test.sh with its output."""
    vdir = out.verifier_dir
    if vdir is None or not vdir.is_dir():
        return []
    stdout = _read_tail(vdir, "test-stdout.txt", 8000)
    # Verify commands (and, on a provider, what the agent left running) can write this file: skip what is not ours.
    raw = safefs.read_regular(vdir, VERIFY_RESULTS_FILE, VERIFY_RESULTS_MAX_BYTES) if verify is not None else None
    if raw is not None:
        results = []
        head = raw.decode("utf-8", errors="replace")  # ours is a line per command
        for line in head.splitlines():
            try:
                entry = json.loads(line)
                if not isinstance(entry, dict):
                    continue
                timed_out = entry.get("timed_out") is True
                results.append(
                    CommandResult(
                        cmd=verify[entry["index"]],
                        timed_out=timed_out,  # as natively: no exit code
                        exit_code=None if timed_out else int(entry["exit_code"]),
                        duration_s=float(entry.get("duration_s") or 0),
                    )
                )
            except (ValueError, KeyError, IndexError, TypeError, OverflowError):
                continue
        if results:
            results[-1].stdout = stdout
            return results
    return [CommandResult(cmd="tests/test.sh", exit_code=None, stdout=stdout)] if stdout or out.result is not None else []


class HarborHarness(HarnessBase):
    name = HARNESS_NAME
    capabilities = ("harbor_tasks", "harbor_agents", "sandbox_providers", "atif_trajectory")
    options_model = HarborOptions  # its own options (envs/harbor/options.py): request.harness_options
    dialect = None  # its agent's: checked in prepare
    leased_dir_prefixes = (TRIAL_PREFIX, "harbor")  # its trials' directories (core/sandbox/sweep.py)

    def version(self) -> str | None:
        try:
            return metadata.version("harbor")
        except metadata.PackageNotFoundError:
            return None

    def check_installed(self) -> None:
        harbor_task_model()  # ToolMissingError naming the extra

    def readonly_paths(self) -> list[str]:
        return []

    def result_facts(self, result: RolloutResult) -> list[RunFact] | None:
        """A trial's task, agent, sandbox, exception and verifier rewards; read back from JSON, the
        run info is a plain HarnessRunInfo with the same fields."""
        info = result.run_info
        return None if info is None else HarborRunInfo.model_validate(info.model_dump()).facts()

    def local_tasks(self, path: Path, split: str | None) -> list[LocalTask] | None:
        """A Harbor task directory (task.toml), or a dataset of them (`split`: its subdirectory)."""
        from harness_env.envs.harbor.resolve import list_tasks

        if (path / "task.toml").is_file():
            return [LocalTask(path.name, None, {"task_dir": str(path.resolve())})]
        if not split and not any((d / "task.toml").is_file() for d in path.iterdir() if d.is_dir()):
            return None
        where = str(path.resolve())
        return [LocalTask(t.name, t.index, {"dataset": where, "task_index": t.index}) for t in list_tasks(where, split, trusted=True)]

    def list_tasks(self, dataset: str, split: str | None) -> list[DatasetTaskInfo]:
        """A Harbor dataset's tasks under $HARNESS_ENV_HARBOR_TASKS_DIR, in task_index order."""
        from harness_env.envs.harbor.resolve import list_remote_tasks

        return list_remote_tasks(dataset, split)

    def preflight(self, request: RolloutRequest, proxy_base_url: str) -> None:
        opts = HarborOptions.of(request)
        check_agent_and_sandbox(opts)
        if opts.sandbox == LOCAL_SANDBOX:
            from harness_env.envs.harbor.agents import PREINSTALLED
            from harness_env.envs.harbor.local_env import NO_BWRAP_MESSAGE

            if not bwrap_available():
                raise SandboxError(NO_BWRAP_MESSAGE)
            if opts.agent in PREINSTALLED:
                toolchain.harness_command(PREINSTALLED[opts.agent][0])  # ToolMissingError: how to install
            return
        check_agent_speaks_served_format(opts.agent)
        run_preflight(opts.sandbox)
        if (urlsplit(proxy_base_url).hostname or "") in LOOPBACK_HOSTS:
            raise SandboxError(
                f"sandbox {opts.sandbox!r} runs remotely and cannot reach the capture proxy at {proxy_base_url}; "
                "start the server with --public-url (or HARNESS_ENV_PUBLIC_URL) set to an address the provider's sandboxes can reach"
            )

    def prepare(self, request: RolloutRequest, *, trusted: bool) -> RolloutRequest:
        """The Harbor task named by the request, resolved (its instruction read, paths confined)."""
        from harness_env.envs.harbor import resolve

        request = resolve.prepare(request, trusted=trusted)
        if request.endpoint.wire_api != "chat":  # a native upstream: only an agent we point at the proxy in that dialect
            agent = resolve.options_of(request).agent
            check_wire_api(request, FORMAT_DIALECTS[AGENT_API_FORMATS.get(agent, CHAT_API_FORMAT)])
        return request

    async def run_trial(self, ctx: LaunchContext, stop: asyncio.Event, emit: Callable[[str, str, str], None], result: RolloutResult) -> TrialEnd:
        """The trial runs in a task of its own: if the caller is cancelled, the trial is told to
        stop and still cancels Harbor's work, stops the environment and removes its files, however
        often the caller's cancellation is delivered."""
        own_stop = asyncio.Event()

        async def relay() -> None:
            await stop.wait()
            own_stop.set()

        relay_task = asyncio.ensure_future(relay())
        inner = asyncio.ensure_future(self._run_trial(ctx, own_stop, emit, result))
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:
            own_stop.set()
            raise
        finally:
            relay_task.cancel()

    async def _run_trial(self, ctx: LaunchContext, stop: asyncio.Event, emit: Callable[[str, str, str], None], result: RolloutResult) -> TrialEnd:
        request = ctx.request
        opts = HarborOptions.of(request)
        work = sandboxes_root() / f"{TRIAL_PREFIX}-{uuid.uuid4().hex[:12]}"  # a name the start-up sweep knows (leased_dir_prefixes)
        result.sandbox_backend = f"harbor:{opts.sandbox}"
        end = TrialEnd()
        try:
            await asyncio.to_thread(load_harbor_runtime)
            work.parent.mkdir(parents=True, exist_ok=True)
            write_lease(work)  # before the directory: a killed server's is swept at the next start
            work.mkdir()
            converted = not opts.task_dir
            # Harbor times the whole script; a converted Task's script times each command itself.
            verify_s, setup_s = request.verify_timeout_s, request.setup_timeout_s
            if converted:  # a uniform Task: written as a Harbor task directory
                task_dir = await asyncio.to_thread(
                    task_to_task_dir,
                    request.task,
                    work / "task",
                    agent_timeout_s=request.agent_timeout_s,
                    verify_timeout_s=request.verify_timeout_s,
                    setup_timeout_s=request.setup_timeout_s,
                )
                verify_s = script_budget(request.verify_timeout_s, len(request.task.verify))
                setup_s = script_budget(request.setup_timeout_s, len(request.task.setup))
            else:
                task_dir = Path(opts.task_dir)
            ht = await asyncio.to_thread(load_task_dir, task_dir)
            if not converted and ht.build_timeout_s:  # Harbor gives the environment start the task's own build timeout
                setup_s = ht.build_timeout_s
            config = trial_config(
                opts,
                task_dir=task_dir,
                trials_dir=work / "trials",
                trial_name=f"rollout-{work.name}",
                proxy_base_url=ctx.proxy_base_url,
                session_key=ctx.session_key,
                model=request.endpoint.model,
                agent_timeout_s=request.agent_timeout_s,
                setup_timeout_s=request.setup_timeout_s,
                verify_timeout_s=verify_s,
                task_agent_timeout_s=ht.agent_timeout_s,
            )
            out = await run_harbor_trial(
                config,
                timeout_s=trial_deadline(request.agent_timeout_s, request.setup_timeout_s, verify_s, environment_setup_s=setup_s),
                stop=stop,
                on_event=lambda phase, status: emit(phase, status, ""),
                reward_key=opts.reward_key,
            )
            end = await asyncio.to_thread(self._fill, result, out, request, opts, ht, converted)  # reads the trial's files
        finally:
            # Trial logs and the converted task, read above: any tree a provider's download made,
            # removed without following a link, at any depth, off the loop.
            problem = await asyncio.to_thread(safefs.remove_tree, work)
            if problem:
                result.sandbox_notes.append(f"clean-up of the trial directory: {problem.replace(str(work), work.name)}")
            else:
                lease_path(work).unlink(missing_ok=True)
        return end

    @staticmethod
    def _fill(res: RolloutResult, out: HarborTrialOutcome, request: RolloutRequest, opts: HarborOptions, ht, converted: bool) -> TrialEnd:
        """The trial's phases, commands, files and Harbor's own fields into the result; how its
        agent ended and its reward into the TrialEnd."""
        trajectory, trajectory_note = read_trajectory(out.agent_dir)
        trial = out.result
        agent_ran = trial is not None and trial.agent_execution is not None and trial.agent_execution.finished_at is not None
        failure = classify(out)
        if converted and not request.task.verify and out.exception_type in NO_REWARD_EXCEPTIONS:
            # A Task without verify commands has no reward, by our rule; Harbor calls that an error.
            failure = None
            out.notes.append("the task has no verify commands: no reward")
        if failure is None and out.reward_error:
            # The verifier wrote rewards, but the request's reward_key picks none of them: the
            # request's to fix (not graded as the agent's: the agent does not choose the key).
            failure = ("invalid_request", out.reward_error)
        agent = AgentEnd(exit_code=0 if agent_ran else None)
        if failure is not None and failure[0] == "agent_timeout":
            agent.timed_out, agent.timeout_message, agent.exit_code = True, failure[1], None
        elif failure is not None and failure[0] == "agent_error":
            agent.error, agent.exit_code = failure[1], None
        elif failure is not None:
            agent.failure = failure
        notes = [f"from the verifier's {out.reward_source.replace('_', '.')}"] if out.reward_source else []
        notes += [n for n in out.notes if not n.startswith("the Harbor trial raised")]
        if trajectory_note:
            notes.append(trajectory_note)
        res.phases.extend(_phase_records(trial))
        res.agent_exit_code = agent.exit_code
        res.agent_log_tail = _agent_log_tail(out.agent_dir)
        res.verify_results = _verify_results(out, request.task.verify if converted else None)
        res.files = out.files or {}
        res.sandbox_id = out.sandbox_id or ""
        res.sandbox_notes = [f"Harbor {HarborHarness().version()} trial, environment {opts.sandbox!r}", *res.sandbox_notes]
        agent_info = getattr(trial, "agent_info", None)
        res.run_info = HarborRunInfo(
            task_name=ht.name,
            task_path="" if converted else str(ht.path),
            agent=opts.agent,
            agent_version=getattr(agent_info, "version", None),
            sandbox=opts.sandbox,
            exception=out.exception[:2000] if out.exception else None,
            verifier_rewards=out.rewards,
        )
        res.agent_trajectory = trajectory
        return TrialEnd(
            agent=agent,
            outcome=AgentOutcome(final_text=_final_text(trajectory), tool_calls=count_tool_calls(trajectory)),
            reward=out.reward,
            reward_source="reward_file" if out.reward_source else None,
            reward_notes=notes,
        )
