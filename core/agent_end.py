"""How an agent's run ended, in words the result carries: (error_kind, message) from the facts of
the run (core/harness.py AgentEnd) and what the capture session saw; one rule for every harness.
Pure functions: the engine (core/engine.py) applies the rule, and confirms an `endpoint` end
against the endpoint itself before it stands."""

from __future__ import annotations

from harness_env.core.harness import AgentEnd, AgentOutcome
from harness_env.core.sandbox.base import ExecResult


def _last_upstream_error(session) -> str:
    return next((t.upstream_error for t in reversed(session.turns) if t.upstream_error), "") or ""


def _stopped_failure(session) -> tuple[str, str]:
    """Why the agent was stopped early by the capture session (its model calls kept failing)."""
    last_error = _last_upstream_error(session)[:300]
    if session.last_failure_infra:
        return "endpoint", f"the policy endpoint failed {session.consecutive_failures} times in a row; the agent was stopped: {last_error}"
    return "agent_error", f"the endpoint rejected the agent's model call {session.consecutive_failures} times in a row; the agent was stopped: {last_error}"


def classify_agent_end(end: AgentEnd, session, timeout_s: float) -> tuple[str, str] | None:
    """The rollout's (error_kind, message) from how the agent's run ended, or None when it ended
    normally; one rule for every harness. Using up max_turns or a budget (max_auxiliary_calls,
    max_recorded_mb) is a normal end (the workspace is graded as it stands); a failed run while the
    endpoint was failing (its last calls unreachable, timed out or 5xx) is the endpoint's fault.
    Every other end is one the agent can bring about (AGENT_CAUSED_KINDS): the engine grades it all
    the same."""
    if end.timed_out and session.sync_held_s >= 1.0:  # the clock ran while the trainer held its calls
        return "internal", (
            f"the agent did not finish within agent_timeout_s={timeout_s}, {session.sync_held_s:.0f} s of which its model "
            "calls waited for a weight sync (the trainer's doing, not the agent's): not graded"
        )
    if end.timed_out:
        return "agent_timeout", end.timeout_message or f"the agent did not finish within agent_timeout_s={timeout_s}; its processes were killed"
    if (session.limit_reached or end.turn_limit_hit) and end.failure is None:
        return None
    if end.stopped:
        return _stopped_failure(session)
    if end.failure is not None:
        return end.failure
    if end.error is None:
        return None
    if session.consecutive_failures and session.last_failure_infra:  # the endpoint was failing when the run ended
        detail = end.endpoint_detail or _last_upstream_error(session)[:300] or end.error
        return "endpoint", f"the policy endpoint failed during the agent run: {detail}"
    return "agent_error", end.error


def sandboxed_agent_end(harness: str, r: ExecResult, outcome: AgentOutcome) -> AgentEnd:
    """The facts of a harness's run in one of our sandboxes (a CLI, or the white-box loop)."""
    error = None
    if r.exit_code not in (0, None):
        error = f"{harness} exited {r.exit_code}: {(r.stderr or r.stdout)[-500:]}"
    elif outcome.error:
        error = f"{harness} reported a failed model call: {outcome.error}"
    return AgentEnd(
        exit_code=r.exit_code,
        timed_out=r.timed_out,
        stopped=r.stopped,
        turn_limit_hit=outcome.turn_limit_hit,
        error=error,
        endpoint_detail=outcome.error or r.stderr[-300:],
    )
