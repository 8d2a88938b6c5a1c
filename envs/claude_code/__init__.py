"""The Claude Code harness."""

from harness_env.envs.claude_code.harness import ClaudeCodeHarness

__all__ = ["ClaudeCodeHarness"]
