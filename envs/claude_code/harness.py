"""Anthropic's Claude Code (npm `@anthropic-ai/claude-code`, a native binary), run as `claude -p
--output-format stream-json`, speaking the Messages API to the capture proxy (which translates it
for the engine)."""

from __future__ import annotations

import os

from harness_env.core.harness import LaunchContext, LaunchSpec, PinnedCliHarness
from harness_env.core.toolchain import ToolPin
from harness_env.envs.claude_code.config import claude_argv, claude_env, settings_json
from harness_env.envs.claude_code.events import ClaudeCodeEventParser


class ClaudeCodeHarness(PinnedCliHarness):
    name = "claude-code"
    # One native binary per platform, in @anthropic-ai/claude-code-linux-<arch>[-musl]; the
    # package's bin is a placeholder its postinstall script (never run) overwrites with it.
    pin = ToolPin(
        name="claude-code", package="@anthropic-ai/claude-code", version="2.1.332", bin="claude", native_prefix="@anthropic-ai/claude-code", native_path="{bin}"
    )
    capabilities = ("streaming", "tool_calls", "token_capture", "tool_call_count", "messages_api")
    dialect = "messages"  # what it speaks to the proxy, and so the only native upstream it can be passed through to
    reason_in_events = True  # an API error is quoted in its `result` event; stderr has notices only

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        config_dir = os.path.join(ctx.home, ".claude")
        req = ctx.request
        return LaunchSpec(
            argv=claude_argv(self.command(), model=req.endpoint.model, instruction=req.task.instruction),
            env=claude_env(proxy_base_url=ctx.proxy_base_url, session_key=ctx.session_key, config_dir=config_dir, agent_timeout_s=req.agent_timeout_s),
            files={os.path.join(config_dir, "settings.json"): settings_json(req.harness_config)},
        )

    def parser(self) -> ClaudeCodeEventParser:
        return ClaudeCodeEventParser()
