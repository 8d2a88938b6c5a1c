"""The Pi coding agent (npm `@earendil-works/pi-coding-agent`), run in print + JSON mode."""

from __future__ import annotations

import os

from harness_env.core.harness import LaunchContext, LaunchSpec, PinnedCliHarness
from harness_env.core.toolchain import ToolPin
from harness_env.envs.pi.config import models_json, pi_argv, pi_env, pi_stdin, settings_json
from harness_env.envs.pi.events import PiEventParser


class PiHarness(PinnedCliHarness):
    name = "pi"
    pin = ToolPin(name="pi", package="@earendil-works/pi-coding-agent", version="1.6.0", bin="pi", node_min="22.19.0")
    capabilities = ("streaming", "tool_calls", "token_capture", "tool_call_count")

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        agent_dir = os.path.join(ctx.home, ".pi", "agent")
        req = ctx.request
        return LaunchSpec(
            argv=pi_argv(self.command(), model=req.endpoint.model, instruction=req.task.instruction),
            stdin=pi_stdin(req.task.instruction),
            env=pi_env(agent_dir),
            files={
                os.path.join(agent_dir, "models.json"): models_json(
                    proxy_base_url=ctx.proxy_base_url, session_key=ctx.session_key, model=req.endpoint.model, max_tokens=req.max_tokens_cap
                ),
                os.path.join(agent_dir, "settings.json"): settings_json(),
            },
        )

    def parser(self) -> PiEventParser:
        return PiEventParser()
