"""One package per harness, each registered here under the request's `harness` name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness_env.core.registry import HARNESSES, get_harness, register_harness
from harness_env.envs.claude_code import ClaudeCodeHarness
from harness_env.envs.codex import CodexHarness
from harness_env.envs.gemini_cli import GeminiCliHarness
from harness_env.envs.harbor.harness import HarborHarness
from harness_env.envs.opencode import OpenCodeHarness
from harness_env.envs.pi import PiHarness
from harness_env.envs.whitebox import WhiteboxHarness

if TYPE_CHECKING:
    from harness_env.models import HarnessOptions

for _cls in (PiHarness, OpenCodeHarness, CodexHarness, ClaudeCodeHarness, GeminiCliHarness, WhiteboxHarness, HarborHarness):
    register_harness(_cls.name, _cls)


def harness_options_models() -> dict[str, type[HarnessOptions]]:
    """Every registered harness that has options of its own -> its options model (what the CLI,
    the MCP schema and the web form list)."""
    return {name: cls.options_model for name, cls in HARNESSES.items() if getattr(cls, "options_model", None) is not None}


__all__ = ["HARNESSES", "get_harness", "harness_options_models"]
