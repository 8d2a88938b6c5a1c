"""Pure builders for Harbor's trial configuration (harbor.models.trial.config, Harbor 0.26).

The agent is Harbor's own, pointed at our capture proxy through Harbor's custom-endpoint options:
`base_url` = the proxy, `model_api_format` = the wire format the agent speaks among those the
proxy serves (OpenAI chat completions, or the Responses, Anthropic Messages and Gemini dialects),
and `model_api_key_name` naming a variable that holds the per-rollout capture key (Harbor hands the
agent the variable, and redacts it in the trial's config.json). The model is `harness-env/<model>`:
a provider name no agent knows, so each writes a custom-provider config for the endpoint
(OpenCode's built-in "openai" provider would speak the Responses API instead). Gemini CLI takes
only its own provider (`gemini/<model>`, slashes out of the model: it goes in a URL path).

Codex gets our own provider entry as its native `config` (envs/codex/config.py: base_url = the
proxy, wire_api responses, no WebSocket, telemetry off), so it never falls back to its built-in
provider; Claude Code gets our settings (the web tools denied) as its native `config`.

The environment is ours (`local`: bubblewrap, agents preinstalled) or one of Harbor's providers,
passed through by name with its own options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness_env.core import toolchain
from harness_env.core.errors import InvalidRequestError
from harness_env.envs.harbor.options import HarborOptions

CAPTURE_KEY_ENV = "HARNESS_ENV_CAPTURE_KEY"
CHAT_API_FORMAT = "openai_chat_completions"
# Harbor's ModelApiFormat values the capture proxy serves (core/capture/dialects/), in order of
# preference for an agent that speaks several: chat completions first (the engine's own API).
SERVED_API_FORMATS = (CHAT_API_FORMAT, "openai_responses", "anthropic_messages", "google_generate_content")
# Formats whose clients add their own path (`/v1/messages`, `/v1beta/models/...`) to the proxy's root.
ROOT_BASE_URL_FORMATS = frozenset({"anthropic_messages", "google_generate_content"})
# The format each agent we run is pointed at the proxy with (others: looked up in Harbor's agent class).
AGENT_API_FORMATS = {
    "pi": CHAT_API_FORMAT,
    "opencode": CHAT_API_FORMAT,
    "codex": "openai_responses",
    "claude-code": "anthropic_messages",
    "gemini-cli": "google_generate_content",
}
# Each served format's dialect (core/capture/dialects): what a native upstream must speak to be passed through.
FORMAT_DIALECTS = {CHAT_API_FORMAT: "chat_completions", "openai_responses": "responses", "anthropic_messages": "messages", "google_generate_content": "gemini"}
MODEL_PROVIDER = "harness-env"
LOCAL_SANDBOX = "local"
LOCAL_ENV_IMPORT_PATH = "harness_env.envs.harbor.local_env:LocalHarborEnvironment"
# Agents that call no model: no endpoint options for them.
MODEL_FREE_AGENTS = frozenset({"oracle", "nop"})
# What runs in the local environment: agents whose CLI `harness-env install` provides, and those
# that need none. Others install themselves from the internet: use a provider sandbox for them.
LOCAL_AGENTS = frozenset({"pi", "opencode", "codex", "claude-code", "gemini-cli"}) | MODEL_FREE_AGENTS
# Slack on top of the phase timeouts for the one deadline of a trial (start, copies, clean-up).
DEADLINE_SLACK_S = 60.0


def harbor_agent_names() -> list[str]:
    from harbor.models.agent.name import AgentName

    return sorted(AgentName.values())


def harbor_sandbox_names() -> list[str]:
    from harbor.models.environment_type import EnvironmentType

    return [LOCAL_SANDBOX, *sorted(t.value for t in EnvironmentType)]


def check_agent_and_sandbox(opts: HarborOptions) -> None:
    """Unknown names, or an agent the local sandbox cannot run: InvalidRequestError saying what to use."""
    agents = harbor_agent_names()
    if opts.agent not in agents:
        raise InvalidRequestError(f"unknown Harbor agent {opts.agent!r}; Harbor 0.26 has: {', '.join(agents)}")
    sandboxes = harbor_sandbox_names()
    if opts.sandbox not in sandboxes:
        raise InvalidRequestError(f"unknown sandbox {opts.sandbox!r}; choose one of: {', '.join(sandboxes)}")
    asked = opts.agent_kwargs.get("version")
    pin = toolchain.pins().get(opts.agent)
    if opts.sandbox == LOCAL_SANDBOX and pin is not None and asked not in (None, "", pin.version):
        raise InvalidRequestError(
            f"the local sandbox runs the pinned {opts.agent} {pin.version} (`harness-env install`), not agent_kwargs.version={asked!r}; "
            "leave the version out, or use a provider sandbox where Harbor installs the version you ask for"
        )
    if opts.sandbox == LOCAL_SANDBOX and opts.agent not in LOCAL_AGENTS:
        raise InvalidRequestError(
            f"Harbor agent {opts.agent!r} installs itself from the internet and cannot run in the local sandbox; "
            f"the local sandbox runs {', '.join(sorted(LOCAL_AGENTS))}; use a provider sandbox (docker, e2b, daytona, modal, ...) for {opts.agent!r}"
        )


def served_api_format(formats: list[str]) -> str | None:
    """The format to point an agent at the proxy with, among those it speaks; None if it speaks none we serve."""
    return next((f for f in SERVED_API_FORMATS if f in formats), None)


def declared_api_formats(agent: str) -> list[str]:
    """The wire formats Harbor's agent class declares (MODEL_CONNECTION; [] for one that takes no
    custom endpoint). Imports the agent's module (and LiteLLM): call it off the event loop.
    InvalidRequestError for a name Harbor lists but registers no class for (terminus, terminus-1)."""
    from harbor.agents.factory import AgentFactory
    from harbor.models.agent.name import AgentName

    try:
        agent_class = AgentFactory.get_agent_class(AgentName(agent))
    except (ValueError, ImportError) as e:
        raise InvalidRequestError(f"Harbor agent {agent!r} cannot be built here: {e}") from None
    spec = getattr(agent_class, "MODEL_CONNECTION", None)
    return [str(f) for f in spec.supported_api_formats] if spec is not None else []


def agent_api_format(agent: str) -> str:
    """The wire format an agent is pointed at the proxy with: our table, else Harbor's declaration,
    chat completions when it declares none we serve (the preflight refused those already)."""
    if agent in AGENT_API_FORMATS:
        return AGENT_API_FORMATS[agent]
    try:
        formats = declared_api_formats(agent)
    except InvalidRequestError:
        return CHAT_API_FORMAT
    return served_api_format(formats) or CHAT_API_FORMAT


def proxy_url_for(api_format: str, proxy_base_url: str) -> str:
    """The base URL an agent of that format is given: the proxy's root for clients that add their own
    versioned path, the session's base URL (…/v1) otherwise."""
    if api_format in ROOT_BASE_URL_FORMATS:
        return proxy_base_url.rstrip("/").removesuffix("/v1")
    return proxy_base_url


