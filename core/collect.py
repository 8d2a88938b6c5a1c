"""What a rollout's result gathers at its end (the engine's `collect` phase, core/engine.py): the
files the agent left, the captured turns and their graph, what the capture gives a trainer (the
rollout type), log tails, the limits hit, and the sandbox's own notes as it is closed. Collecting is
best effort; closing always runs."""

from __future__ import annotations

import asyncio

from harness_env.core.capture.graph import link_turns, summarise_rows
from harness_env.core.capture.probe import ProbeResult
from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.session import CaptureSession
from harness_env.core.sandbox.base import Sandbox
from harness_env.models import RolloutResult

LOG_TAIL_CHARS = 4000


def tail(text: str, n: int = LOG_TAIL_CHARS) -> str:
    return text[-n:]


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


async def collect_files(res: RolloutResult, sandbox: Sandbox) -> None:
    """The files the agent left (bounded by the sandbox); a failure is a note, clean-up still runs."""
    try:
        res.files = await asyncio.to_thread(sandbox.collect_files)
    except Exception as e:  # collecting is best effort; clean-up must still run
        res.sandbox_notes.append(f"collecting files failed: {e}")


async def collect_capture(res: RolloutResult, session: CaptureSession, proxy: CaptureProxy, probe: ProbeResult | None) -> None:
    """Forget the session's key, then what it captured: turns, graph, log tail, level, type."""
    await proxy.close_session(session)
    # Making the wire lists from packed turns and linking them walks every token id
    # (thousands per turn): off the event loop.
    res.proxy_turns = await asyncio.to_thread(session.sorted_turns)
    res.graph = await asyncio.to_thread(lambda: summarise_rows(link_turns(res.proxy_turns), res.training_rows()))
    res.proxy_log_tail = tail(session.log_tail())
    res.capture_level = session.capture_level()
    res.continuity = session.continuity
    res.rollout_type, res.rollout_type_reason = rollout_type(probe, res)
    res.dropped_fields = sorted(session.dropped_fields)
    res.limits_hit = list(session.limits_hit)


async def close_sandbox(res: RolloutResult, sandbox: Sandbox) -> None:
    """The sandbox's limits hit and notes, then close it (a clean-up problem becomes a note)."""
    res.limits_hit += await asyncio.to_thread(sandbox.limits_hit)
    # What the sandbox noted since it was made (at verify: the git configs it reduced).
    res.sandbox_notes += [n for n in sandbox.notes if n not in res.sandbox_notes]
    problem = await sandbox.close()
    if problem:
        res.sandbox_notes.append(f"clean-up: {problem}")
