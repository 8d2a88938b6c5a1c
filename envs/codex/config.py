"""Pure builders for Codex's `CODEX_HOME/config.toml`, environment and command line.

Codex speaks only the OpenAI Responses API: a custom `model_providers` entry points it at the
capture proxy's `/responses` (the Responses dialect, core/capture/dialects/responses.py), its key
read from the variable `env_key` names (the per-rollout session key, never an upstream key).
`OPENAI_BASE_URL` is not used (Codex ignores it for requests and then reaches for the real host) and
neither is the built-in provider (it tries WebSocket upgrades first). Everything that would leave
the machine at start or after the run is off: update checks, analytics, feedback, OpenTelemetry,
web search, plugins and apps; nothing is remembered between runs (`--ephemeral`, no history).
"""

from __future__ import annotations

import json
import re
from typing import Any

from harness_env.envs.common.config import deep_merge

PROVIDER = "harness-env"
KEY_ENV = "HARNESS_ENV_API_KEY"  # the variable Codex reads the capture session's key from
# One quick retry: transient upstream errors recover, a dead endpoint fails fast.
MAX_RETRIES = 1
# What keeps Codex off the network and alone in its sandbox, whatever the provider: the settings
# of config.toml (also given as `-c key=value` overrides by `offline_overrides`).
OFFLINE_SETTINGS: dict[str, Any] = {
    "check_for_update_on_startup": False,
    "web_search": "disabled",
    "project_doc_max_bytes": 0,  # no AGENTS.md from the workspace: the task's instruction is the prompt
    "cli_auth_credentials_store": "file",  # no keyring
    "features": {"plugins": False, "apps": False, "goals": False, "shell_snapshot": False},
    "agents": {"enabled": False},  # no sub-agents
    "analytics": {"enabled": False},
    "feedback": {"enabled": False},
    "history": {"persistence": "none"},
    "otel": {"exporter": "none", "log_user_prompt": False},
}
# Codex has no environment switch for any of these (its config does it all): nothing to set here,
# unlike Pi's and OpenCode's OFFLINE_ENV.
OFFLINE_ENV: dict[str, str] = {}

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def to_toml(config: dict[str, Any], _prefix: str = "") -> str:
    """A small TOML writer for what config.toml needs: scalars, lists and nested tables."""
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in config.items() if not isinstance(v, dict)]
    out = "\n".join(lines) + ("\n" if lines else "")
    for k, v in config.items():
        if isinstance(v, dict):
            name = f"{_prefix}.{_toml_key(k)}" if _prefix else _toml_key(k)
            tables_only = v and all(isinstance(x, dict) for x in v.values())  # no header of its own needed
            out += ("" if tables_only else f"\n[{name}]\n") + to_toml(v, name)
    return out


def config_dict(*, proxy_base_url: str, model: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.toml as a dict: the proxy as the only provider, no approvals, no sandbox of Codex's own
    (it runs in ours), offline."""
    config: dict[str, Any] = {
        "model": model,
        "model_provider": PROVIDER,
        "approval_policy": "never",
        "sandbox_mode": "danger-full-access",
        **OFFLINE_SETTINGS,
        "model_providers": {
            PROVIDER: {
                "name": PROVIDER,
                "base_url": proxy_base_url,
                "env_key": KEY_ENV,
                "wire_api": "responses",
                "request_max_retries": MAX_RETRIES,
                "stream_max_retries": MAX_RETRIES,
                "supports_websockets": False,
            }
        },
    }
    return deep_merge(config, extra or {})  # a caller's settings (harness_config), last


def config_toml(*, proxy_base_url: str, model: str, extra: dict[str, Any] | None = None) -> str:
    return to_toml(config_dict(proxy_base_url=proxy_base_url, model=model, extra=extra))


def offline_overrides() -> list[str]:
    """OFFLINE_SETTINGS as `-c key=value` arguments, for a Codex whose config.toml is not ours."""
    out: list[str] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            out.extend(["-c", f"{prefix}={_toml_value(value)}"])

    walk("", OFFLINE_SETTINGS)
    return out


def codex_env(codex_home: str, session_key: str) -> dict[str, str]:
    return {"CODEX_HOME": codex_home, KEY_ENV: session_key, **OFFLINE_ENV}


def codex_argv(cmd: list[str], *, instruction: str) -> list[str]:
    """The command line: JSONL events, no git check, no approvals or sandbox of its own (ours holds
    it), nothing persisted. `--` ends the options, so a prompt starting with "-" (or named like a
    subcommand) stays the prompt; a lone "-" would mean "read stdin", so it gets a space."""
    prompt = " -" if instruction == "-" else instruction
    return [*cmd, "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--ephemeral", "--color", "never", "--", prompt]
