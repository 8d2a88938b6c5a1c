"""Google's Gemini CLI (npm `@google/gemini-cli`, a Node program), run headless with
`--output-format stream-json`, speaking the Gemini API to the capture proxy (which translates it
for the engine)."""

from __future__ import annotations

import os

from harness_env.core.harness import LaunchContext, LaunchSpec, PinnedCliHarness
from harness_env.core.toolchain import ToolPin
from harness_env.envs.gemini_cli.config import gemini_argv, gemini_env, settings_json
from harness_env.envs.gemini_cli.events import GeminiEventParser


class GeminiCliHarness(PinnedCliHarness):
    name = "gemini-cli"
    pin = ToolPin(name="gemini-cli", package="@google/gemini-cli", version="0.61.0", bin="gemini", node_min="20.0.0")
    capabilities = ("streaming", "tool_calls", "token_capture", "tool_call_count", "gemini_api")
    dialect = "gemini"  # what it speaks to the proxy, and so the only native upstream it can be passed through to
    reason_in_events = True  # an API error is in its `result` event; stderr has start-up notices

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        req = ctx.request
        return LaunchSpec(
            argv=gemini_argv(self.command(), model=req.endpoint.model, instruction=req.task.instruction),
            env=gemini_env(proxy_base_url=ctx.proxy_base_url, session_key=ctx.session_key, cli_home=ctx.home),
            files={os.path.join(ctx.home, ".gemini", "settings.json"): settings_json(req.harness_config)},
        )

    def parser(self) -> GeminiEventParser:
        return GeminiEventParser()
