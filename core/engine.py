"""The rollout lifecycle: endpoint check, capture session, sandbox, setup, agent, verify, collect,
clean-up; each a method of RolloutRun, in that order.

A rollout always returns a RolloutResult: what broke goes into `error` / `error_kind`, and an
infrastructure failure leaves the reward None (never 0). Phases are emitted as events while they
happen. Whatever happens (error, timeout, cancellation) the sandbox is closed and the capture
session forgotten. A harness that owns its environment (Harbor) runs sandbox, setup, agent and
verify itself and fills the same result; how its agent ended is classified by the same function.
The engine is typed against the Sandbox protocol and takes a SandboxFactory: it names no backend.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from harness_env.core.agent_end import classify_agent_end, sandboxed_agent_end
from harness_env.core.capture.graph import link_turns, summarise_rows
from harness_env.core.capture.probe import ProbeResult
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.capture.session import MIB
from harness_env.core.errors import EndpointError, HarnessEnvError
from harness_env.core.harness import LaunchContext, OwnsEnvironment
from harness_env.core.pipeline import PreparedRollout
from harness_env.core.reward import tool_efficiency_reward
from harness_env.core.sandbox.base import Sandbox, SandboxFactory
from harness_env.core.sandbox.policy import sandbox_limits
from harness_env.core.task_commands import run_setup, run_verify
from harness_env.models import AGENT_CAUSED_KINDS, Phase, PhaseEvent, RolloutResult, Turn

EventSink = Callable[[PhaseEvent], None]
logger = logging.getLogger("harness_env.engine")
LOG_TAIL_CHARS = 4000
# A launched agent counts as up at its first model call, or this long after its launch (one that
# thinks long before calling, or never calls, must not hold a start-up place for its whole run).
START_HOLD_S = 10.0
# When the agent's model calls failed as if the endpoint were down, the proxy asks the endpoint
# itself, after these pauses, before calling it the endpoint's failure (reward None): an endpoint
# busy for a moment (the agent's own calls, just aborted, were loading it) answers one of them.
CONFIRM_PAUSES_S = (0.0, 3.0, 6.0)
START_POLL_S = 0.02


class StartGate(Protocol):
    """Bounds how many rollouts start at once (e.g. server/slots.py StartingSlots). `acquire`
    waits for a place in arrival order and returns how many waited ahead; `release` gives it back."""

    async def acquire(self) -> int: ...

    def release(self) -> None: ...


@dataclass(frozen=True)
class CaptureAccess:
    """The capture proxy and how rollouts reach it."""

    proxy: CaptureProxy
    base_url: str  # where the host reaches it, ends in /v1
    socket_path: str | None = None  # its Unix socket: a network-isolated sandbox's only way out


async def execute(
    prepared: PreparedRollout,
    capture: CaptureAccess,
    *,
    sandbox_factory: SandboxFactory,
    on_event: EventSink | None = None,
    start_gate: StartGate | None = None,
) -> RolloutResult:
    """Run one prepared rollout (core/pipeline.py) in sandboxes from `sandbox_factory` (e.g.
    the local one of core/sandbox/factory.py). Always returns a result. `start_gate`: bounds the
    rollouts starting at once (see RolloutRun.wait_to_start)."""
    return await RolloutRun(prepared, capture, sandbox_factory, on_event, start_gate).execute()


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


# Nothing listening is refused at once; a timeout only ends a connect that hangs. 5 s was too
# short under a start-up storm (a loaded machine): 12 of 64 Pi rollouts arriving at once failed.
CONNECT_TIMEOUT_S = 30.0


async def check_endpoint_reachable(base_url: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
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


def _turn_line(turn: Turn) -> str:
    if turn.upstream_error and turn.upstream_status != 200:
        return f"model call {turn.index}: failed ({turn.upstream_status}): {turn.upstream_error[:160]}"
    return (
        f"model call {turn.index} ({turn.purpose}): {len(turn.completion_token_ids) or len(turn.per_token_logps)} tokens, "
        f"{len(turn.tool_calls)} tool calls, {turn.latency_s:.2f}s"
    )


class _TimedPhase:
    """One phase of the rollout: an event when it starts, a Phase record and an event when it ends."""

    def __init__(self, run: RolloutRun, name: str) -> None:
        self.run, self.name, self.detail, self.ok = run, name, "", True

    def __enter__(self) -> _TimedPhase:
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


class RolloutRun:
    """One rollout while it runs: its request, harness, capture session, sandbox and result."""

    def __init__(self, prepared: PreparedRollout, capture: CaptureAccess, factory: SandboxFactory, on_event: EventSink | None,
                 start_gate: StartGate | None = None) -> None:
        self.request, self.harness, self.grader = prepared.request, prepared.harness, prepared.grader
        self.capture = capture
        self.factory = factory
        self.on_event = on_event
        self.rollout_id = uuid.uuid4().hex[:12]
        self.t0 = time.monotonic()
        self.result = RolloutResult(rollout_id=self.rollout_id, task_id=self.request.task.task_id, mode=self.request.mode,
                                    harness=self.harness.name)
        self.probe: ProbeResult | None = None
        self.infra_failed = False  # set by fail(): the reward stays None
        self.session = None
        self.sandbox: Sandbox | None = None
        self.start_gate = start_gate
        self._holds_start = False
        self._start_watch: asyncio.Task | None = None

    # -- events and failures ----------------------------------------------------------------
    def emit(self, phase: str, status: str, detail: str = "") -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(PhaseEvent(rollout_id=self.rollout_id, phase=phase, status=status, elapsed_s=round(time.monotonic() - self.t0, 3), detail=detail))
        except Exception:
            pass  # a broken listener must not break the rollout

    def phase(self, name: str) -> _TimedPhase:
        return _TimedPhase(self, name)

    def fail(self, kind: str, message: str) -> None:
        """An end the agent cannot cause (endpoint, sandbox, server): no reward."""
        self.infra_failed = True
        self.result.reward = None
        self.note_end(kind, message)

    def note_end(self, kind: str, message: str) -> None:
        """Say what broke (the first thing only); the reward is untouched."""
        if self.result.error is None:
            self.result.error_kind = kind  # type: ignore[assignment]
            self.result.error = message

    def end_of_agent(self, kind: str, message: str) -> None:
        """How the agent's run ended, when not normally. Once the policy has acted (one of its
        model calls answered), the end is graded like any other (AGENT_CAUSED_KINDS): a policy
        must not escape a failing grade by killing its harness or sleeping past the timeout.
        Before that (auxiliary calls such as titles aside), nothing of the policy's exists yet:
        the harness, the sandbox or the endpoint failed."""
        if kind in AGENT_CAUSED_KINDS and self.policy_has_acted():
            self.note_end(kind, message)
        else:
            self.fail(kind, message)

    async def confirm_endpoint_failure(self, failure: tuple[str, str] | None) -> tuple[str, str] | None:
        """An `endpoint` end stands only when the endpoint fails the proxy's own call too. The
        agent shapes its calls (a body a front proxy resets, a grammar that crashes the engine,
        a generation that outlasts the read timeout): if the endpoint answers the proxy's own
        one-token call now, what those calls carried caused the failures, and the end is the
        agent's (graded). The proxy stops an agent at its third failure in a row, so an endpoint
        that is really down is still down when it is asked."""
        if failure is None or failure[0] != "endpoint" or self.session is None or not self.policy_has_acted():
            return failure
        # The agent's own calls must not load the endpoint while it is asked (calls it started
        # from the sandbox with the capture key, to overload a shared endpoint and opt out).
        self.session.quiesce()
        for pause in CONFIRM_PAUSES_S:
            await asyncio.sleep(pause)
            if await self.capture.proxy.endpoint_answers(self.request.endpoint):
                return "agent_error", f"the endpoint answers the proxy's own call, so the agent's calls caused their failures: {failure[1]}"
        return failure

    def policy_has_acted(self) -> bool:
        if not self.request.agent_calls_model:
            return True  # the agent is a script of the request's: whatever it does is graded
        return self.session is not None and any(t.purpose == "policy" and t.upstream_status == 200 for t in self.session.turns)

    # -- the lifecycle ------------------------------------------------------------------------
    async def execute(self) -> RolloutResult:
        try:
            await self.check_endpoint()
            self.open_capture()
            await self.wait_to_start()
            if isinstance(self.harness, OwnsEnvironment):
                await self.run_trial()
            else:
                await self.make_sandbox()
                if await self.setup() and await self.run_agent():
                    await self.verify()
        except HarnessEnvError as e:
            self.fail(e.kind, str(e))
        except asyncio.CancelledError:
            self.fail("internal", "the rollout was cancelled")
            raise
        except Exception as e:  # the outermost boundary: everything becomes data
            # The traceback goes to the server's log, not to the caller (it names server paths).
            logger.exception("rollout %s failed inside the engine", self.rollout_id)
            self.fail("internal", f"internal error ({type(e).__name__}: {str(e)[:500]}); the server's log has the details")
        finally:
            # Clean-up runs in a task of its own: a caller's cancellation may be level-triggered
            # (anyio, as in the MCP SDK: every later await in this task raises again), and the
            # sandbox must be closed all the same.
            self.release_start()
            await asyncio.shield(asyncio.ensure_future(self.collect_and_close()))
        return self.result

    # -- bounded start-up ---------------------------------------------------------------------
    async def wait_to_start(self) -> None:
        """Take a start-up place (the phase `start_wait` shows how long that took). It is held
        through sandbox creation, setup and the harness's launch, until the agent is up: its
        first model call arrives at the proxy, START_HOLD_S after the launch, or the agent ends,
        whichever comes first. That is the CPU-heavy stretch (Node start-up, bwrap, installs);
        once the agent is calling the model it mostly waits."""
        if self.start_gate is None:
            return
        with self.phase("start_wait") as ph:
            ahead = await self.start_gate.acquire()
            self._holds_start = True
            ph.detail = f"{ahead} rollouts were waiting to start ahead of this one" if ahead else "started at once"

    def agent_launched(self) -> None:
        """The harness is being launched: give the start-up place back once the agent is up."""
        if self._holds_start and self._start_watch is None:
            self._start_watch = asyncio.ensure_future(self._release_when_up())

    async def _release_when_up(self) -> None:
        deadline = time.monotonic() + START_HOLD_S
        while (self.session is None or self.session.calls_started == 0) and time.monotonic() < deadline:
            await asyncio.sleep(START_POLL_S)
        self.release_start()

    def release_start(self) -> None:
        """Give the start-up place back (once; idempotent)."""
        if self._start_watch is not None and self._start_watch is not asyncio.current_task():
            self._start_watch.cancel()
        if self._holds_start:
            self._holds_start = False
            assert self.start_gate is not None
            self.start_gate.release()

    async def check_endpoint(self) -> None:
        request = self.request
        with self.phase("endpoint") as ph:
            self.harness.check_installed()
            if isinstance(self.harness, OwnsEnvironment):  # e.g. a sandbox provider's credentials
                await asyncio.to_thread(self.harness.preflight, request, self.capture.base_url)  # may run `docker info`
            if not request.agent_calls_model:
                ph.detail = "the agent calls no model"
                return
            await check_endpoint_reachable(request.endpoint.base_url)
            ph.detail = request.endpoint.base_url
            if request.mode == "transparent_proxy":
                self.probe = await self.capture.proxy.probe(request.endpoint)
                ph.detail += f": {self.probe.detail}"
                if self.probe.failed_status == 404:  # no chat route there, or no such model: the agent would only fail
                    raise EndpointError(
                        f"the policy endpoint answered 404 to a chat completion at {request.endpoint.base_url}: check base_url "
                        f"(usually ending in /v1) and that it serves model {request.endpoint.model!r}"
                    )

    def open_capture(self) -> None:
        request = self.request
        policy = CapturePolicy(
            capture=request.mode == "transparent_proxy",
            top_logprobs=request.top_logprobs,
            max_tokens_cap=request.max_tokens_cap,
            disable_thinking=request.disable_thinking,
            max_turns=request.max_turns,
            temperature=request.temperature,
            max_auxiliary_calls=request.max_auxiliary_calls,
            max_recorded_bytes=request.max_recorded_mb * MIB,
            plain_sampling=request.plain_sampling,
            structured_regex=request.structured_regex,
            structured_calls=request.structured_calls,
        )
        self.session = self.capture.proxy.open_session(request.endpoint, policy, on_turn=lambda t: self.emit("agent", "info", _turn_line(t)))

    async def make_sandbox(self) -> None:
        request, res = self.request, self.result
        with self.phase("sandbox") as ph:
            limits = sandbox_limits(request)
            socket = self.capture.socket_path if request.network == "proxy_only" else None
            self.sandbox = sandbox = await asyncio.to_thread(
                self.factory, readonly_paths=self.harness.readonly_paths(), limits=limits, capture_socket=socket
            )
            res.sandbox_id, res.sandbox_backend, res.sandbox_notes = sandbox.sandbox_id, sandbox.backend, list(sandbox.notes)
            if request.network == "proxy_only" and not sandbox.network_isolated:
                res.sandbox_notes.append("network 'proxy_only' was asked for but needs bubblewrap, socat and the proxy's socket; the network is open")
            for path, content in request.task.files.items():
                sandbox.write_file(path, content)
            ph.detail = f"{sandbox.backend} {sandbox.sandbox_id}"

    async def setup(self) -> bool:
        assert self.sandbox is not None
        with self.phase("setup") as ph:
            failure = await run_setup(self.sandbox, self.request.task.setup, self.request.setup_timeout_s, self.result.setup_results)
            if failure:
                self.fail("setup", failure)
                ph.ok = False
        return failure is None

    def launch_context(self, workspace: str = "", home: str = "") -> LaunchContext:
        host_url = self.capture.base_url
        sandbox_url = self.sandbox.capture_base_url(host_url) if self.sandbox is not None else host_url
        return LaunchContext(request=self.request, workspace=workspace, home=home, proxy_base_url=sandbox_url,
                             session_key=self.session.key, host_proxy_base_url=host_url)

    async def run_agent(self) -> bool:
        sandbox, session, res = self.sandbox, self.session, self.result
        assert sandbox is not None and session is not None
        with self.phase("agent") as ph:
            ctx = self.launch_context(sandbox.workspace, sandbox.home)
            self.agent_launched()
            # Stopped when model calls keep failing: no point waiting.
            try:
                r, outcome = await self.harness.run_agent(ctx, sandbox, session.endpoint_down)
            except EndpointError:
                raise
            except Exception as e:
                # Reading back what the agent left (its harness's logs and session files) is
                # reading hostile data: once the policy has acted, a failure here is graded.
                if not self.policy_has_acted():
                    raise
                logger.exception("rollout %s: the harness's run could not be read back", self.rollout_id)
                self.note_end("agent_error", f"the {self.harness.name} run could not be read back ({type(e).__name__}: {str(e)[:300]})")
                ph.ok, ph.detail = False, res.error or ""
                return True
            finally:
                self.release_start()  # ended before it was up (no model call): its place is free now
            res.agent_exit_code = r.exit_code
            res.agent_tool_calls = outcome.tool_calls
            res.agent_final_text = outcome.final_text
            res.agent_log_tail = _tail(r.stdout + ("\n[stderr]\n" + r.stderr if r.stderr.strip() else ""))
            res.turn_limit_hit = session.turn_limit_hit or outcome.turn_limit_hit
            ph.detail = f"exit {r.exit_code}, {outcome.tool_calls} tool calls, {len(session.turns)} model calls"
            failure = classify_agent_end(sandboxed_agent_end(self.harness.name, r, outcome), session, self.request.agent_timeout_s)
            failure = await self.confirm_endpoint_failure(failure)
            if failure:
                self.end_of_agent(*failure)
            ph.ok = res.error is None
        return not self.infra_failed

    async def verify(self) -> None:
        sandbox, res = self.sandbox, self.result
        assert sandbox is not None
        with self.phase("verify") as ph:
            try:
                reward, source, notes = await self.grade(sandbox)
            except Exception as e:
                # Verify could not run on what the agent left (its disk full, a tree that cannot
                # be reset, a workspace it removed, ...): the agent can bring that about, so it
                # scores 0. (Everything verify touches went through the agent's hands.)
                if not isinstance(e, HarnessEnvError):
                    logger.exception("rollout %s: verify failed on what the agent left", self.rollout_id)
                self.note_end("verify", f"verify could not run on what the agent left: {e}")
                reward, source, notes = 0.0, "verify_failed", [str(e)[:300]]
                ph.ok, ph.detail = False, str(e)[:300]
            if self.infra_failed:
                ph.ok = False
            else:
                self.set_reward(reward, source, notes)
                ph.detail = ph.detail or f"reward {res.reward}"

    async def grade(self, sandbox: Sandbox) -> tuple[float | None, str | None, list[str]]:
        """(reward, source, notes) from the task family's grader, or from the verify commands."""
        request, res = self.request, self.result
        if self.grader is None:
            return await run_verify(sandbox, request.task.verify, request.verify_timeout_s, res.verify_results)
        await asyncio.to_thread(sandbox.clear_reward_file)  # nothing the agent started runs on
        graded = await self.grader.grade(sandbox, request)
        res.grading = graded.evidence
        if graded.error and graded.agent_caused:
            self.note_end("judge", graded.error)  # e.g. a picture that talks the judge out of scoring: graded
        elif graded.error:
            self.fail("judge", graded.error)  # the judge itself failed (unreachable, say): no reward
        return graded.reward, graded.source, graded.notes

    async def run_trial(self) -> None:
        """The harness runs sandbox, setup, agent and verify itself, filling the result."""
        session, res = self.session, self.result
        assert session is not None and isinstance(self.harness, OwnsEnvironment)
        # Stop the trial when model calls keep failing, but not for the turn limit: then the agent
        # ends on its own and the workspace is graded as it stands, as for the other harnesses.
        stop = asyncio.Event()

        async def relay() -> None:
            await session.endpoint_down.wait()
            if not session.limit_reached:
                stop.set()

        relay_task = asyncio.ensure_future(relay())
        self.agent_launched()  # the trial makes its sandbox and starts its agent itself
        try:
            end = await self.harness.run_trial(self.launch_context(), stop, self.emit, res)
        finally:
            relay_task.cancel()
            self.release_start()
        end.agent.stopped = end.agent.stopped or stop.is_set()
        res.agent_log_tail = _tail(res.agent_log_tail)
        res.agent_tool_calls, res.agent_final_text = end.outcome.tool_calls, end.outcome.final_text
        res.turn_limit_hit = session.turn_limit_hit or end.agent.turn_limit_hit
        failure = await self.confirm_endpoint_failure(classify_agent_end(end.agent, session, self.request.agent_timeout_s))
        if failure:
            self.end_of_agent(*failure)
            res.reward_notes = list(end.reward_notes)
        if self.infra_failed:
            return
        if failure and end.reward is None:  # an end the agent brought about, before a reward was written
            self.set_reward(0.0, "verify_failed", [*end.reward_notes, f"no reward after {failure[0]}: 0"])
        else:
            self.set_reward(end.reward, end.reward_source, list(end.reward_notes))

    def set_reward(self, reward: float | None, source: str | None, notes: list[str]) -> None:
        res, request = self.result, self.request
        if reward is not None and request.reward_mode == "tool_efficiency":
            reward, note = tool_efficiency_reward(reward, res.agent_tool_calls)
            notes.append(note or f"tool-efficiency reward over {res.agent_tool_calls} verified tool calls")
        res.reward, res.reward_source, res.reward_notes = reward, source, notes  # type: ignore[assignment]

    async def collect_and_close(self) -> None:
        res, sandbox, session = self.result, self.sandbox, self.session
        with self.phase("collect"):
            if sandbox is not None:
                try:
                    res.files = await asyncio.to_thread(sandbox.collect_files)
                except Exception as e:  # collecting is best effort; clean-up must still run
                    res.sandbox_notes.append(f"collecting files failed: {e}")
            if session is not None:
                await self.capture.proxy.close_session(session)
                # Making the wire lists from packed turns and linking them walks every token id
                # (thousands per turn): off the event loop.
                res.proxy_turns = await asyncio.to_thread(session.sorted_turns)
                res.graph = await asyncio.to_thread(lambda: summarise_rows(link_turns(res.proxy_turns), res.training_rows()))
                res.proxy_log_tail = _tail(session.log_tail())
                res.capture_level = session.capture_level()
                res.rollout_type, res.rollout_type_reason = rollout_type(self.probe, res)
                res.dropped_fields = sorted(session.dropped_fields)
                res.limits_hit = list(session.limits_hit)
            if sandbox is not None:
                res.limits_hit += await asyncio.to_thread(sandbox.limits_hit)
                # What the sandbox noted since it was made (at verify: the git configs it reduced).
                res.sandbox_notes += [n for n in sandbox.notes if n not in res.sandbox_notes]
                problem = await sandbox.close()
                if problem:
                    res.sandbox_notes.append(f"clean-up: {problem}")
        res.wall_s = round(time.monotonic() - self.t0, 4)
        self.emit("done", "finished" if res.error is None else "failed", res.error or f"reward {res.reward}")
