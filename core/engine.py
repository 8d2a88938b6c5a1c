"""The rollout lifecycle: endpoint check, sandbox, setup, agent, verify, collect, clean-up.

A rollout always returns a RolloutResult: what broke goes into `error` / `error_kind`, and an
infrastructure failure leaves the reward None (never 0). Phases are emitted as events while they
happen. Whatever happens (error, timeout, cancellation) the sandbox is closed and the capture
session forgotten.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from urllib.parse import urlsplit

from harness_env.core.capture.graph import link_turns, summarise_rows
from harness_env.core.capture.probe import ProbeResult
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.errors import EndpointError, HarnessEnvError
from harness_env.core.grading import Grader
from harness_env.core.harness import EnvironmentOwner, Harness, LaunchContext
from harness_env.core.reward import compute_reward, tool_efficiency_reward
from harness_env.core.sandbox.local import LocalSandbox, create_local_sandbox
from harness_env.core.sandbox.policy import sandbox_limits
from harness_env.models import CommandResult, Phase, PhaseEvent, RolloutRequest, RolloutResult, Turn

EventSink = Callable[[PhaseEvent], None]
logger = logging.getLogger("harness_env.engine")
LOG_TAIL_CHARS = 4000
COMMAND_OUTPUT_CHARS = 8000


def rollout_type(probe: ProbeResult | None, res: RolloutResult) -> tuple[str, str]:
    """`train` only with token ids and processed logprobs from the endpoint and on every turn."""
    if res.mode == "black_box":
        return "eval", "black_box mode asks the endpoint for no token data"
    if probe is None:
        return "eval", "the endpoint was not probed (the rollout failed before)"
    if not probe.trainable:
        return "eval", probe.detail
    if res.capture_level != "tokens":
        return "eval", f"some model calls were captured only at level {res.capture_level!r}"
    return "train", probe.detail


def _tail(text: str, n: int = LOG_TAIL_CHARS) -> str:
    return text[-n:]


async def check_endpoint_reachable(base_url: str, timeout: float = 5.0) -> None:
    """Fail fast (before any harness starts) when nothing listens at the endpoint."""
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError) as e:
        raise EndpointError(f"policy endpoint {base_url} is unreachable ({type(e).__name__}: {e}); check base_url and that the server is up") from e
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass


class _Run:
    """State of one rollout while it runs."""

    def __init__(self, request: RolloutRequest, harness: Harness, on_event: EventSink | None) -> None:
        self.request = request
        self.harness = harness
        self.on_event = on_event
        self.rollout_id = uuid.uuid4().hex[:12]
        self.t0 = time.monotonic()
        self.result = RolloutResult(task_id=request.task.task_id, mode=request.mode, harness=harness.name)
        self.probe: ProbeResult | None = None

    def emit(self, phase: str, status: str, detail: str = "") -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(PhaseEvent(rollout_id=self.rollout_id, phase=phase, status=status, elapsed_s=round(time.monotonic() - self.t0, 3), detail=detail))
        except Exception:
            pass  # a broken listener must not break the rollout

    def phase(self, name: str) -> _PhaseTimer:
        return _PhaseTimer(self, name)

    def fail(self, kind: str, message: str) -> None:
        if self.result.error is None:
            self.result.error_kind = kind  # type: ignore[assignment]
            self.result.error = message
            self.result.reward = None


class _PhaseTimer:
    def __init__(self, run: _Run, name: str) -> None:
        self.run, self.name, self.detail, self.ok = run, name, "", True

    def __enter__(self) -> _PhaseTimer:
        self.started_wall = time.time()
        self.started = time.monotonic()
        self.run.emit(self.name, "started")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        ok = self.ok and exc_type is None
        if exc is not None and not self.detail:
            self.detail = str(exc)[:300]
        self.run.result.phases.append(
            Phase(name=self.name, started=self.started_wall, duration_s=round(time.monotonic() - self.started, 4), ok=ok, detail=self.detail)
        )
        self.run.emit(self.name, "finished" if ok else "failed", self.detail)


def _command_result(cmd: str, res) -> CommandResult:
    return CommandResult(
        cmd=cmd,
        exit_code=res.exit_code,
        stdout=_tail(res.stdout, COMMAND_OUTPUT_CHARS),
        stderr=_tail(res.stderr, COMMAND_OUTPUT_CHARS),
        duration_s=round(res.duration_s, 4),
        timed_out=res.timed_out,
    )


async def run_setup(sandbox: LocalSandbox, commands: list[str], timeout: float, results: list[CommandResult]) -> str | None:
    """Run the task's setup commands in order, appending to `results`; the first failure stops
    them and is returned in words."""
    for cmd in commands:
        # The task author's commands, before the agent: they keep the host's network (installs).
        r = await sandbox.exec(cmd, timeout=timeout, open_network=True)
        results.append(_command_result(cmd, r))
        if r.exit_code != 0:
            why = f"timed out after {timeout}s" if r.timed_out else f"exited {r.exit_code}"
            return f"setup command {cmd!r} {why}: {_tail(r.stderr or r.stdout, 500)}"
    return None


async def run_verify(
    sandbox: LocalSandbox, commands: list[str], timeout: float, results: list[CommandResult]
) -> tuple[float | None, str | None, list[str]]:
    """Run the verify commands (appending to `results`) and compute (reward, source, notes). Every
    process the agent left is killed and the verifier directory made anew first, so the agent
    cannot forge the reward."""
    await asyncio.to_thread(sandbox.clear_reward_file)
    for cmd in commands:
        r = await sandbox.exec(cmd, timeout=timeout, env=sandbox.verify_env())
        results.append(_command_result(cmd, r))
    return compute_reward(results, await asyncio.to_thread(sandbox.read_reward_file))


def _turn_line(turn: Turn) -> str:
    if turn.upstream_error and turn.upstream_status != 200:
        return f"model call {turn.index}: failed ({turn.upstream_status}): {turn.upstream_error[:160]}"
    return (
        f"model call {turn.index} ({turn.purpose}): {len(turn.completion_token_ids) or len(turn.per_token_logps)} tokens, "
        f"{len(turn.tool_calls)} tool calls, {turn.latency_s:.2f}s"
    )


async def run_rollout_with(
    request: RolloutRequest,
    harness: Harness,
    *,
    proxy: CaptureProxy,
    proxy_base_url: str,
    on_event: EventSink | None = None,
    use_bwrap: bool | None = None,
    grader: Grader | None = None,
    capture_socket: str | None = None,
) -> RolloutResult:
    """Run one rollout. `proxy_base_url` is where the host reaches `proxy` (ends in /v1);
    `capture_socket`, where `proxy` also listens on a Unix socket (serving nothing else): with
    network "proxy_only" it is a sandbox's only way out. `grader`: the task family's, which
    replaces the verify commands."""
    run = _Run(request, harness, on_event)
    res = run.result
    sandbox: LocalSandbox | None = None
    session = None
    try:
        with run.phase("endpoint") as ph:
            harness.check_installed()
            if isinstance(harness, EnvironmentOwner):  # e.g. a sandbox provider's credentials
                await asyncio.to_thread(harness.preflight, request, proxy_base_url)  # may run `docker info`
            await check_endpoint_reachable(request.endpoint.base_url)
            ph.detail = request.endpoint.base_url
            if request.mode == "transparent_proxy":
                probe = await proxy.probe(request.endpoint)
                ph.detail += f": {probe.detail}"
            else:
                probe = None
        run.probe = probe
        policy = CapturePolicy(
            capture=request.mode == "transparent_proxy",
            top_logprobs=request.top_logprobs,
            max_tokens_cap=request.max_tokens_cap,
            disable_thinking=request.disable_thinking,
            max_turns=request.max_turns,
            temperature=request.temperature,
        )
        session = proxy.open_session(request.endpoint, policy, on_turn=lambda t: run.emit("agent", "info", _turn_line(t)))

        if isinstance(harness, EnvironmentOwner):
            await _run_owned(run, harness, session, proxy_base_url)
            return res

        with run.phase("sandbox") as ph:
            limits = sandbox_limits(request)
            socket = capture_socket if request.network == "proxy_only" else None
            sandbox = await asyncio.to_thread(
                create_local_sandbox, use_bwrap=use_bwrap, ro_paths=harness.readonly_paths(), limits=limits, capture_socket=socket
            )
            res.sandbox_id, res.sandbox_backend, res.sandbox_notes = sandbox.sandbox_id, sandbox.backend, list(sandbox.notes)
            if request.network == "proxy_only" and not sandbox.network_isolated:
                res.sandbox_notes.append("network 'proxy_only' was asked for but needs bubblewrap, socat and the proxy's socket; the network is open")
            for path, content in request.task.files.items():
                sandbox.write_file(path, content)
            ph.detail = f"{sandbox.backend} {sandbox.sandbox_id}"

        with run.phase("setup") as ph:
            failure = await run_setup(sandbox, request.task.setup, request.setup_timeout_s, res.setup_results)
            if failure:
                run.fail("setup", failure)
                ph.ok = False
                return res

        with run.phase("agent") as ph:
            ctx = LaunchContext(
                request=request,
                workspace=sandbox.workspace,
                home=sandbox.home,
                proxy_base_url=sandbox.capture_base_url(proxy_base_url),
                session_key=session.key,
                host_proxy_base_url=proxy_base_url,
            )
            # Stopped when model calls keep failing: no point waiting.
            r, outcome = await harness.run_agent(ctx, sandbox, session.endpoint_down)
            res.agent_exit_code = r.exit_code
            res.agent_tool_calls = outcome.tool_calls
            res.agent_final_text = outcome.final_text
            res.agent_log_tail = _tail(r.stdout + ("\n[stderr]\n" + r.stderr if r.stderr.strip() else ""))
            res.turn_limit_hit = session.turn_limit_hit or outcome.turn_limit_hit
            ph.detail = f"exit {r.exit_code}, {outcome.tool_calls} tool calls, {len(session.turns)} model calls"
            if r.timed_out:
                run.fail("agent_timeout", f"the agent did not finish within agent_timeout_s={request.agent_timeout_s}; its processes were killed")
            elif res.turn_limit_hit:
                pass  # the policy used up its turns: a normal end, graded as the workspace stands
            elif r.stopped:
                run.fail(*_stopped_failure(session))
            elif session.upstream_failed and (outcome.error or r.exit_code != 0):
                run.fail("endpoint", f"the policy endpoint failed during the agent run: {outcome.error or _tail(r.stderr, 300)}")
            elif r.exit_code != 0:
                run.fail("agent_error", f"{harness.name} exited {r.exit_code}: {_tail(r.stderr or r.stdout, 500)}")
            elif outcome.error:
                run.fail("agent_error", f"{harness.name} reported a failed model call: {outcome.error}")
            ph.ok = res.error is None

        if res.error is None:
            with run.phase("verify") as ph:
                if grader is not None:  # a task family grades the submission itself
                    await asyncio.to_thread(sandbox.clear_reward_file)  # nothing the agent started runs on
                    graded = await grader.grade(sandbox, request)
                    res.grading = graded.evidence
                    reward, source, notes = graded.reward, graded.source, graded.notes
                    if graded.error:
                        run.fail("judge", graded.error)
                        ph.ok, ph.detail = False, graded.error[:300]
                else:
                    reward, source, notes = await run_verify(sandbox, request.task.verify, request.verify_timeout_s, res.verify_results)
                if res.error is None:
                    _set_reward(run, reward, source, notes)
                    ph.detail = f"reward {res.reward}"
    except HarnessEnvError as e:
        run.fail(e.kind, str(e))
    except asyncio.CancelledError:
        run.fail("internal", "the rollout was cancelled")
        raise
    except Exception as e:  # the outermost boundary: everything becomes data
        # The traceback goes to the server's log, not to the caller (it names server paths).
        logger.exception("rollout %s failed inside the engine", run.rollout_id)
        run.fail("internal", f"internal error ({type(e).__name__}: {str(e)[:500]}); the server's log has the details")
    finally:
        # Clean-up runs in a task of its own: a caller's cancellation may be level-triggered
        # (anyio, as in the MCP SDK: every later await in this task raises again), and the
        # sandbox must be closed all the same.
        await asyncio.shield(asyncio.ensure_future(_collect_and_close(run, proxy, session, sandbox)))
    return res


def _last_upstream_error(session) -> str:
    return next((t.upstream_error for t in reversed(session.turns) if t.upstream_error), "") or ""


def _stopped_failure(session) -> tuple[str, str]:
    """Why the agent was stopped early by the capture session (its model calls kept failing)."""
    last_error = _last_upstream_error(session)[:300]
    if session.last_failure_infra:
        return "endpoint", f"the policy endpoint failed {session.consecutive_failures} times in a row; the agent was stopped: {last_error}"
    return "agent_error", f"the endpoint rejected the agent's model call {session.consecutive_failures} times in a row; the agent was stopped: {last_error}"


def _set_reward(run: _Run, reward: float | None, source: str | None, notes: list[str]) -> None:
    res, request = run.result, run.request
    if reward is not None and request.reward_mode == "tool_efficiency":
        reward, note = tool_efficiency_reward(reward, res.agent_tool_calls)
        notes.append(note or f"tool-efficiency reward over {res.agent_tool_calls} verified tool calls")
    res.reward, res.reward_source, res.reward_notes = reward, source, notes  # type: ignore[assignment]


async def _run_owned(run: _Run, harness: EnvironmentOwner, session, proxy_base_url: str) -> None:
    """A harness that owns its environment (Harbor) runs sandbox, setup, agent and verify itself;
    the engine keeps the capture session and classifies failures the same way as for the rest."""
    res, request = run.result, run.request
    ctx = LaunchContext(request=request, workspace="", home="", proxy_base_url=proxy_base_url, session_key=session.key)
    # Stop the trial when model calls keep failing, but not for the turn limit: then the agent
    # ends on its own and the workspace is graded as it stands, as for the other harnesses.
    stop = asyncio.Event()

    async def relay() -> None:
        await session.endpoint_down.wait()
        if not session.turn_limit_hit:
            stop.set()

    relay_task = asyncio.ensure_future(relay())
    try:
        report = await harness.run_trial(ctx, stop, run.emit)
    finally:
        relay_task.cancel()
    res.phases.extend(Phase(name=p.name, started=p.started, duration_s=p.duration_s, ok=p.ok, detail=p.detail) for p in report.phases)
    res.sandbox_id, res.sandbox_backend, res.sandbox_notes = report.sandbox_id, report.sandbox_backend, report.sandbox_notes
    res.setup_results, res.verify_results, res.files = report.setup_results, report.verify_results, report.files
    res.agent_exit_code, res.agent_log_tail = report.agent_exit_code, _tail(report.agent_log_tail)
    res.agent_tool_calls, res.agent_final_text = report.agent.tool_calls, report.agent.final_text
    res.turn_limit_hit = session.turn_limit_hit or report.agent.turn_limit_hit
    for name, value in report.result_fields.items():
        setattr(res, name, value)
    if stop.is_set():
        run.fail(*_stopped_failure(session))
    elif res.turn_limit_hit and report.failure is not None and report.failure[0] == "agent_error":
        pass  # the policy used up its turns and the agent said so: a normal end
    elif report.failure is not None:
        kind, message = report.failure
        if kind == "agent_error" and session.upstream_failed:
            kind, message = "endpoint", f"the policy endpoint failed during the agent run: {_last_upstream_error(session)[:300] or message}"
        run.fail(kind, message)
    if res.error is None:
        _set_reward(run, report.reward, report.reward_source, list(report.reward_notes))
    else:
        res.reward_notes = list(report.reward_notes)


async def _collect_and_close(run: _Run, proxy: CaptureProxy, session, sandbox: LocalSandbox | None) -> None:
    res = run.result
    with run.phase("collect"):
        if sandbox is not None:
            try:
                res.files = await asyncio.to_thread(sandbox.collect_files)
            except Exception as e:  # collecting is best effort; clean-up must still run
                res.sandbox_notes.append(f"collecting files failed: {e}")
        if session is not None:
            await proxy.close_session(session)
            res.proxy_turns = session.sorted_turns()
            res.graph = summarise_rows(link_turns(res.proxy_turns), res.training_rows())
            res.proxy_log_tail = _tail(session.log_tail())
            res.capture_level = session.capture_level()
            res.rollout_type, res.rollout_type_reason = rollout_type(run.probe, res)
            res.dropped_fields = sorted(session.dropped_fields)
        if sandbox is not None:
            res.limits_hit = await asyncio.to_thread(sandbox.limits_hit)
            problem = await sandbox.close()
            if problem:
                res.sandbox_notes.append(f"clean-up: {problem}")
    res.wall_s = round(time.monotonic() - run.t0, 4)
    run.emit("done", "finished" if res.error is None else "failed", res.error or f"reward {res.reward}")
