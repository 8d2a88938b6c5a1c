"""The MCP tools `run_rollout`, `list_harnesses`, `list_tasks`, `catalog` (and the jobs' `submit_rollout`,
`get_rollout`, from server/mcp_jobs.py) at /mcp, for two kinds of
client: MCP clients (the official SDK and others) over streamable HTTP, stateless so that replicas
can sit behind a load balancer, with progress notifications per phase when asked for; and
OpenEnv's MCPToolClient, which posts plain JSON-RPC without the MCP handshake (`Accept: */*`:
`openenv/session/create`, then `tools/list` / `tools/call` with a `session_id`, reading
`result.data`) and holds a WebSocket at /ws (older releases send their calls over it as `step`
messages). Sessions there are names only: nothing is kept.

`run_rollout`'s input schema and description are derived from the option fields (RolloutArgs and
each harness's own options model), never restated, and RolloutArgs checks its arguments: every
surface accepts the same names (former ones too) and refuses bad ones with the same one line. Its
own argument `detail` says how much comes back: the rollout's summary (16 KB at most) or the whole
result, the data once either way (server/mcp_rollout.py). A failed rollout is a result with
`error`, never a protocol error; bad arguments and a full queue are tool errors. A client that goes
away cancels its call, and so its rollout, as on POST /rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
import uuid
from typing import Any

import anyio
from mcp import types as mcp_types
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import ValidationError
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from harness_env.core.capture.asgi import (
    BodyTooLarge,
    Receive,
    Reply,
    Scope,
    Send,
    header,
    json_reply,
    read_body,
    send_reply,
)
from harness_env.core.errors import HarnessEnvError
from harness_env.models import (
    HARNESS_OPTIONS,
    LEGACY_OPTION_KEYS,
    MAX_NESTING,
    MAX_SUMMARY_BYTES,
    SURROGATE,
    DatasetTaskInfo,
    HarnessInfo,
    PhaseEvent,
    RolloutArgs,
    RolloutOptions,
    RolloutResult,
    harness_options_models,
)
from harness_env.server.mcp_rollout import (
    ArgumentsAsSent,
    RunRolloutAnswer,
    RunRolloutArgs,
    answer_data,
    listing_text,
    rollout_args,
    rpc_result,
    run_rollout_output_schema,
    tool_result,
)
from harness_env.server.service import RolloutService

MAX_RPC_BYTES = 32 * 1024 * 1024
TOOL_NAMES = ("run_rollout", "list_harnesses", "list_tasks", "catalog")
PROGRESS_PHASES = ("endpoint", "start_wait", "sandbox", "setup", "agent", "verify", "collect")  # start_wait: behind --max-starting
RUN_ROLLOUT_SUMMARY = (
    "Run one rollout of a coding-agent harness on a task; returns its summary (reward, error, reward notes, phases, the "
    f"agent's final text, counts of model calls, tokens and tool calls, files changed; at most {MAX_SUMMARY_BYTES // 1024} KB), "
    "or with detail='full' the whole RolloutResult (captured turns with token ids and logprobs, file contents, logs). "
    "A failed rollout is a result with `error`. Each argument's meaning and default are in the input schema; endpoint "
    "(a catalog shorthand) or base_url + model name the policy."
)


def run_rollout_description() -> str:
    """What the tool does, the task family option, and each harness's own options (its options
    model's docstring)."""
    fields = RolloutOptions.model_fields
    parts = [RUN_ROLLOUT_SUMMARY, f"task_family: {fields['task_family'].description}; family_options: {fields['family_options'].description}."]
    for name, model in harness_options_models().items():
        key = HARNESS_OPTIONS + (f" (or {name})" if name in LEGACY_OPTION_KEYS else "")
        parts.append(f"harness={name!r} takes its own options in {key}: {' '.join(inspect.cleandoc(model.__doc__ or '').split())}")
    return " ".join(parts)


def run_rollout_schema() -> dict[str, Any]:
    """RunRolloutArgs' fields (description, default, bounds), harness_options being one of the
    harnesses' own options models (also under their former keys)."""
    schema = RunRolloutArgs.model_json_schema()
    defs, props, refs = schema.setdefault("$defs", {}), schema["properties"], []
    for name, model in harness_options_models().items():
        sub = model.model_json_schema()
        defs.update(sub.pop("$defs", {}))
        defs[model.__name__] = sub
        refs.append({"$ref": f"#/$defs/{model.__name__}"})
        if name in LEGACY_OPTION_KEYS:
            props[name] = {**refs[-1], "description": f"the former name of {HARNESS_OPTIONS}, for harness={name!r}"}
    props[HARNESS_OPTIONS] = {k: v for k, v in props[HARNESS_OPTIONS].items() if k != "anyOf"} | {"anyOf": [*refs, {"type": "null"}]}
    return schema


