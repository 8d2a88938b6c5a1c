"""Run one Harbor trial (Harbor's own Trial: agent, then verifier) in our local environment.

`run_harbor_trial` builds a `harbor.trial.trial.Trial` whose environment is
`LocalHarborEnvironment` (by import path), runs it under one asyncio deadline, and reads the
reward from the trial's verifier directory with our own reader (envs/harbor/reward.py), not from
Harbor's VerifierResult, so the rules match the rest of harness-env. Harbor failures (a raised
exception, a recorded exception_info, the deadline) never raise: they are in `exception` and
`notes`. Only a missing Harbor install or bubblewrap are reported the same way, as notes.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from harness_env.envs.harbor.reward import RewardSource, read_verifier_reward

LOCAL_ENV_IMPORT_PATH = "harness_env.envs.harbor.local_env:LocalHarborEnvironment"


@dataclass
class HarborTrialOutcome:
    reward: float | None
    reward_source: RewardSource | None
    notes: list[str] = field(default_factory=list)
    exception: str | None = None  # "Type: message" of what stopped the trial, if anything
    agent_dir: Path | None = None
    verifier_dir: Path | None = None
    trajectory_path: Path | None = None  # agent/trajectory.json when the agent wrote one
    trial_dir: Path | None = None


async def run_harbor_trial(
    task_dir: str | Path,
    agent_name: str,
    trials_dir: str | Path,
    *,
    timeout_s: float,
    trial_name: str | None = None,
    reward_key: str | None = None,
) -> HarborTrialOutcome:
    """Run `agent_name` (a Harbor agent name: "oracle", "nop", ...) on the Harbor task at
    `task_dir`; Harbor writes the trial under `trials_dir/<trial_name>`."""
    notes: list[str] = []
    try:
        from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig, VerifierConfig
        from harbor.trial.trial import Trial
    except ImportError as e:
        return HarborTrialOutcome(None, None, [f"Harbor is not installed ({e}): `uv sync --extra harbor`"], exception=repr(e))
    from harness_env.core.sandbox.local import bwrap_available
    from harness_env.envs.harbor.local_env import NO_BWRAP_MESSAGE

    if not bwrap_available():
        return HarborTrialOutcome(None, None, [NO_BWRAP_MESSAGE], exception=f"SandboxError: {NO_BWRAP_MESSAGE}")

    name = trial_name or f"harbor-{uuid.uuid4().hex[:10]}"
    trial_dir = Path(trials_dir) / name
    outcome = HarborTrialOutcome(
        None, None, notes, agent_dir=trial_dir / "agent", verifier_dir=trial_dir / "verifier", trial_dir=trial_dir
    )
    trial = None
    try:
        async with asyncio.timeout(timeout_s):
            config = TrialConfig(
                task=TaskConfig(path=Path(task_dir)),
                trials_dir=Path(trials_dir),
                trial_name=name,
                agent=AgentConfig(name=agent_name),
                environment=EnvironmentConfig(import_path=LOCAL_ENV_IMPORT_PATH),
                verifier=VerifierConfig(),
            )
            trial = await Trial.create(config)
            result = await trial.run()
        if result.exception_info is not None:
            info = result.exception_info
            outcome.exception = f"{info.exception_type}: {info.exception_message}"
    except TimeoutError:
        outcome.exception = f"TimeoutError: the Harbor trial did not finish within {timeout_s}s"
    except Exception as e:  # Harbor's own failures: config validation, task loading, env start
        outcome.exception = f"{type(e).__name__}: {e}"
    finally:
        env = getattr(trial, "agent_environment", None) if trial is not None else None
        if env is not None:  # Trial stops it itself; again here in case cancellation cut that short
            try:
                await env.stop(delete=True)
            except Exception as e:
                notes.append(f"stopping the environment failed: {e}")
    if outcome.exception:
        notes.append(f"the Harbor trial raised {outcome.exception}")
    reward, source, reward_notes = read_verifier_reward(outcome.verifier_dir, reward_key)
    outcome.reward, outcome.reward_source = reward, source
    notes.extend(reward_notes)
    trajectory = outcome.agent_dir / "trajectory.json"
    outcome.trajectory_path = trajectory if trajectory.is_file() else None
    return outcome