def native_agent_kwargs(agent: str, kwargs: dict[str, Any], *, proxy_base_url: str, model: str) -> dict[str, Any]:
    """The agent's kwargs with our native config where the agent needs it to talk to the proxy
    exactly: Codex's config.toml (our provider entry; a caller's inline `config` merged on top),
    Claude Code's settings (the network tools denied; a caller's inline `config` merged on top)."""
    out = dict(kwargs)
    given = out.get("config")
    extra = given if isinstance(given, dict) else None
    if agent == "codex":
        from harness_env.envs.codex import config as codex_config

        out["config"] = codex_config.config_dict(proxy_base_url=proxy_base_url, model=model, extra=extra)
    elif agent == "claude-code" and (given is None or extra is not None):
        from harness_env.envs.claude_code import config as claude_config

        out["config"] = claude_config.settings_dict(extra)
    return out


def harbor_model_name(agent: str, model: str) -> str:
    if agent == "gemini-cli":
        from harness_env.envs.gemini_cli.config import model_in_path

        return f"gemini/{model_in_path(model)}"
    return f"{MODEL_PROVIDER}/{model}"


def agent_config(
    opts: HarborOptions,
    *,
    proxy_base_url: str,
    session_key: str,
    model: str,
    agent_timeout_s: float,
    setup_timeout_s: float,
    task_agent_timeout_s: float | None = None,
):
    """Harbor's AgentConfig for one rollout. The task's own agent timeout counts, capped by ours
    (an override, not Harbor's max_timeout_sec: that one caps nothing when the task sets none)."""
    from harbor.models.trial.config import AgentConfig

    from harness_env.envs.harbor.agents import OFFLINE_ENV, PREINSTALLED, PROVIDER_AGENTS

    fields: dict[str, Any] = {
        "override_timeout_sec": min(task_agent_timeout_s or agent_timeout_s, agent_timeout_s),
        "override_setup_timeout_sec": setup_timeout_s,
        "kwargs": dict(opts.agent_kwargs),
    }
    if opts.sandbox == LOCAL_SANDBOX and opts.agent in PREINSTALLED:
        fields["import_path"] = PREINSTALLED[opts.agent][1]
    elif opts.sandbox != LOCAL_SANDBOX and opts.agent in PROVIDER_AGENTS:
        fields["import_path"] = PROVIDER_AGENTS[opts.agent]
    else:
        fields["name"] = opts.agent
    if opts.agent not in MODEL_FREE_AGENTS:
        api_format = agent_api_format(opts.agent)
        fields["kwargs"] = native_agent_kwargs(opts.agent, fields["kwargs"], proxy_base_url=proxy_base_url, model=model)
        fields.update(
            model_name=harbor_model_name(opts.agent, model),
            base_url=proxy_url_for(api_format, proxy_base_url),
            model_api_key_name=CAPTURE_KEY_ENV,
            model_api_format=api_format,
            env={**OFFLINE_ENV.get(opts.agent, {}), CAPTURE_KEY_ENV: session_key},
        )
    return AgentConfig(**fields)


