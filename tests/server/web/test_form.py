"""Form values -> run_rollout arguments, and the choices the form offers."""

import pytest

from harness_env.core.errors import InvalidRequestError
from harness_env.models import HarnessInfo
from harness_env.server.web.examples import EXAMPLES, example_names, get_example
from harness_env.server.web.form import EXPLICIT, WebForm, endpoint_choices, harness_choices, lines, to_args


def test_explicit_endpoint_form_to_args():
    form = WebForm(base_url=" http://127.0.0.1:9/v1 ", model="m", api_key="sk-1", harness="pi", max_turns=5,
                   agent_timeout_s=30, max_tokens_cap=0, top_logprobs=3, instruction="do it",
                   setup="git init -q .\n\n", verify="test -f a\ngrep -q x a", files=[("a.txt", "x"), ("", "ignored")])
    args = to_args(form)
    assert (args.base_url, args.model, args.api_key.get_secret_value()) == ("http://127.0.0.1:9/v1", "m", "sk-1")
    assert args.setup == ["git init -q ."] and args.verify == ["test -f a", "grep -q x a"]
    assert args.files == {"a.txt": "x"} and args.max_turns == 5 and args.max_tokens_cap is None and args.top_logprobs == 3
    assert "sk-1" not in repr(args)


def test_catalog_endpoint_ignores_explicit_fields():
    args = to_args(WebForm(endpoint="vllm", base_url="http://x", model="y", api_key="k", instruction="i"))
    assert args.endpoint == "vllm" and not args.base_url and not args.api_key.get_secret_value()


def test_bad_input_is_one_line_without_the_key():
    with pytest.raises(InvalidRequestError, match="instruction") as e:
        to_args(WebForm(api_key="sk-secret", instruction=""))
    assert "sk-secret" not in str(e.value)
    with pytest.raises(InvalidRequestError, match="listed twice"):
        to_args(WebForm(instruction="i", files=[("a", "1"), ("a", "2")]))


def test_choices_follow_the_registry_and_catalog():
    infos = [HarnessInfo(name="pi", installed=True, version="1.6.0", pinned_version="1.6.0"),
             HarnessInfo(name="zeta", installed=False, version=None, pinned_version=None),
             HarnessInfo(name="opencode", installed=True, version="1.2", pinned_version="1.2")]
    assert harness_choices(infos) == [("pi 1.6.0", "pi"), ("opencode 1.2", "opencode"), ("zeta (not installed)", "zeta")]
    catalog = [{"name": "vllm", "configured": True}, {"name": "openai", "configured": False}]
    assert endpoint_choices(catalog) == ["vllm", EXPLICIT]
    assert lines(" a \n\n b") == [" a ", " b"]


def test_examples_are_valid_tasks():
    assert {"write a file", "fix a failing Python test", "a task that fails on purpose"} <= set(example_names())
    for ex in EXAMPLES:
        form = WebForm(base_url="http://127.0.0.1:9/v1", model="m", instruction=ex.instruction,
                       setup="\n".join(ex.setup), verify="\n".join(ex.verify), files=list(ex.files.items()))
        assert to_args(form).verify
    with pytest.raises(KeyError):
        get_example("nope")


def test_every_registered_harness_is_offered():
    from harness_env.server.service import RolloutService

    offered = dict((value, label) for label, value in harness_choices(RolloutService.list_harnesses()))
    assert set(offered) == {"pi", "opencode", "whitebox"} and offered["whitebox"] == "whitebox 1"
