"""OpenCode (npm `opencode-ai`, a native binary), run as `opencode run --format json`."""

from __future__ import annotations

import os

from harness_env.core.harness import LaunchContext, LaunchSpec, PinnedCliHarness
from harness_env.core.toolchain import ToolPin
from harness_env.envs.opencode.config import opencode_argv, opencode_env, opencode_json
from harness_env.envs.opencode.events import OpenCodeEventParser


class OpenCodeHarness(PinnedCliHarness):
    name = "opencode"
    pin = ToolPin(name="opencode", package="opencode-ai", version="1.18.33", bin="opencode", native_prefix="opencode")
    capabilities = ("streaming", "tool_calls", "token_capture", "tool_call_count", "auxiliary_title_call")

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        req = ctx.request
        config_path = os.path.join(ctx.home, ".config", "harness-env", "opencode.json")
        return LaunchSpec(
            argv=opencode_argv(self.command(), model=req.endpoint.model),
            stdin=req.task.instruction,
            env=opencode_env(config_path),
            files={
                config_path: opencode_json(
                    proxy_base_url=ctx.proxy_base_url,
                    session_key=ctx.session_key,
                    model=req.endpoint.model,
                    max_tokens=req.max_tokens_cap,
                    extra=req.harness_config,
                )
            },
        )

    def parser(self) -> OpenCodeEventParser:
        return OpenCodeEventParser()
