"""The white-box harness: no CLI, the environment runs the tool loop itself (loop.py)."""

from __future__ import annotations

import asyncio

from harness_env.core.harness import AgentOutcome, HarnessBase, LaunchContext
from harness_env.core.sandbox.base import ExecResult, Sandbox
from harness_env.envs.whitebox.loop import run_loop
from harness_env.envs.whitebox.options import WhiteboxOptions
from harness_env.envs.whitebox.tools import ToolBox, ToolLimits

VERSION = "1"  # of the tool schema and system prompt: bump when either changes


class WhiteboxHarness(HarnessBase):
    name = "whitebox"
    capabilities = ("tool_calls", "token_capture", "tool_call_count", "exact_history")
    options_model = WhiteboxOptions  # its own options (envs/whitebox/options.py): request.harness_options

    def version(self) -> str | None:
        return VERSION  # part of this package: always installed

    def check_installed(self) -> None:
        return None

    def readonly_paths(self) -> list[str]:
        return []

    async def run_agent(self, ctx: LaunchContext, sandbox: Sandbox, stop: asyncio.Event) -> tuple[ExecResult, AgentOutcome]:
        req = ctx.request
        toolbox = ToolBox(sandbox, ToolLimits.from_config(req.harness_config))
        return await run_loop(
            toolbox=toolbox,
            proxy_base_url=ctx.host_proxy_base_url or ctx.proxy_base_url,  # the loop runs in the server
            session_key=ctx.session_key,
            model=req.endpoint.model,
            max_tokens=WhiteboxOptions.of(req).max_tokens,
            instruction=req.task.instruction,
            max_turns=req.max_turns,
            timeout_s=req.agent_timeout_s,
            stop=stop,
        )
