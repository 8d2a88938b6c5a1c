"""Pure builders for Harbor's trial configuration (harbor.models.trial.config, Harbor 0.25).

The agent is Harbor's own, pointed at our capture proxy through Harbor's custom-endpoint options:
`base_url` = the proxy, `model_api_format` = OpenAI chat completions, and `model_api_key_name`
naming a variable that holds the per-rollout capture key (Harbor hands the agent the variable, and
redacts it in the trial's config.json). The model is `harness-env/<model>`: a provider name no
agent knows, so each writes a custom-provider config for the endpoint (OpenCode's built-in
"openai" provider would speak the Responses API instead).

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
CHAT_API_FORMAT = "openai_chat_completions"  # the one wire format the capture proxy serves
MODEL_PROVIDER = "harness-env"
LOCAL_SANDBOX = "local"
LOCAL_ENV_IMPORT_PATH = "harness_env.envs.harbor.local_env:LocalHarborEnvironment"
# Agents that call no model: no endpoint options for them.
MODEL_FREE_AGENTS = frozenset({"oracle", "nop"})
# What runs in the local environment: agents whose CLI `harness-env install` provides, and those
# that need none. Others install themselves from the internet: use a provider sandbox for them.
LOCAL_AGENTS = frozenset({"pi", "opencode"}) | MODEL_FREE_AGENTS
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
        raise InvalidRequestError(f"unknown Harbor agent {opts.agent!r}; Harbor 0.25 has: {', '.join(agents)}")
    sandboxes = harbor_sandbox_names()
    if opts.sandbox not in sandboxes:
        raise InvalidRequestError(f"unknown sandbox {opts.sandbox!r}; choose one of: {', '.join(sandboxes)}")
    asked = opts.agent_kwargs.get("version")
    pin = toolchain.PINS.get(opts.agent)
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

    from harness_env.envs.harbor.agents import OFFLINE_ENV, PREINSTALLED

    fields: dict[str, Any] = {
        "override_timeout_sec": min(task_agent_timeout_s or agent_timeout_s, agent_timeout_s),
        "override_setup_timeout_sec": setup_timeout_s,
        "kwargs": dict(opts.agent_kwargs),
    }
    if opts.sandbox == LOCAL_SANDBOX and opts.agent in PREINSTALLED:
        fields["import_path"] = PREINSTALLED[opts.agent][1]
    else:
        fields["name"] = opts.agent
    if opts.agent not in MODEL_FREE_AGENTS:
        fields.update(
            model_name=f"{MODEL_PROVIDER}/{model}",
            base_url=proxy_base_url,
            model_api_key_name=CAPTURE_KEY_ENV,
            model_api_format=CHAT_API_FORMAT,
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


def trial_deadline(
    agent_timeout_s: float, setup_timeout_s: float, verify_timeout_s: float, *, environment_setup_s: float | None = None
) -> float:
    """One deadline for the whole trial: environment start (`environment_setup_s`, default the
    setup timeout), agent install (setup), the agent, the verifier, plus slack. Nothing waits past it."""
    environment_s = setup_timeout_s if environment_setup_s is None else environment_setup_s
    return environment_s + setup_timeout_s + agent_timeout_s + verify_timeout_s + DEADLINE_SLACK_S
