"""harness-env: run real coding-agent harnesses on tasks in sandboxes, capture exact token
trajectories (token ids + logprobs of every model call) and a reward, for RL training.

The engine entry points are imported lazily so that `harness_env.client` (on a trainer host) pulls
in only the wire types and httpx.
"""

from typing import Any

from harness_env.models import CommandResult, Endpoint, PhaseEvent, RolloutArgs, RolloutRequest, RolloutResult, Task, Turn

__all__ = ["CommandResult", "Endpoint", "PhaseEvent", "RolloutArgs", "RolloutRequest", "RolloutResult", "Task", "Turn", "run_rollout", "run_rollout_sync"]


def __getattr__(name: str) -> Any:
    if name in ("run_rollout", "run_rollout_sync"):
        from harness_env import rollout

        return getattr(rollout, name)
    raise AttributeError(f"module 'harness_env' has no attribute {name!r}")
