"""OpenAI's Codex CLI (npm `@openai/codex`, a native binary), run as `codex exec --json`, speaking
the Responses API to the capture proxy (which translates it for the engine)."""

from __future__ import annotations

import os

from harness_env.core.harness import LaunchContext, LaunchSpec, PinnedCliHarness
from harness_env.core.toolchain import ToolPin
from harness_env.envs.codex.config import codex_argv, codex_env, config_toml
from harness_env.envs.codex.events import CodexEventParser


class CodexHarness(PinnedCliHarness):
    name = "codex"
    # One static (musl) binary per architecture, in @openai/codex-linux-<arch> (an npm alias of a
    # platform version of @openai/codex); the package's bin script only finds and execs it.
    pin = ToolPin(
        name="codex",
        package="@openai/codex",
        version="0.171.0",
        bin="codex",
        native_prefix="@openai/codex",
        native_path="vendor/{machine}-unknown-linux-musl/bin/codex",
        native_variants=False,
    )
    capabilities = ("streaming", "tool_calls", "token_capture", "tool_call_count", "responses_api")
    dialect = "responses"  # what it speaks to the proxy, and so the only native upstream it can be passed through to
    reason_in_events = True  # a failed turn's reason is in its `turn.failed` event

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        codex_home = os.path.join(ctx.home, ".codex")
        req = ctx.request
        return LaunchSpec(
            argv=codex_argv(self.command(), instruction=req.task.instruction),
            env=codex_env(codex_home, ctx.session_key),
            files={os.path.join(codex_home, "config.toml"): config_toml(proxy_base_url=ctx.proxy_base_url, model=req.endpoint.model, extra=req.harness_config)},
        )

    def parser(self) -> CodexEventParser:
        return CodexEventParser()