class McpToolServer:
    """The MCP tools, built once, and the two transports that serve them (streamable HTTP for MCP
    clients, plain JSON-RPC and a WebSocket for OpenEnv's)."""

    def __init__(self, service: RolloutService) -> None:
        self.service = service
        # The app sits behind our own auth; the SDK's Host check would refuse Spaces and proxies.
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        # The SDK logs every malformed request as a large rich dump at WARNING: errors only.
        self.mcp = FastMCP("harness-env", stateless_http=True, transport_security=security, log_level="ERROR")
        self._register()
        self.rpc_tools: dict[str, Any] = {}  # more tools' plain JSON-RPC calls (server/mcp_jobs.py): name -> async fn(arguments)
        low = self.mcp._mcp_server
        self._sse = StreamableHTTPSessionManager(app=low, json_response=False, stateless=True, security_settings=security)

    # -- the tools (one implementation, used by both faces) ------------------------------------
    async def run_tool(self, args: RolloutArgs, progress=None) -> RolloutResult:
        try:
            request = await asyncio.to_thread(self.service.resolve, args)  # may read task directories from disk
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
        tool.parameters = run_rollout_schema()
        # The answer is built here (CallToolResult); its schema covers both details.
        tool.fn_metadata = tool.fn_metadata.model_copy(
            update={"arg_model": ArgumentsAsSent, "output_schema": run_rollout_output_schema(), "output_model": RunRolloutAnswer})

        @self.mcp.tool(description="Harnesses this server can run: installed or not, versions, pinned versions, capabilities.")
        async def list_harnesses() -> list[HarnessInfo]:
            return tools.service.list_harnesses()

        @self.mcp.tool(description="Tasks of a dataset directory on the server, in task_index order (index, name, path, the instruction's "
                       "first 500 characters, timeouts, whether it has a solution). `dataset` is relative to the server's tasks directory "
                       "(empty: that directory itself); `split` names a subdirectory of it. Run one with run_rollout, naming the dataset "
                       "and task_index in the harness options (see run_rollout).")
        async def list_tasks(dataset: str = "", split: str = "") -> list[DatasetTaskInfo]:
            return await tools.list_tasks_tool(dataset, split)

        @self.mcp.tool(description="Endpoint shorthands (vllm, openai, hf_router): where their values come from and whether they are "
                       "configured. Never shows keys.")
        async def catalog() -> list[dict]:
            return tools.service.catalog()

    # -- OpenEnv's plain JSON-RPC ------------------------------------------------------------
    async def _call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """tools/call for OpenEnv clients: the data once (in `data`, where they read it) and a
        short text."""
        if name in self.rpc_tools:
            return await self.rpc_tools[name](arguments)
        if name == "run_rollout":
            args = rollout_args(arguments)
            result = await self.run_tool(args)
            return rpc_result(*await asyncio.to_thread(answer_data, result, args.detail))
        data: Any
        if name == "list_harnesses":
            data = [h.model_dump(mode="json") for h in self.service.list_harnesses()]
        elif name == "list_tasks":
            dataset, split = _list_tasks_arguments(arguments)
            data = [t.model_dump(mode="json") for t in await self.list_tasks_tool(dataset, split)]
        elif name == "catalog":
            data = self.service.catalog()
        else:
            raise ToolError(f"unknown tool {name!r}; tools: {', '.join((*TOOL_NAMES, *self.rpc_tools))}")
        return rpc_result(data, listing_text(name, data))

    async def _tools(self) -> list[dict[str, Any]]:
        return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in await self.mcp.list_tools()]

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
                result = {"tools": await self._tools()}
            elif method == "tools/call":
                name, arguments = params.get("name"), params.get("arguments") or {}
                if not isinstance(name, str) or not isinstance(arguments, dict):
                    raise ToolError("tools/call needs params.name (string) and params.arguments (object)")
                result = await self._call(name, arguments)
            elif method == "ping":
                result = {}
            else:
                return {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": (
                    f"method {method!r} not found; this endpoint serves MCP over streamable HTTP (send Accept: application/json, "
                    "text/event-stream) and OpenEnv's openenv/session/create, tools/list, tools/call")}}
        except ToolError as e:
            return {"jsonrpc": "2.0", "id": rid, "error": {"code": -32000, "message": str(e)}}
        return {"jsonrpc": "2.0", "id": rid, "result": result}

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
            answer = await _unless_disconnected(receive, self._rpc_all(msg))
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
        problem = _invalid_request(msg)
        if problem:  # refused here, in one line (the SDK answers with a multi-kilobyte log dump)
            await send_reply(send, json_reply(400, {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": problem}}))
            return
        problem = _unrepresentable(msg.get("params"), "params")
        if problem:  # the SDK would turn NaN into null silently, and fail on the rest without a word
            await send_reply(send, json_reply(200, {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32602, "message": problem}}))
            return
        await self._sse.handle_request(scope, _replay(body, receive), send)

    async def _rpc_all(self, msg: Any) -> Any:
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
                            await _cancel(step)
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
            obs: dict[str, Any] = {"tools": await self._tools()}
        elif data.get("type") == "call_tool":
            name = data.get("tool_name", "")
            try:
                out = await self._call(name, data.get("arguments") or {})
                obs = {"tool_name": name, "result": {"data": out["data"]}, "error": None}
            except ToolError as e:
                obs = {"tool_name": name, "result": None, "error": {"error_type": "execution_error", "message": str(e)}}
        else:
            return {"type": "error", "data": {"message": f"unknown step {data.get('type')!r}", "code": "bad_step"}}
        return {"type": "observation", "data": {"observation": obs, "reward": None, "done": False}}

    @contextlib.asynccontextmanager
    async def lifespan(self):
        async with self._sse.run():
            yield

    def mount(self, app) -> None:
        # A Route, not a Mount: POST /mcp must not be redirected to /mcp/.
        app.router.routes.append(Route("/mcp", endpoint=_AsgiEndpoint(self.endpoint), methods=["GET", "POST", "DELETE"]))
        app.router.routes.append(WebSocketRoute("/ws", self.websocket))


def _list_tasks_arguments(arguments: dict[str, Any]) -> tuple[str, str | None]:
    """list_tasks' arguments from a plain JSON-RPC call, checked as the MCP SDK checks them."""
    unknown = sorted(set(arguments) - {"dataset", "split"})
    if unknown:
        raise ToolError(f"list_tasks takes dataset and split, not {', '.join(unknown)}")
    dataset, split = arguments.get("dataset") or "", arguments.get("split") or None
    if not isinstance(dataset, str) or not (split is None or isinstance(split, str)):
        raise ToolError("list_tasks: dataset and split must be strings")
    return dataset, split


def _invalid_request(msg: dict[str, Any]) -> str | None:
    """Why `msg` is not a well-formed MCP client request, or None."""
    try:
        mcp_types.JSONRPCRequest.model_validate(msg, strict=True)
    except ValidationError as e:
        return f"not a valid JSON-RPC request: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}"
    return None


async def _cancel(task: asyncio.Task) -> None:
    """Cancel `task` and wait until its clean-up has run."""
    task.cancel()
    await asyncio.wait({task})


async def _unless_disconnected(receive: Receive, work) -> Any:
    """Run `work` (after the request body was read) while watching the connection: a client that
    goes away cancels it (None). The plain JSON-RPC face has no SDK doing this for it."""
    async def until_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    task = asyncio.create_task(work)
    watcher = asyncio.create_task(until_disconnect())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            await _cancel(task)
        watcher.cancel()
    return task.result() if not task.cancelled() else None


def _unrepresentable(value: Any, where: str) -> str | None:
    """Why a parsed request value cannot reach a tool as sent, naming where: a number JSON cannot
    carry (NaN, Infinity, 1e400), a lone surrogate, or lists/objects nested deeper than tool
    arguments may be (models.MAX_NESTING inside params.arguments.<name>). None when fine."""
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        v, at, depth = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return f"{at} is not a finite number (NaN, Infinity and numbers like 1e400 are not JSON numbers)"
        if isinstance(v, str) and not v.isascii() and SURROGATE.search(v):
            return f"{at} contains a lone surrogate; send valid Unicode text"
        if isinstance(v, (dict, list)):
            if depth >= MAX_NESTING + 2:  # params.arguments.<name> is at depth 2
                return f"{at} is nested more than {MAX_NESTING} levels deep; flatten it"
            for k, item in (v.items() if isinstance(v, dict) else enumerate(v)):
                if isinstance(k, str) and not k.isascii() and SURROGATE.search(k):
                    return f"a key in {at} contains a lone surrogate; send valid Unicode text"
                name = k[:40] if isinstance(k, str) else str(k)
                stack.append((item, f"{at}.{name}" if depth < 4 else at, depth + 1))
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive() that hands over a body already read, then passes the client's own messages on
    (the SDK watches for http.disconnect, which cancels the tool call and so the rollout)."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


class _AsgiEndpoint:
    """Starlette treats a non-function endpoint as a raw ASGI app."""

    def __init__(self, handler) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handler(scope, receive, send)


def build_mcp(service: RolloutService, jobs=None) -> McpToolServer:
    server = McpToolServer(service)
    if jobs is not None:
        from harness_env.server.mcp_jobs import register_job_tools  # it imports this module

        register_job_tools(server, jobs)
    return server
