"""Options are declared once: every field of the rollout options model, and of each harness's own
options model (from the registry), appears with the same default and description on the CLI
(argparse), in the MCP tool's input schema and in the web form's controls; and every flag and
argument name that existed before still works."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import pytest

from harness_env import cli
from harness_env.cli_flags import flag_name, shown_default
from harness_env.cli_request import request_fields
from harness_env.envs import harness_options_models
from harness_env.families import family_names, get_family
from harness_env.models import HARNESS_OPTIONS, RolloutOptions
from harness_env.server.mcp.rollout import rollout_args, run_rollout_schema, run_rollout_tool_schema, short
from harness_env.server.mcp.tools import McpToolServer
from harness_env.server.web.form import harness_controls, option_controls
from tests import needs

REPO = Path(__file__).resolve().parents[1]
OPTION_FIELDS = [name for name in RolloutOptions.model_fields if name != HARNESS_OPTIONS]
FAMILY_FIELDS = [(family, name) for family in family_names() for name in get_family(family).options_model.model_fields]
HARNESS_FIELDS = [(harness, name) for harness, model in harness_options_models().items() for name in model.model_fields]

# What users' scripts use today: these names must keep working.
CLI_FLAGS = [
    "--task",
    "--harness",
    "--task-index",
    "--split",
    "--agent",
    "--reward-key",
    "--base-url",
    "--model",
    "--api-key",
    "--api-key-env",
    "--mode",
    "--agent-timeout-s",
    "--setup-timeout-s",
    "--verify-timeout-s",
    "--max-turns",
    "--max-tokens-cap",
    "--disable-thinking",
    "--top-logprobs",
    "--temperature",
    "--reward-mode",
    "--harness-config",
    "--sandbox",
    "--memory-limit-mb",
    "--pids-limit",
    "--disk-limit-mb",
    "--cpu-limit",
    "--network",
    "--out",
    "--compact",
    "--rows-out",
    "--quiet",
]
MCP_ARGUMENTS = [
    "instruction",
    "endpoint",
    "base_url",
    "api_key",
    "model",
    "setup",
    "verify",
    "files",
    "task_id",
    "harness",
    "mode",
    "disable_thinking",
    "max_tokens_cap",
    "top_logprobs",
    "max_turns",
    "agent_timeout_s",
    "setup_timeout_s",
    "verify_timeout_s",
    "harness_config",
    "reward_mode",
    "temperature",
    "task_family",
    "family_options",
]
# Accepted as before but no longer listed: Harbor's request upgrader moves it to harness_options.
FORMER_MCP_ARGUMENTS = ["harbor"]


def _run_actions() -> dict[str, argparse.Action]:
    parser = cli.build_parser()
    run = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    return {flag: action for action in run._actions for flag in action.option_strings}


def _harness_model(harness: str):
    return harness_options_models()[harness]


# -- the CLI -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", OPTION_FIELDS)
def test_every_rollout_option_is_a_cli_flag_with_its_description_and_default(name):
    info = RolloutOptions.model_fields[name]
    action = _run_actions()[flag_name(name)]
    assert info.description and info.description in action.help
    assert f"default: {shown_default(info.default)}" in action.help
    assert action.default is None  # not given: the field's own default applies
    assert name in request_fields({name: "given"}) and name not in request_fields({name: None})


@pytest.mark.parametrize("harness,name", HARNESS_FIELDS)
def test_every_harness_option_is_on_the_cli(harness, name):
    info = _harness_model(harness).model_fields[name]
    carrier = (info.json_schema_extra or {}).get("cli")
    action = _run_actions()[carrier or flag_name(name)]
    assert info.description in action.help  # its own flag, a shared one (--sandbox), or the one that carries it (--task)
    if carrier is None:
        assert f"default: {shown_default(info.default)}" in action.help and action.default is None


def test_every_flag_of_before_still_exists():
    actions = _run_actions()
    assert [f for f in CLI_FLAGS if f not in actions] == []


# -- MCP -------------------------------------------------------------------------------------------
def _listed_schema() -> dict:
    tools = McpToolServer(service=None)  # the tools as the server lists them (no rollout runs)
    listed = {t.name: t for t in asyncio.run(tools.mcp.list_tools())}
    return listed["run_rollout"].input_schema


@pytest.fixture(scope="module")
def listed_schema() -> dict:
    schema = _listed_schema()
    assert schema == json.loads(json.dumps(run_rollout_tool_schema()))
    return schema


@pytest.fixture(scope="module")
def tool_schema() -> dict:
    """The reference the listed schema is made from: every option with its whole description."""
    return json.loads(json.dumps(run_rollout_schema()))


def _listed(listed_schema: dict, name: str) -> dict:
    """An argument as the tool lists it: at the top, or among the advanced `options`."""
    return listed_schema["properties"].get(name) or listed_schema["properties"]["options"]["properties"][name]


@pytest.mark.parametrize("name", OPTION_FIELDS)
def test_every_rollout_option_is_in_the_mcp_schema(tool_schema, listed_schema, name):
    info = RolloutOptions.model_fields[name]
    prop = tool_schema["properties"][name]
    assert prop["description"] == info.description and prop["default"] == info.default
    listed = _listed(listed_schema, name)  # its short description at the top; its default either way
    assert listed.get("default") == (info.default if info.default not in (None, "", {}, []) else None)
    if name in listed_schema["properties"]:
        assert listed["description"] == short(info.description) and info.description.startswith(listed["description"].removesuffix(" ..."))


@pytest.mark.parametrize("harness,name", HARNESS_FIELDS)
def test_every_harness_option_is_in_the_mcp_schema(tool_schema, harness, name):
    model = _harness_model(harness)
    info = model.model_fields[name]
    assert {"$ref": f"#/$defs/{model.__name__}"} in tool_schema["properties"][HARNESS_OPTIONS]["anyOf"]
    prop = tool_schema["$defs"][model.__name__]["properties"][name]
    assert prop["description"] == info.description and prop["default"] == info.default


def test_every_argument_of_before_is_in_the_mcp_schema(tool_schema, listed_schema):
    assert [a for a in MCP_ARGUMENTS if a not in tool_schema["properties"]] == []
    nested = listed_schema["properties"]["options"]["properties"]
    assert [a for a in MCP_ARGUMENTS if a not in listed_schema["properties"] and a not in nested] == []
    # Sent at the top as before, or under options: the same request.
    flat = {"instruction": "x", "harness": "harbor", "max_turns": 3, "temperature": 0.5, "harbor": {"task_index": 1}}
    nested_args = {"instruction": "x", "harness": "harbor", "options": {"max_turns": 3, "temperature": 0.5, "harbor": {"task_index": 1}}}
    assert rollout_args(flat) == rollout_args(nested_args)
    current = {"instruction": "x", "harness": "harbor", "max_turns": 3, "temperature": 0.5, "harness_options": {"task_index": 1}}
    assert rollout_args(flat) == rollout_args(current)
    assert [a for a in FORMER_MCP_ARGUMENTS if a in tool_schema["properties"]] == []


# -- the web form ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def page():
    needs.module("gradio", "uv sync --extra server")
    from harness_env.server.web.page import WebPage

    built = WebPage(service=None)  # the layout only
    yield built
    built.close()


def _shown(component, default):
    """The control's starting value as Gradio holds it, and the default it stands for."""
    if isinstance(default, dict):
        return component.value, "" if not default else json.dumps(default)
    if default is None and component.value in (None, ""):
        return None, None
    return component.value, default


