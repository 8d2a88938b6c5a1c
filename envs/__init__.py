"""One package per harness, each registered here under the request's `harness` name."""

from __future__ import annotations

from harness_env.core.registry import HARNESSES, get_harness, register_harness
from harness_env.envs.claude_code import ClaudeCodeHarness
from harness_env.envs.codex import CodexHarness
from harness_env.envs.gemini_cli import GeminiCliHarness
from harness_env.envs.harbor.harness import HarborHarness
from harness_env.envs.opencode import OpenCodeHarness
from harness_env.envs.pi import PiHarness
from harness_env.envs.whitebox import WhiteboxHarness

for _cls in (PiHarness, OpenCodeHarness, CodexHarness, ClaudeCodeHarness, GeminiCliHarness, WhiteboxHarness, HarborHarness):
    register_harness(_cls.name, _cls)

__all__ = ["HARNESSES", "get_harness"]
