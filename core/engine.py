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
import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness_env.core.agent_end import classify_agent_end, sandboxed_agent_end
from harness_env.core.capture.probe import ProbeResult
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.rewrite import CapturePolicy
from harness_env.core.capture.session import MIB
from harness_env.core.collect import close_sandbox, collect_capture, collect_files, tail
from harness_env.core.endpoint_check import answers_after_pauses, check_endpoint_reachable, refuse_not_found
from harness_env.core.errors import EndpointError, HarnessEnvError, SandboxError
from harness_env.core.harness import LaunchContext, OwnsEnvironment
from harness_env.core.phases import EventSink, TimedPhase, send_event, turn_line
from harness_env.core.pipeline import PreparedRollout
from harness_env.core.reward import tool_efficiency_reward
from harness_env.core.sandbox.base import Sandbox, SandboxFactory
from harness_env.core.sandbox.policy import sandbox_limits
from harness_env.core.sandbox.setupgroups import GROUPS, Outcome, SharesSetup, group_key
from harness_env.core.sandbox.threads import in_thread
from harness_env.core.start_gate import StartGate, StartPlace
from harness_env.core.task_commands import run_setup, run_verify
from harness_env.models import AGENT_CAUSED_KINDS, CommandResult, RolloutResult

logger = logging.getLogger("harness_env.engine")


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
    rollouts starting at once (see RolloutRun.wait_to_start). A caller that must keep the result
    of a rollout it cancels (the job manager) holds a RolloutRun and awaits its execute()."""
    return await RolloutRun(prepared, capture, sandbox_factory, on_event, start_gate).execute()


class RolloutRun:
    """One rollout while it runs: its request, harness, capture session, sandbox and result."""

    def __init__(
        self,
        prepared: PreparedRollout,
        capture: CaptureAccess,
        factory: SandboxFactory,
        on_event: EventSink | None,
        start_gate: StartGate | None = None,
        rollout_id: str | None = None,
    ) -> None:
        self.request, self.harness, self.grader = prepared.request, prepared.harness, prepared.grader
        self.capture = capture
        self.factory = factory
        self.on_event = on_event
        self.rollout_id = rollout_id or uuid.uuid4().hex[:12]  # a job's own id: one id for the job and its result
        self.t0 = time.monotonic()
        self.result = RolloutResult(rollout_id=self.rollout_id, task_id=self.request.task.task_id, mode=self.request.mode, harness=self.harness.name)
        self.probe: ProbeResult | None = None
        self.infra_failed = False  # set by fail(): the reward stays None
        self.session = None
        self.sandbox: Sandbox | None = None
        self.limits: Any = None  # the sandbox's (prepare_sandbox)
        # What the factory's prepare holds (a pulled image) that no sandbox has taken yet: let go at the end.
        self.held: Callable[[], Any] | None = None
        self.start_place = StartPlace(start_gate, lambda: self.session is not None and self.session.calls_started != 0)

    # -- events and failures ----------------------------------------------------------------
    def emit(self, phase: str, status: str, detail: str = "") -> None:
        send_event(self.on_event, self.rollout_id, self.t0, phase, status, detail)

    def phase(self, name: str) -> TimedPhase:
        return TimedPhase(self.emit, self.result.phases, name)

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
        if await answers_after_pauses(self.capture.proxy, self.request.endpoint):
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
            owns = isinstance(self.harness, OwnsEnvironment)
            if not owns:
                await self.prepare_sandbox()  # before a start place: an image's pull holds none
            await self.wait_to_start()
            if owns:
                await self.run_trial()
            elif await self.sandbox_and_setup() and await self.run_agent():
                await self.verify()
        except HarnessEnvError as e:
            self.fail(e.kind, str(e))
        except asyncio.CancelledError:
            self.fail("cancelled", "the rollout was cancelled")
            raise
        except Exception as e:  # the outermost boundary: everything becomes data
            # The traceback goes to the server's log, not to the caller (it names server paths).
            logger.exception("rollout %s failed inside the engine", self.rollout_id)
            self.fail("internal", f"internal error ({type(e).__name__}: {str(e)[:500]}); the server's log has the details")
        finally:
            # Clean-up runs in a task of its own: a caller's cancellation may be level-triggered
            # (anyio, as in the MCP SDK: every later await in this task raises again), and the
            # sandbox must be closed all the same.
            self.start_place.release()
            held, self.held = self.held, None
            if held is not None:  # ended before its sandbox was made from what prepare gave
                held()
            await asyncio.shield(asyncio.ensure_future(self.collect_and_close()))
        return self.result

    # -- bounded start-up (core/start_gate.py) ---------------------------------------------
    async def wait_to_start(self) -> None:
        """Take a start-up place (the phase `start_wait` shows how long that took). It is held
        through sandbox creation, setup and the harness's launch, until the agent is up: its
        first model call arrives at the proxy, START_HOLD_S after the launch, or the agent ends,
        whichever comes first."""
        if self.start_place.gate is None:
            return
        with self.phase("start_wait") as ph:
            ahead = await self.start_place.take()
            ph.detail = f"{ahead} rollouts were waiting to start ahead of this one" if ahead else "started at once"

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
                refuse_not_found(self.probe, request.endpoint)

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
            mask_constrained=request.mask_constrained,
            max_weight_lag=request.max_weight_lag,
            continuity=request.continuity,
        )
        self.session = self.capture.proxy.open_session(request.endpoint, policy, on_turn=lambda t: self.emit("agent", "info", turn_line(t)))

    async def prepare_sandbox(self) -> None:
        """The sandbox's limits, and its factory's `prepare(limits) -> limits` if it has one: an image's pull."""
        self.limits = sandbox_limits(self.request)
        prepare = getattr(self.factory, "prepare", None)
        release = getattr(self.factory, "release", lambda limits: None)  # what prepare holds, given back
        if prepare is not None and self.request.task.image:
            with self.phase("image") as ph:
                self.limits = await in_thread(functools.partial(prepare, self.limits), release)
                self.held = functools.partial(release, self.limits)
                ph.detail = self.request.task.image

    async def sandbox_and_setup(self) -> bool:
        """Make the sandbox and run setup: once per group where the factory shares setups
        (core/sandbox/setupgroups.py): the first member runs it, the others start from what it left
        (an overlay of it, or a copy: core/sandbox/setupfork.py)."""
        task, factory = self.request.task, self.factory
        part = factory.setup_group(self.limits, self.harness.readonly_paths()) if task.setup and isinstance(factory, SharesSetup) else None
        if part is None:
            await self.make_sandbox()
            return await self.setup()
        key = group_key(self.harness.name, part, task.files, task.setup, self.request.setup_timeout_s)
        outcome, lead = await GROUPS.join(key, factory.find_setup)
        if lead is not None:
            return await self.lead_setup(key, lead)
        assert outcome is not None
        self.result.setup_results = [CommandResult.model_validate(r) for r in outcome.results]
        if outcome.failure is None and not await asyncio.to_thread(factory.hold_setup, outcome.layer):
            self.result.setup_results = []  # evicted meanwhile: this member runs its own
            await self.make_sandbox()
            return await self.setup()
        with self.phase("setup") as ph:
            ph.detail = "run once for the group: this rollout starts from what it left (the sandbox notes say whether by overlay or copy)"
            if outcome.failure is not None:
                self.fail("setup", outcome.failure)
                ph.ok = False
                return False
        try:
            await self.make_sandbox(outcome.layer)
        finally:
            await asyncio.to_thread(factory.release_setup, outcome.layer)
        return True

    async def lead_setup(self, key: str, lead: asyncio.Future[Outcome]) -> bool:
        """Run the group's setup here and save what it left for the others (a failure is not saved)."""
        assert isinstance(self.factory, SharesSetup)
        outcome = Outcome()  # the sandbox could not be made, or the layer saved: the others run their own
        try:
            await self.make_sandbox()
            ok = await self.setup()
            results = [r.model_dump(mode="json") for r in self.result.setup_results]
            try:
                layer = await asyncio.to_thread(self.factory.save_setup, self.sandbox, key, results) if ok else None
                outcome = Outcome(layer=layer, failure=None if ok else self.result.error, results=results)
            except SandboxError as e:
                logger.warning("rollout %s: the group's setup could not be saved: %s", self.rollout_id, e)
            return ok
        finally:
            GROUPS.settle(key, lead, outcome)

    async def make_sandbox(self, setup_layer: Any = None) -> None:
        """The rollout's sandbox (from a group's saved setup when given: the task's files are in it)."""
        request, res = self.request, self.result
        with self.phase("sandbox") as ph:
            limits = dataclasses.replace(self.limits, setup_layer=setup_layer)
            socket = self.capture.socket_path if request.network == "proxy_only" else None
            make = functools.partial(self.factory, readonly_paths=self.harness.readonly_paths(), limits=limits, capture_socket=socket)
            self.held = None  # the factory takes over what prepare held, whatever becomes of the sandbox
            self.sandbox = sandbox = await in_thread(make, lambda late: late.close())
            res.sandbox_id, res.sandbox_backend, res.sandbox_notes = sandbox.sandbox_id, sandbox.backend, list(sandbox.notes)
            if request.network == "proxy_only" and not sandbox.network_isolated:
                res.sandbox_notes.append("network 'proxy_only' was asked for but needs bubblewrap, socat and the proxy's socket; the network is open")
            for path, content in request.task.files.items() if setup_layer is None else ():
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
        return LaunchContext(
            request=self.request, workspace=workspace, home=home, proxy_base_url=sandbox_url, session_key=self.session.key, host_proxy_base_url=host_url
        )

    async def run_agent(self) -> bool:
        sandbox, session, res = self.sandbox, self.session, self.result
        assert sandbox is not None and session is not None
        with self.phase("agent") as ph:
            ctx = self.launch_context(sandbox.workspace, sandbox.home)
            self.start_place.agent_launched()
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
                self.start_place.release()  # ended before it was up (no model call): its place is free now
            res.agent_exit_code = r.exit_code
            res.agent_tool_calls = outcome.tool_calls
            res.agent_final_text = outcome.final_text
            res.agent_log_tail = tail(r.stdout + ("\n[stderr]\n" + r.stderr if r.stderr.strip() else ""))
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
        self.start_place.agent_launched()  # the trial makes its sandbox and starts its agent itself
        try:
            end = await self.harness.run_trial(self.launch_context(), stop, self.emit, res)
        finally:
            relay_task.cancel()
            self.start_place.release()
        end.agent.stopped = end.agent.stopped or stop.is_set()
        res.agent_log_tail = tail(res.agent_log_tail)
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
                await collect_files(res, sandbox)
            if session is not None:
                await collect_capture(res, session, self.capture.proxy, self.probe)
            if sandbox is not None:
                await close_sandbox(res, sandbox)
        res.wall_s = round(time.monotonic() - self.t0, 4)
        self.emit("done", "finished" if res.error is None else "failed", res.error or f"reward {res.reward}")
