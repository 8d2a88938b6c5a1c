"""The MCP tools `run_rollout`, `list_harnesses`, `list_tasks`, `catalog` (and the jobs' `submit_rollout`,
`get_rollout`, from server/mcp/jobs.py) at /mcp, for two kinds of client: MCP clients (the official
SDK and others) over streamable HTTP, stateless so that replicas can sit behind a load balancer,
with progress notifications per phase when asked for; and OpenEnv's MCPToolClient, which posts
plain JSON-RPC without the MCP handshake and holds a WebSocket at /ws (server/mcp/openenv.py).

`run_rollout`'s input schema and description are derived from the option fields (RolloutArgs and
each harness's own options model), never restated, and listed in at most 4 KB (advanced options
grouped under `options`: server/mcp/rollout.py); RolloutArgs checks its arguments: every
surface accepts the same names (former ones too) and refuses bad ones with the same one line. Its
own argument `detail` says how much comes back: the rollout's summary (16 KB at most) or the whole
result, the data once either way (server/mcp/rollout.py). A failed rollout is a result with
`error`, never a protocol error; bad arguments and a full queue are tool errors. A client that goes
away cancels its call, and so its rollout, as on POST /rollout. A request the SDK would mishandle
is refused before it reaches the SDK (server/mcp/http.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import anyio
from mcp import types as mcp_types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.routing import Route, WebSocketRoute

from harness_env.core.capture.asgi import BodyTooLarge, Receive, Reply, Scope, Send, header, json_reply, read_body, send_reply
from harness_env.core.errors import HarnessEnvError
from harness_env.core.runner import resolve
from harness_env.models import DatasetTaskInfo, HarnessInfo, PhaseEvent, RolloutArgs, RolloutResult
from harness_env.server.mcp.http import MAX_RPC_BYTES, AsgiEndpoint, invalid_request, replay_body, unless_disconnected, unrepresentable
from harness_env.server.mcp.openenv import OpenEnvFace
from harness_env.server.mcp.rollout import (
    ArgumentsAsSent,
    RunRolloutAnswer,
    rollout_args,
    run_rollout_description,
    run_rollout_output_schema,
    run_rollout_tool_schema,
    tool_result,
)
from harness_env.server.service import RolloutService

PROGRESS_PHASES = ("endpoint", "start_wait", "sandbox", "setup", "agent", "verify", "collect")  # start_wait: behind --max-starting


class McpToolServer:
    """The MCP tools, built once, and the two transports that serve them (streamable HTTP for MCP
    clients, plain JSON-RPC and a WebSocket for OpenEnv's)."""

    def __init__(self, service: RolloutService) -> None:
        self.service = service
        # The app sits behind our own auth; the SDK's Host check would refuse Spaces and proxies.
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        # The SDK logs every malformed request as a large rich dump at WARNING: errors only.
        self.mcp = MCPServer("harness-env", log_level="ERROR")
        self._register()
        self.rpc_tools: dict[str, Any] = {}  # more tools' plain JSON-RPC calls (server/mcp/jobs.py): name -> async fn(arguments)
        # Our own session manager over the SDK's low-level server (stateless: replicas behind a load
        # balancer); bodies up to our own limit, which endpoint() has already enforced (the SDK's is 4 MiB).
        low = self.mcp._lowlevel_server
        self._sse = StreamableHTTPSessionManager(app=low, json_response=False, stateless=True, security_settings=security, max_request_body_size=MAX_RPC_BYTES)
        self.openenv = OpenEnvFace(self)

    # -- the tools (one implementation, used by both faces) ------------------------------------
    async def run_tool(self, args: RolloutArgs, progress=None) -> RolloutResult:
        try:
            request = await asyncio.to_thread(resolve, args, trusted=False)  # may read task directories from disk
        except HarnessEnvError as e:
            raise ToolError(str(e)) from None
        queue: asyncio.Queue[PhaseEvent | None] = asyncio.Queue()

        async def report() -> None:
            step = 0
            while (ev := await queue.get()) is not None:
                step += 1
                if progress is not None:
                    await progress(step, len(PROGRESS_PHASES) + 1, f"{ev.phase}: {ev.status}{' - ' + ev.detail if ev.detail else ''}")

        def on_event(ev: PhaseEvent) -> None:
            if (ev.status == "started" and ev.phase in PROGRESS_PHASES) or ev.phase == "done":
                queue.put_nowait(ev)

        reporter = asyncio.create_task(report())
        try:
            return await self.service.run(request, on_event=on_event)
        except HarnessEnvError as e:  # server busy
            raise ToolError(str(e)) from None
        finally:
            queue.put_nowait(None)
            with contextlib.suppress(TimeoutError):  # a slow progress channel must not hold the result back
                await asyncio.wait_for(reporter, 5)

    async def list_tasks_tool(self, dataset: str = "", split: str | None = None) -> list[DatasetTaskInfo]:
        try:  # reads task.toml and instruction.md of every task: off the event loop
            return await asyncio.to_thread(self.service.list_tasks, dataset, split or None)
        except HarnessEnvError as e:  # a path outside the tasks root, a missing dataset, a missing extra
            raise ToolError(str(e)) from None

    def _register(self) -> None:
        tools = self

        async def run_rollout(ctx: Context, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
            args = rollout_args(arguments)

            async def progress(step: int, total: int, message: str) -> None:
                # ValueError: called outside an MCP request (the OpenEnv face), no progress channel;
                # the others: the client went away, and its call is being cancelled.
                with contextlib.suppress(ValueError, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    await ctx.report_progress(step, total, message)

            result = await tools.run_tool(args, progress)
            return await asyncio.to_thread(tool_result, result, args.detail)  # a full result weighs megabytes: off the loop

        self.mcp.add_tool(run_rollout, name="run_rollout", description=run_rollout_description())
        tool = self.mcp._tool_manager.get_tool("run_rollout")
        tool.parameters = run_rollout_tool_schema()
        # The answer is built here (CallToolResult); its schema covers both details.
        tool.fn_metadata = tool.fn_metadata.model_copy(
            update={"arg_model": ArgumentsAsSent, "output_schema": run_rollout_output_schema(), "output_model": RunRolloutAnswer}
        )

        @self.mcp.tool(description="Harnesses this server can run: installed or not, versions, pinned versions, capabilities.")
        async def list_harnesses() -> list[HarnessInfo]:
            return tools.service.list_harnesses()

        @self.mcp.tool(
            description="Tasks of a dataset directory on the server, in task_index order (index, name, path, the instruction's "
            "first 500 characters, timeouts, whether it has a solution). `dataset` is relative to the server's tasks directory "
            "(empty: that directory itself); `split` names a subdirectory of it. Run one with run_rollout, naming the dataset "
            "and task_index in the harness options (see run_rollout)."
        )
        async def list_tasks(dataset: str = "", split: str = "") -> list[DatasetTaskInfo]:
            return await tools.list_tasks_tool(dataset, split)

        @self.mcp.tool(
            description="Endpoint shorthands (vllm, openai, hf_router): where their values come from and whether they are configured. Never shows keys."
        )
        async def catalog() -> list[dict]:
            return tools.service.catalog()

    # -- ASGI ---------------------------------------------------------------------------------
    async def endpoint(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            await self._sse.handle_request(scope, receive, send)
            return
        try:
            body = await read_body(receive, MAX_RPC_BYTES)
            msg = json.loads(body)
        except (BodyTooLarge, ValueError, RecursionError):  # over the limit; not JSON, not UTF-8; nested too deeply
            await send_reply(send, json_reply(400, {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "body is not JSON (or over 32 MB)"}}))
            return
        if "text/event-stream" not in (header(scope, b"accept") or ""):  # OpenEnv's plain JSON-RPC
            answer = await unless_disconnected(receive, self.openenv.rpc_all(msg))
            if answer is not None:
                await send_reply(send, json_reply(200, answer))
            return
        if not (isinstance(msg, dict) and msg.get("jsonrpc") == "2.0" and ("method" in msg or "result" in msg or "error" in msg)):
            await send_reply(send, json_reply(400, {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "expected one JSON-RPC 2.0 message"}}))
            return
        if "id" not in msg or "method" not in msg:
            # Notifications and responses change nothing on a stateless server: acknowledged
            # here, without spinning up an MCP transport for them.
            await send_reply(send, Reply(202, b""))
            return
        problem = invalid_request(msg)
        if problem:  # refused here, in one line (the SDK answers with a multi-kilobyte log dump)
            await send_reply(send, json_reply(400, {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": problem}}))
            return
        problem = unrepresentable(msg.get("params"), "params")
        if problem:  # the SDK would turn NaN into null silently, and fail on the rest without a word
            await send_reply(send, json_reply(200, {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32602, "message": problem}}))
            return
        await self._sse.handle_request(scope, replay_body(body, receive), send)

    @contextlib.asynccontextmanager
    async def lifespan(self):
        async with self._sse.run():
            yield

    def mount(self, app) -> None:
        # A Route, not a Mount: POST /mcp must not be redirected to /mcp/.
        app.router.routes.append(Route("/mcp", endpoint=AsgiEndpoint(self.endpoint), methods=["GET", "POST", "DELETE"]))
        app.router.routes.append(WebSocketRoute("/ws", self.openenv.websocket))


def build_mcp(service: RolloutService, jobs=None) -> McpToolServer:
    server = McpToolServer(service)
    if jobs is not None:
        from harness_env.server.mcp.jobs import register_job_tools  # the job store's modules only when there are jobs

        register_job_tools(server, jobs)
    return server