def environment_config(opts: HarborOptions):
    from harbor.models.environment_type import EnvironmentType
    from harbor.models.trial.config import EnvironmentConfig

    if opts.sandbox == LOCAL_SANDBOX:
        return EnvironmentConfig(import_path=LOCAL_ENV_IMPORT_PATH, kwargs=dict(opts.sandbox_kwargs))
    return EnvironmentConfig(type=EnvironmentType(opts.sandbox), kwargs=dict(opts.sandbox_kwargs))


def trial_config(
    opts: HarborOptions,
    *,
    task_dir: Path,
    trials_dir: Path,
    trial_name: str,
    proxy_base_url: str,
    session_key: str,
    model: str,
    agent_timeout_s: float,
    setup_timeout_s: float,
    verify_timeout_s: float,
    task_agent_timeout_s: float | None = None,
):
    """The whole TrialConfig of one rollout (pure: builds, starts nothing)."""
    from harbor.models.trial.config import TaskConfig, TrialConfig, VerifierConfig

    return TrialConfig(
        task=TaskConfig(path=task_dir),
        trials_dir=trials_dir,
        trial_name=trial_name,
        agent=agent_config(
            opts,
            proxy_base_url=proxy_base_url,
            session_key=session_key,
            model=model,
            agent_timeout_s=agent_timeout_s,
            setup_timeout_s=setup_timeout_s,
            task_agent_timeout_s=task_agent_timeout_s,
        ),
        environment=environment_config(opts),
        verifier=VerifierConfig(max_timeout_sec=verify_timeout_s),
    )


def trial_deadline(agent_timeout_s: float, setup_timeout_s: float, verify_timeout_s: float, *, environment_setup_s: float | None = None) -> float:
    """One deadline for the whole trial: environment start (`environment_setup_s`, default the
    setup timeout), agent install (setup), the agent, the verifier, plus slack. Nothing waits past it."""
    environment_s = setup_timeout_s if environment_setup_s is None else environment_setup_s
    return environment_s + setup_timeout_s + agent_timeout_s + verify_timeout_s + DEADLINE_SLACK_S