@pytest.mark.parametrize("name", OPTION_FIELDS)
def test_every_rollout_option_is_a_web_control_with_its_description_and_default(page, name):
    info = RolloutOptions.model_fields[name]
    control = {c.name: c for c in option_controls()}[name]
    assert control.info == info.description and control.default == info.default
    if control.kind == "family":  # the task column's family choice and each family's own options
        assert page.task_family.value and set(page.family_groups) == set(family_names())
        return
    component = page.inputs[name]
    assert component.info == info.description
    if name == "harness":  # the server's harnesses, offered at load; the field's default chosen then
        assert page.harness_default == info.default
        return
    value, expected = _shown(component, info.default)
    assert value == expected


@pytest.mark.parametrize("harness,name", HARNESS_FIELDS)
def test_every_harness_option_a_remote_caller_may_set_is_a_web_control(page, harness, name):
    info = _harness_model(harness).model_fields[name]
    if not (info.json_schema_extra or {}).get("remote", True):  # for trusted callers only: not offered to the web
        assert name not in page.harness_inputs[harness]
        return
    control = {c.name: c for c in harness_controls(with_choices=False)[harness][1]}[name]
    assert control.info == info.description and control.default == info.default
    component = page.harness_inputs[harness][name]
    assert component.info == info.description and component.elem_id == f"{harness}-{name.replace('_', '-')}"
    value, expected = _shown(component, info.default)
    assert value == expected


@pytest.mark.parametrize("family,name", FAMILY_FIELDS)
def test_every_family_option_is_a_web_control_with_its_title_description_and_default(page, family, name):
    info = get_family(family).options_model.model_fields[name]
    component = page.family_inputs[family][name]
    assert component.label == info.title and component.elem_id == f"{family}-{name.replace('_', '-')}"
    assert (component.info or "") == (info.description or "")
    value, expected = _shown(component, info.default)
    assert value == expected


# -- shared code names no harness ------------------------------------------------------------------
def test_shared_code_barely_names_a_harness():
    """The harness-specific parts live in the harness's package; what remains in the shared modules
    is the former request and result key (`harbor`) and examples in comments."""
    shared = [*(p.name for p in REPO.glob("cli*.py")), "models/__init__.py", "server/web/page.py"]
    assert sum((REPO / f).read_text().lower().count("harbor") for f in shared) < 15
