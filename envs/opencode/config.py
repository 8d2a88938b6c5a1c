"""Pure builders for OpenCode's configuration, environment and command line.

The provider uses `@ai-sdk/openai-compatible` (bundled in OpenCode) pointed at the capture proxy
with the per-rollout session key. Everything is allowed inside the sandbox; tools that make no
sense there (web access, questions to a user who is not there, skills) are off. A caller's extra
config is deep-merged last.
"""

from __future__ import annotations

import json
from typing import Any

from harness_env.envs.common.config import deep_merge

PROVIDER = "harness-env"
DISABLED_TOOLS = ("webfetch", "websearch", "question", "skill")
# No network at start: no models.dev catalogue, no update check, no default plugins, no LSP
# download, no sharing. Set by this harness and by Harbor's OpenCode agent on our local sandbox
# (envs/harbor/agents.py).
OFFLINE_ENV: dict[str, str] = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
}


def opencode_json(*, proxy_base_url: str, session_key: str, model: str, max_tokens: int | None = None, extra: dict[str, Any] | None = None) -> str:
    model_entry: dict[str, Any] = {"name": model}
    if max_tokens:
        model_entry["limit"] = {"context": 131_072, "output": max_tokens}
    config: dict[str, Any] = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": PROVIDER,
                "options": {"baseURL": proxy_base_url, "apiKey": session_key},
                "models": {model: model_entry},
            }
        },
        "model": f"{PROVIDER}/{model}",
        "small_model": f"{PROVIDER}/{model}",
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny", "external_directory": "allow", "doom_loop": "allow"},
        "tools": {name: False for name in DISABLED_TOOLS},
        "autoupdate": False,
        "share": "disabled",
        "plugin": [],
    }
    return json.dumps(deep_merge(config, extra or {}), indent=2)


def opencode_env(config_path: str) -> dict[str, str]:
    return {"OPENCODE_CONFIG": config_path, **OFFLINE_ENV}


def opencode_argv(cmd: list[str], *, model: str) -> list[str]:
    """The command line, with no message: the instruction goes on stdin. `opencode run` joins its
    message arguments with spaces and wraps each one holding a space in double quotes (inner ones
    escaped), so an argument never reaches the model as written; stdin, read whole when it is not a
    terminal, is the message itself when no argument is given."""
    return [*cmd, "run", "--format", "json", "--pure", "--model", f"{PROVIDER}/{model}"]
