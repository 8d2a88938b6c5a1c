"""Pure builders for Pi's configuration files and command line.

Pi reads `models.json` and `settings.json` from `PI_CODING_AGENT_DIR`. The provider points at the
capture proxy with the per-rollout session key as its literal key (never an upstream key).
"""

from __future__ import annotations

import json
import shlex

PROVIDER = "harness-env"
DEFAULT_CONTEXT_WINDOW = 131_072
DEFAULT_MAX_TOKENS = 16_384
# What keeps Pi off the network at start (no update or version check, no telemetry): set by this
# harness and by Harbor's Pi agent on our local sandbox (envs/harbor/agents.py).
OFFLINE_ENV: dict[str, str] = {"PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0"}


def models_json(*, proxy_base_url: str, session_key: str, model: str, max_tokens: int | None = None) -> str:
    provider = {
        "baseUrl": proxy_base_url,
        "api": "openai-completions",
        "apiKey": session_key,
        "models": [
            {
                "id": model,
                "name": model,
                "reasoning": False,
                "input": ["text"],
                "contextWindow": DEFAULT_CONTEXT_WINDOW,
                "maxTokens": max_tokens or DEFAULT_MAX_TOKENS,
                "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                # `store` is an OpenAI-only field other engines reject.
                "compat": {"supportsStore": False},
            }
        ],
    }
    return json.dumps({"providers": {PROVIDER: provider}}, indent=2)


def settings_json() -> str:
    # One quick retry: transient upstream errors recover, a dead endpoint fails fast.
    return json.dumps({"retry": {"enabled": True, "maxRetries": 1, "baseDelayMs": 500}, "enableInstallTelemetry": False}, indent=2)


def pi_env(agent_dir: str) -> dict[str, str]:
    return {"PI_CODING_AGENT_DIR": agent_dir, **OFFLINE_ENV}


def pi_stdin(instruction: str) -> str | None:
    """What goes on stdin: the instruction, when as an argument it would name a file to attach
    (Pi reads "@x" so, even after "--"); stdin is read exactly but for its ends (Pi strips them)."""
    return instruction if instruction.startswith("@") else None


def pi_argv(pi_cmd: list[str], *, model: str, instruction: str) -> list[str]:
    """The command line: JSON event stream, no session file, nothing discovered from disk. After
    "--" a prompt starting with "-" stays the prompt, as written."""
    prompt = [] if pi_stdin(instruction) is not None else ["--", instruction]
    return [
        *pi_cmd,
        "--print",
        "--mode",
        "json",
        "--no-session",
        "--offline",
        "--no-context-files",
        "--no-extensions",
        "--no-skills",
        "--no-prompt-templates",
        "--no-themes",
        "--provider",
        PROVIDER,
        "--model",
        model,
        *prompt,
    ]


def shell_line(argv: list[str]) -> str:
    """The same command as one shell-quoted line (for logs and for shells)."""
    return shlex.join(argv)
