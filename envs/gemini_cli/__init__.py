"""The Gemini CLI harness."""

from harness_env.envs.gemini_cli.harness import GeminiCliHarness

__all__ = ["GeminiCliHarness"]
