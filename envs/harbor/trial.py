"""Run one Harbor trial (Harbor's own Trial: environment, agent, verifier) under one deadline.

`run_harbor_trial` creates a `harbor.trial.trial.Trial` from a TrialConfig (envs/harbor/config.py),
runs it until it ends, the deadline passes or `stop` is set, and reads the reward from the
trial's verifier directory with our own reader (envs/harbor/reward.py), so the rules match the
rest of harness-env. Nothing here raises: Harbor's failures (a raised exception, a recorded
exception_info, the deadline, a stop) are in `exception` / `exception_type` and `notes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness_env.core.errors import InvalidRequestError
from harness_env.core.sandbox import safefs
from harness_env.envs.harbor.reward import RewardSource, read_verifier_reward, reward_map

# Harbor's lifecycle events -> (our phase, status)
HOOK_PHASES = {
    "environment-start": ("sandbox", "started"),
    "agent-start": ("agent", "started"),
    "agent-end": ("agent", "finished"),
    "verification-start": ("verify", "started"),
}
MAX_TRAJECTORY_BYTES = 8 * 1024 * 1024


@dataclass
class HarborTrialOutcome:
    reward: float | None = None
    reward_source: RewardSource | None = None
    notes: list[str] = field(default_factory=list)
    exception_type: str | None = None  # Harbor's exception class name, or ours: TimeoutError, Stopped
    exception: str | None = None  # "Type: message" of what stopped the trial, if anything
    result: Any = None  # Harbor's TrialResult, when the trial got that far
    agent_dir: Path | None = None
    verifier_dir: Path | None = None
    trial_dir: Path | None = None
    files: dict[str, str] | None = None  # the workspace when the environment stopped (local only)
    sandbox_id: str | None = None  # our sandbox's id (local only)
    last_phase: str | None = None  # the last phase Harbor started: sandbox, agent or verify
    reward_error: str | None = None  # the rewards are there but no scalar could be picked
    rewards: dict[str, float] | None = None  # reward.json's whole map, when it holds one


def read_trajectory(agent_dir: Path | None) -> tuple[dict[str, Any] | None, str | None]:
    """The agent's ATIF trajectory (agent/trajectory.json), or None and why not. Read without
    following a link, only when it is a regular file, within MAX_TRAJECTORY_BYTES (blocking: call
    it off the event loop)."""
    if agent_dir is None:
        return None, None
    data = safefs.read_regular(agent_dir, "trajectory.json", MAX_TRAJECTORY_BYTES + 1)
    if data is None:
        try:
            st = safefs.stat_entry(agent_dir, "trajectory.json")
        except OSError:
            return None, None
        return None, f"trajectory.json is {safefs.kind_of(st.st_mode)}, not a regular file; left out"
    if len(data) > MAX_TRAJECTORY_BYTES:
        return None, f"trajectory.json is larger than {MAX_TRAJECTORY_BYTES} bytes; left out"
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return None, f"trajectory.json is not readable JSON: {e}"
    return (parsed, None) if isinstance(parsed, dict) else (None, "trajectory.json is not a JSON object")


def count_tool_calls(trajectory: dict[str, Any] | None) -> int | None:
    """Tool calls the agent made, from its ATIF trajectory's steps."""
    if trajectory is None:
        return None
    steps = trajectory.get("steps")
    if not isinstance(steps, list):
        return None
    return sum(len(s.get("tool_calls") or []) for s in steps if isinstance(s, dict))


async def run_harbor_trial(
    config: Any, *, timeout_s: float, stop: asyncio.Event | None = None, on_event: Callable[[str, str], None] | None = None, reward_key: str | None = None
) -> HarborTrialOutcome:
    """Run the trial `config` (a harbor TrialConfig). `on_event(phase, status)` follows Harbor's
    lifecycle hooks; `stop` ends the trial early (Harbor cleans up as on cancellation)."""
    trial_dir = Path(config.trials_dir) / config.trial_name
    out = HarborTrialOutcome(agent_dir=trial_dir / "agent", verifier_dir=trial_dir / "verifier", trial_dir=trial_dir)
    try:
        from harbor.trial.hooks import TrialEvent
        from harbor.trial.trial import Trial
    except ImportError as e:
        out.exception_type, out.exception = "ImportError", f"Harbor is not installed ({e}): `uv sync --extra harbor`"
        out.notes.append(out.exception)
        return out

    trial = None

    async def follow(event_value: str) -> None:
        mapped = HOOK_PHASES.get(event_value)
        if mapped is None:
            return
        out.last_phase = mapped[0]
        if event_value == "verification-start":
            reset = getattr(getattr(trial, "agent_environment", None), "reset_for_verification", None)
            if reset is not None:
                await asyncio.to_thread(reset)
        if on_event is not None:
            on_event(*mapped)

    async def run() -> Any:
        nonlocal trial
        trial = await Trial.create(config)
        for event in TrialEvent:

            async def hook(_ev, value=event.value) -> None:
                await follow(value)

            trial.add_hook(event, hook)
        return await trial.run()

    task = asyncio.ensure_future(run())
    stopper = asyncio.ensure_future(stop.wait()) if stop is not None else None
    try:
        done, _ = await asyncio.wait({task, *([stopper] if stopper else [])}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            try:
                out.result = task.result()
            except Exception as e:  # Harbor's own failures: config validation, task loading, env start
                out.exception_type, out.exception = type(e).__name__, f"{type(e).__name__}: {e}"
        else:
            stopped = stopper is not None and stopper in done
            task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, 60)
            if stopped:
                out.exception_type, out.exception = "Stopped", "Stopped: the trial was stopped (the policy endpoint kept failing)"
            else:
                out.exception_type, out.exception = "TimeoutError", f"TimeoutError: the Harbor trial did not finish within {timeout_s:.0f}s"
    finally:
        if stopper is not None:
            stopper.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        env = getattr(trial, "agent_environment", None) if trial is not None else None
        if env is not None:  # Trial stops it itself; again here in case cancellation cut that short
            try:
                await env.stop(delete=True)
            except Exception as e:
                out.notes.append(f"stopping the environment failed: {e}")
            out.files = getattr(env, "collected_files", None)
            out.sandbox_id = getattr(env, "sandbox_id", None)
            out.notes.extend(getattr(env, "transfer_notes", None) or [])
    if out.result is not None and out.result.exception_info is not None and out.exception is None:
        info = out.result.exception_info
        out.exception_type, out.exception = info.exception_type, f"{info.exception_type}: {info.exception_message}"
    if out.exception:
        out.notes.append(f"the Harbor trial raised {out.exception[:2000]}")
    try:  # files of the trial directory, written by the environment's downloads: read off the loop
        out.reward, out.reward_source, reward_notes = await asyncio.to_thread(read_verifier_reward, out.verifier_dir, reward_key)
        out.notes.extend(reward_notes)
    except InvalidRequestError as e:  # reward_key names no entry of the map
        out.reward_error = str(e)
    out.rewards = await asyncio.to_thread(reward_map, out.verifier_dir)
    if out.reward is None and out.reward_error is None and out.rewards:
        out.reward_error = f"the verifier's reward.json holds {sorted(out.rewards)} and no single reward: name the one to use with harbor.reward_key"
    return out
