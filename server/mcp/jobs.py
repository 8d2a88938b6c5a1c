"""The MCP tools of jobs: `submit_rollout` (run_rollout's arguments and an idempotency key; the
rollout runs whether or not the caller stays, and the answer is its id at once) and `get_rollout`
(a rollout's status, phases and, once it ended, its summary or whole result: also the whole
result of a rollout whose summary run_rollout gave). Served over MCP and, through the same
functions, OpenEnv's plain JSON-RPC and /ws (McpToolServer.rpc_tools)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent
from pydantic import Field

from harness_env.core.errors import HarnessEnvError
from harness_env.core.runner import resolve
from harness_env.models import MAX_IDEMPOTENCY_KEY_CHARS, MAX_WAIT_S, Detail, RolloutAccepted, RolloutJob
from harness_env.models.jobs import is_rollout_id
from harness_env.server.jobs.manager import JobManager
from harness_env.server.mcp.rollout import ArgumentsAsSent, rollout_args, rpc_result, run_rollout_tool_schema

SUBMIT_DESCRIPTION = (
    "Submit one rollout (the arguments of run_rollout, plus an optional idempotency_key) and get its rollout_id at once; "
    "it runs on the server whether or not you stay. Follow it with get_rollout. A submission repeated with the same "
    "idempotency_key runs nothing new and answers the first one's id. A full server refuses at once (a tool error)."
)
GET_DESCRIPTION = (
    "A rollout's state by rollout_id (from submit_rollout, or the rollout_id of a run_rollout summary): status (queued, "
    "running, finished, failed, cancelled, interrupted), phases so far, and once it ended its summary, or with "
    f"detail='full' the whole result. wait_s (up to {MAX_WAIT_S:g}) waits that long for it to end first."
)


def submit_schema() -> dict[str, Any]:
    """run_rollout's input schema (as listed) with idempotency_key in place of detail."""
    schema = run_rollout_tool_schema()
    schema["properties"].pop("detail", None)
    schema["properties"]["idempotency_key"] = {
        "type": ["string", "null"],
        "minLength": 1,
        "maxLength": MAX_IDEMPOTENCY_KEY_CHARS,
        "description": "a key of yours: the same key again runs nothing new",
    }
    return schema


def _answer(data: RolloutAccepted | RolloutJob, text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data.model_dump(mode="json"), is_error=False)


def job_text(job: RolloutJob) -> str:
    lines = [f"rollout {job.rollout_id}: {job.status}" + (f" ({len(job.phases)} phase events so far)" if not job.ended else "")]
    if job.summary is not None:
        lines.append(job.summary.text())
    return "\n".join(lines)


class JobTools:
    def __init__(self, jobs: JobManager) -> None:
        self.jobs = jobs

    async def submit(self, arguments: dict[str, Any]) -> RolloutAccepted:
        arguments = dict(arguments)
        key = arguments.pop("idempotency_key", None)
        if key is not None and not (isinstance(key, str) and 0 < len(key) <= MAX_IDEMPOTENCY_KEY_CHARS and key.isprintable()):
            raise ToolError(f"idempotency_key must be printable text of 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters")
        if arguments.pop("detail", None) is not None:
            raise ToolError("submit_rollout takes no detail; get_rollout does")
        args = rollout_args(arguments)
        try:
            found = await self.jobs.existing(key) if key else None
            if found is not None:
                return found
            prepared = await asyncio.to_thread(resolve, args, trusted=False)
            return await self.jobs.submit(prepared, key=key)
        except HarnessEnvError as e:  # a bad argument, a full server
            raise ToolError(str(e)) from None

    async def get(self, rollout_id: str, detail: Detail = "summary", wait_s: float = 0.0) -> RolloutJob:
        if not is_rollout_id(rollout_id):
            raise ToolError("rollout_id must be a rollout's id (hexadecimal, as submit_rollout or run_rollout gave it)")
        if detail not in ("summary", "full") or not isinstance(wait_s, (int, float)) or not 0 <= wait_s <= MAX_WAIT_S:
            raise ToolError(f"detail must be 'summary' or 'full', wait_s a number of seconds from 0 to {MAX_WAIT_S:g}")
        try:
            job = await self.jobs.get(rollout_id, detail, float(wait_s))
        except HarnessEnvError as e:
            raise ToolError(str(e)) from None
        if job is None:
            raise ToolError(f"no rollout {rollout_id} on this server (never submitted here, or removed by retention)")
        return job

    async def rpc_submit(self, arguments: dict[str, Any]) -> dict[str, Any]:
        accepted = await self.submit(arguments)
        return rpc_result(accepted.model_dump(mode="json"), f"submitted rollout {accepted.rollout_id} ({accepted.status})")

    async def rpc_get(self, arguments: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(arguments) - {"rollout_id", "detail", "wait_s"})
        if unknown:
            raise ToolError(f"get_rollout takes rollout_id, detail and wait_s, not {', '.join(unknown)}")
        job = await self.get(arguments.get("rollout_id", ""), arguments.get("detail") or "summary", arguments.get("wait_s") or 0.0)
        return rpc_result(job.model_dump(mode="json"), job_text(job))


def register_job_tools(server: Any, jobs: JobManager) -> None:
    """Add submit_rollout and get_rollout to an McpToolServer (both of its faces)."""
    tools = JobTools(jobs)

    async def submit_rollout(arguments: dict[str, Any]) -> Annotated[CallToolResult, RolloutAccepted]:
        accepted = await tools.submit(arguments)
        return _answer(accepted, f"submitted rollout {accepted.rollout_id} ({accepted.status}); follow it with get_rollout")

    server.mcp.add_tool(submit_rollout, name="submit_rollout", description=SUBMIT_DESCRIPTION)
    tool = server.mcp._tool_manager.get_tool("submit_rollout")
    tool.parameters = submit_schema()
    tool.fn_metadata = tool.fn_metadata.model_copy(update={"arg_model": ArgumentsAsSent})  # checked by RolloutArgs, not the SDK

    async def get_rollout(
        rollout_id: Annotated[str, Field(min_length=1, max_length=32, description="the rollout's id")],
        detail: Annotated[Detail, Field(description="summary (at most 16 KB) or full (the whole result)")] = "summary",
        wait_s: Annotated[float, Field(ge=0, le=MAX_WAIT_S, description="wait up to this many seconds for it to end")] = 0.0,
    ) -> Annotated[CallToolResult, RolloutJob]:
        job = await tools.get(rollout_id, detail, wait_s)
        return _answer(job, job_text(job))

    server.mcp.add_tool(get_rollout, name="get_rollout", description=GET_DESCRIPTION)
    server.rpc_tools.update({"submit_rollout": tools.rpc_submit, "get_rollout": tools.rpc_get})
