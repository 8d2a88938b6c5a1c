"""OpenAI's Codex CLI (npm `@openai/codex`, a native binary), run as `codex exec --json`, speaking
the Responses API to the capture proxy (which translates it for the engine)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import TYPE_CHECKING

from harness_env.core.harness import AgentOutcome, LaunchContext, LaunchSpec, PinnedCliHarness
from harness_env.envs.codex.config import codex_argv, codex_env, config_toml
from harness_env.envs.codex.events import CodexEventParser

if TYPE_CHECKING:
    from harness_env.core.sandbox.base import ExecResult, Sandbox


class CodexHarness(PinnedCliHarness):
    name = "codex"
    capabilities = ("streaming", "tool_calls", "token_capture", "tool_call_count", "responses_api")

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        codex_home = os.path.join(ctx.home, ".codex")
        req = ctx.request
        return LaunchSpec(
            argv=codex_argv(self.command(), instruction=req.task.instruction),
            env=codex_env(codex_home, ctx.session_key),
            files={
                os.path.join(codex_home, "config.toml"): config_toml(
                    proxy_base_url=ctx.proxy_base_url, model=req.endpoint.model, extra=req.harness_config
                )
            },
        )

    def parser(self) -> CodexEventParser:
        return CodexEventParser()

    async def run_agent(self, ctx: LaunchContext, sandbox: Sandbox, stop: asyncio.Event) -> tuple[ExecResult, AgentOutcome]:
        r, outcome = await super().run_agent(ctx, sandbox, stop)
        if r.exit_code not in (0, None) and outcome.error:
            # Codex prints why a turn failed only in its JSON events (stdout); its stderr holds
            # start-up notices. The rollout's error quotes stderr's tail: end it with the reason.
            r = dataclasses.replace(r, stderr=f"{r.stderr.rstrip()}\n{outcome.error}")
        return r, outcome
