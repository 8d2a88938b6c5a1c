"""Pure builders for Claude Code's environment, `~/.claude/settings.json` and command line.

Claude Code speaks only the Anthropic Messages API: `ANTHROPIC_BASE_URL` points it at the capture
proxy (the Messages dialect, core/capture/dialects/messages.py, below the proxy's root: the client
adds `/v1/messages` itself) and `ANTHROPIC_API_KEY` holds the per-rollout session key (sent as
`x-api-key`; never an upstream key). Everything that would leave the machine is off: nonessential
traffic (release notes, model capabilities, the connectivity probe), auto-update, telemetry and
error reporting; WebFetch and WebSearch are denied (no network in the sandbox, and WebSearch is a
tool Anthropic's servers run). It refuses `--dangerously-skip-permissions` as root unless
`IS_SANDBOX=1` says it is sandboxed, which it is: in ours (under bubblewrap as an unprivileged
user, in the plain sandbox as whoever runs the server).
"""

from __future__ import annotations

import json
from typing import Any

from harness_env.envs.common.config import deep_merge, keep_listed, proxy_root

KEY_ENV = "ANTHROPIC_API_KEY"  # sent as x-api-key: the capture session's key
# What keeps Claude Code off the network and quiet, whatever the endpoint.
OFFLINE_ENV: dict[str, str] = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
}
# How it talks to the proxy: every tool's schema in the request (no deferred tools and tool
# search, which need Anthropic's server-side tool references), one quick retry (a dead endpoint
# fails fast, as for the other harnesses), and the bypass flag allowed (it runs in our sandbox).
WIRE_ENV: dict[str, str] = {"ENABLE_TOOL_SEARCH": "false", "CLAUDE_CODE_MAX_RETRIES": "1", "IS_SANDBOX": "1"}
DENIED_TOOLS = ("WebFetch", "WebSearch")


def settings_dict(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """settings.json: the network tools denied; a caller's settings (harness_config) deep-merged
    last (e.g. `{"env": {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096"}}`). A caller's deny list adds to
    ours (a merged list would replace it): denying a tool also takes it out of the prompt, e.g.
    `{"permissions": {"deny": ["Agent", "Monitor"]}}` for a shorter one."""
    return keep_listed(deep_merge({"permissions": {"deny": list(DENIED_TOOLS)}}, extra or {}), ("permissions", "deny"), DENIED_TOOLS)


def settings_json(extra: dict[str, Any] | None = None) -> str:
    return json.dumps(settings_dict(extra), indent=2)


def claude_env(*, proxy_base_url: str, session_key: str, config_dir: str, agent_timeout_s: float) -> dict[str, str]:
    """`API_TIMEOUT_MS` is the rollout's own time: Claude Code gives up on a call after 600 s by
    default and sends it again, and a slow engine's first prefill of its ~20k-token prompt can take
    longer (the engine then computes it twice)."""
    return {
        "ANTHROPIC_BASE_URL": proxy_root(proxy_base_url),
        KEY_ENV: session_key,
        "CLAUDE_CONFIG_DIR": config_dir,
        "API_TIMEOUT_MS": str(max(1, round(agent_timeout_s * 1000))),
        **OFFLINE_ENV,
        **WIRE_ENV,
    }


def claude_argv(cmd: list[str], *, model: str, instruction: str) -> list[str]:
    """The command line: print mode with JSON events, no permission prompts (our sandbox holds it),
    nothing persisted, no MCP servers but those given. `--` ends the options, so a prompt starting
    with "-" stays the prompt."""
    return [
        *cmd,
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--model",
        model,
        "--dangerously-skip-permissions",
        "--no-session-persistence",
        "--strict-mcp-config",
        "--",
        instruction,
    ]
