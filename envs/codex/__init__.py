"""The Codex harness."""

from harness_env.envs.codex.harness import CodexHarness

__all__ = ["CodexHarness"]
