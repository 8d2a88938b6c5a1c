"""Drive a harness-env server with OpenEnv's MCPToolClient (run in OpenEnv's venv: tests/openenv_env.py).

stdin: {"base_url", "message_timeout_s", "style": "async_with" | "plain" | "sync", "steps": [step, ...]}, a step
being {"list_tools": true} or {"call": tool name, "arguments": {...}}. stdout: one JSON line, {"results": [...]},
per step {"tools": [names]}, {"data": what call_tool returned} or {"error": {"type", "message"}} (what it raised).
"""

import asyncio
import json
import sys

from openenv.core.mcp_client import MCPToolClient


def _error(e: Exception) -> dict:
    return {"error": {"type": type(e).__name__, "message": str(e)}}


async def _step_async(env, step: dict) -> dict:
    try:
        if step.get("list_tools"):
            return {"tools": [t.name for t in await env.list_tools()]}
        return {"data": await env.call_tool(step["call"], **step.get("arguments", {}))}
    except Exception as e:  # the client's own failure is the answer under test
        return _error(e)


def _step_sync(env, step: dict) -> dict:
    try:
        if step.get("list_tools"):
            return {"tools": [t.name for t in env.list_tools()]}
        return {"data": env.call_tool(step["call"], **step.get("arguments", {}))}
    except Exception as e:
        return _error(e)


async def _run_async(spec: dict, client: MCPToolClient) -> list[dict]:
    if spec["style"] == "async_with":  # opens /ws too
        async with client as env:
            return [await _step_async(env, s) for s in spec["steps"]]
    try:  # without `async with`: every call over plain JSON-RPC
        return [await _step_async(client, s) for s in spec["steps"]]
    finally:
        await client.close()


def main() -> None:
    spec = json.load(sys.stdin)
    client = MCPToolClient(base_url=spec["base_url"], message_timeout_s=spec.get("message_timeout_s", 300))
    if spec["style"] == "sync":
        with client.sync() as env:
            results = [_step_sync(env, s) for s in spec["steps"]]
    else:
        results = asyncio.run(_run_async(spec, client))
    print(json.dumps({"results": results}))


if __name__ == "__main__":
    main()
