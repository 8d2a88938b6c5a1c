"""The task's own commands in a sandbox: setup before the agent, verify after it, each kept as a
CommandResult (output tails bounded), and the reward verify gives (core/reward.py)."""

from __future__ import annotations

import asyncio

from harness_env.core.reward import compute_reward
from harness_env.core.sandbox.base import ExecResult, Sandbox
from harness_env.core.sandbox.envvars import git_program_pins
from harness_env.models import CommandResult

COMMAND_OUTPUT_CHARS = 8000


def command_result(cmd: str, res: ExecResult) -> CommandResult:
    return CommandResult(
        cmd=cmd,
        exit_code=res.exit_code,
        stdout=res.stdout[-COMMAND_OUTPUT_CHARS:],
        stderr=res.stderr[-COMMAND_OUTPUT_CHARS:],
        duration_s=round(res.duration_s, 4),
        timed_out=res.timed_out,
    )


async def run_setup(sandbox: Sandbox, commands: list[str], timeout: float, results: list[CommandResult]) -> str | None:
    """Run the task's setup commands in order, appending to `results`; the first failure stops
    them and is returned in words."""
    for cmd in commands:
        # The task author's commands, before the agent: they keep the host's network (installs).
        r = await sandbox.exec(cmd, timeout=timeout, open_network=True, env=git_program_pins())
        results.append(command_result(cmd, r))
        if r.exit_code != 0:
            why = f"timed out after {timeout}s" if r.timed_out else f"exited {r.exit_code}"
            return f"setup command {cmd!r} {why}: {(r.stderr or r.stdout)[-500:]}"
    return None


async def run_verify(sandbox: Sandbox, commands: list[str], timeout: float, results: list[CommandResult]) -> tuple[float | None, str | None, list[str]]:
    """Run the verify commands (appending to `results`) and compute (reward, source, notes). Every
    process the agent left is killed and the verifier directory made anew first, so the agent
    cannot forge the reward."""
    await asyncio.to_thread(sandbox.clear_reward_file)
    for cmd in commands:
        r = await sandbox.exec(cmd, timeout=timeout, env=sandbox.verify_env())
        results.append(command_result(cmd, r))
    return compute_reward(results, await asyncio.to_thread(sandbox.read_reward_file))
