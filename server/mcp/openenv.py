"""OpenEnv's face of the MCP tools (server/mcp/tools.py): OpenEnv's MCPToolClient posts plain
JSON-RPC to /mcp without the MCP handshake (`Accept: */*`: `openenv/session/create`, then
`tools/list` / `tools/call` with a `session_id`, reading `result.data`) and holds a WebSocket at
/ws (older releases send their calls over it as `step` messages). Sessions are names only: nothing
is kept. The tools are the same ones the MCP face serves; each answer carries the data once, in
`data`, where OpenEnv reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from typing import TYPE_CHECKING, Any

from mcp.server.mcpserver.exceptions import ToolError
from starlette.websockets import WebSocket, WebSocketDisconnect

from harness_env.server.mcp.http import cancel_and_wait
from harness_env.server.mcp.rollout import answer_data, listing_text, rollout_args, rpc_result

if TYPE_CHECKING:
    from harness_env.server.mcp.tools import McpToolServer

TOOL_NAMES = ("run_rollout", "list_harnesses", "list_tasks", "catalog")  # the jobs' tools come through rpc_tools


class OpenEnvFace:
    """Plain JSON-RPC calls and the /ws socket, answered by `tools`' own implementations."""

    def __init__(self, tools: McpToolServer) -> None:
        self.tools = tools

    async def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """tools/call for OpenEnv clients: the data once (in `data`, where they read it) and a
        short text."""
        if name in self.tools.rpc_tools:
            return await self.tools.rpc_tools[name](arguments)
        if name == "run_rollout":
            args = rollout_args(arguments)
            result = await self.tools.run_tool(args)
            return rpc_result(*await asyncio.to_thread(answer_data, result, args.detail))
        data: Any
        if name == "list_harnesses":
            data = [h.model_dump(mode="json") for h in self.tools.service.list_harnesses()]
        elif name == "list_tasks":
            dataset, split = _list_tasks_arguments(arguments)
            data = [t.model_dump(mode="json") for t in await self.tools.list_tasks_tool(dataset, split)]
        elif name == "catalog":
            data = self.tools.service.catalog()
        else:
            raise ToolError(f"unknown tool {name!r}; tools: {', '.join((*TOOL_NAMES, *self.tools.rpc_tools))}")
        return rpc_result(data, listing_text(name, data))

    async def list_tools(self) -> list[dict[str, Any]]:
        return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in await self.tools.mcp.list_tools()]

    async def rpc(self, msg: Any) -> dict[str, Any]:
        """One JSON-RPC message from a client that does not speak the MCP transport."""
        if not isinstance(msg, dict):
            return {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "a JSON-RPC request object is expected"}}
        rid, method = msg.get("id"), msg.get("method")
        params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
        try:
            if method == "openenv/session/create":
                result: Any = {"session_id": uuid.uuid4().hex}
            elif method == "openenv/session/close":
                result = {"closed": True}
            elif method == "tools/list":
                result = {"tools": await self.list_tools()}
            elif method == "tools/call":
                name, arguments = params.get("name"), params.get("arguments") or {}
                if not isinstance(name, str) or not isinstance(arguments, dict):
                    raise ToolError("tools/call needs params.name (string) and params.arguments (object)")
                result = await self.call(name, arguments)
            elif method == "ping":
                result = {}
            else:
                return {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "error": {
                        "code": -32601,
                        "message": (
                            f"method {method!r} not found; this endpoint serves MCP over streamable HTTP (send Accept: application/json, "
                            "text/event-stream) and OpenEnv's openenv/session/create, tools/list, tools/call"
                        ),
                    },
                }
        except ToolError as e:
            return {"jsonrpc": "2.0", "id": rid, "error": {"code": -32000, "message": str(e)}}
        return {"jsonrpc": "2.0", "id": rid, "result": result}

    async def rpc_all(self, msg: Any) -> Any:
        if isinstance(msg, list):  # a batch, one call after another
            return [await self.rpc(m) for m in msg]
        return await self.rpc(msg)

    async def websocket(self, ws: WebSocket) -> None:
        """OpenEnv's session socket: held open by newer clients, used for calls by older ones."""
        await ws.accept()
        incoming: asyncio.Task | None = None  # the next message, read while a step runs
        try:
            while True:
                incoming = incoming or asyncio.create_task(ws.receive())
                message = await incoming
                incoming = None
                if message["type"] == "websocket.disconnect":
                    break
                msg = json.loads(message.get("text") or message.get("bytes") or "")
                kind = msg.get("type") if isinstance(msg, dict) else None
                if kind == "close":
                    break
                if kind == "step":
                    step = asyncio.create_task(self._ws_step(msg.get("data") or {}))
                    try:
                        incoming = asyncio.create_task(ws.receive())
                        await asyncio.wait({step, incoming}, return_when=asyncio.FIRST_COMPLETED)
                        if not step.done() and incoming.result()["type"] == "websocket.disconnect":
                            break  # the client went away mid-call: its rollout is cancelled below
                        await ws.send_json(await step)  # a message sent meanwhile is handled next
                    finally:
                        if not step.done():
                            await cancel_and_wait(step)
                elif kind == "reset":
                    await ws.send_json({"type": "observation", "data": {"observation": {}, "reward": None, "done": False}})
                elif kind == "state":
                    await ws.send_json({"type": "state", "data": {}})
                else:
                    await ws.send_json({"type": "error", "data": {"message": f"unknown message type {kind!r}", "code": "bad_message"}})
        except (WebSocketDisconnect, ValueError, RuntimeError):  # ValueError: not JSON
            pass
        finally:
            if incoming is not None:
                incoming.cancel()
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):  # already closed, or the client is gone
                await ws.close()

    async def _ws_step(self, data: dict[str, Any]) -> dict[str, Any]:
        if data.get("type") == "list_tools":
            obs: dict[str, Any] = {"tools": await self.list_tools()}
        elif data.get("type") == "call_tool":
            name = data.get("tool_name", "")
            try:
                out = await self.call(name, data.get("arguments") or {})
                obs = {"tool_name": name, "result": {"data": out["data"]}, "error": None}
            except ToolError as e:
                obs = {"tool_name": name, "result": None, "error": {"error_type": "execution_error", "message": str(e)}}
        else:
            return {"type": "error", "data": {"message": f"unknown step {data.get('type')!r}", "code": "bad_step"}}
        return {"type": "observation", "data": {"observation": obs, "reward": None, "done": False}}


def _list_tasks_arguments(arguments: dict[str, Any]) -> tuple[str, str | None]:
    """list_tasks' arguments from a plain JSON-RPC call, checked as the MCP SDK checks them."""
    unknown = sorted(set(arguments) - {"dataset", "split"})
    if unknown:
        raise ToolError(f"list_tasks takes dataset and split, not {', '.join(unknown)}")
    dataset, split = arguments.get("dataset") or "", arguments.get("split") or None
    if not isinstance(dataset, str) or not (split is None or isinstance(split, str)):
        raise ToolError("list_tasks: dataset and split must be strings")
    return dataset, split
