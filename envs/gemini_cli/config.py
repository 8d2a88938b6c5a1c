"""Pure builders for Gemini CLI's environment, `~/.gemini/settings.json` and command line.

Gemini CLI speaks only Google's Gemini API: `GOOGLE_GEMINI_BASE_URL` points it at the capture
proxy's root (the Gemini dialect, core/capture/dialects/gemini.py; the client adds
`/v1beta/models/...` itself, and takes plain HTTP only for a loopback host, which the sandbox's
view of the proxy is) and `GEMINI_API_KEY` holds the per-rollout session key (sent as
`x-goog-api-key`; never an upstream key), with the API-key auth type selected in settings.json.
Everything that would leave the machine is off: auto-update and its notices, usage statistics,
telemetry, ripgrep (it would be downloaded), the web tools; the workspace is trusted for the run
(`--skip-trust`); it runs in one Node process (no relaunch with a larger heap) and its shell
commands without a PTY.
"""

from __future__ import annotations

import json
from typing import Any

from harness_env.envs.common.config import deep_merge, keep_listed, proxy_root

KEY_ENV = "GEMINI_API_KEY"  # sent as x-goog-api-key: the capture session's key
OFFLINE_ENV: dict[str, str] = {"GEMINI_TELEMETRY_ENABLED": "false", "GEMINI_CLI_TRUST_WORKSPACE": "true", "GEMINI_CLI_NO_RELAUNCH": "true"}
DENIED_TOOLS = ("web_fetch", "google_web_search")
SETTINGS: dict[str, Any] = {
    "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False, "maxAttempts": 2, "checkpointing": {"enabled": False}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "tools": {"exclude": list(DENIED_TOOLS), "useRipgrep": False, "shell": {"enableInteractiveShell": False}},
}


def model_in_path(model: str) -> str:
    """The model as Gemini CLI puts it in the URL path (`models/<model>:...`): without slashes,
    which a path segment cannot hold (the proxy sends the session's own model to the engine)."""
    return model.replace("/", "--")


def settings_dict(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """settings.json, a caller's settings (harness_config) deep-merged last; a caller's
    `tools.exclude` adds to ours (excluding a tool also takes it out of the prompt)."""
    return keep_listed(deep_merge(SETTINGS, extra or {}), ("tools", "exclude"), DENIED_TOOLS)


def settings_json(extra: dict[str, Any] | None = None) -> str:
    return json.dumps(settings_dict(extra), indent=2)


def gemini_env(*, proxy_base_url: str, session_key: str, cli_home: str) -> dict[str, str]:
    return {"GOOGLE_GEMINI_BASE_URL": proxy_root(proxy_base_url), KEY_ENV: session_key, "GEMINI_CLI_HOME": cli_home, **OFFLINE_ENV}


def gemini_argv(cmd: list[str], *, model: str, instruction: str) -> list[str]:
    """Headless: the prompt as `--prompt`'s value, joined to it by "=" (given as the next argument,
    a prompt starting with "-" was read as flags and the CLI exited with its usage), JSON events,
    every tool call approved (our sandbox holds it)."""
    return [*cmd, f"--prompt={instruction}", "--output-format", "stream-json", "--yolo", "--skip-trust", "--model", model_in_path(model)]
