"""Form values (a dict keyed by field name; a harness's own options under its name) -> run_rollout
arguments, and the choices the form offers."""

import json

import pytest

from harness_env.core.errors import InvalidRequestError
from harness_env.envs.harbor.options import agent_choices, sandbox_choices
from harness_env.models import HarnessInfo
from harness_env.server.web.examples import example_names, examples, get_example
from harness_env.server.web.form import EXPLICIT, SHELL_TASK, endpoint_choices, family_controls, harness_choices, lines, task_families, to_args

HARBOR = "harbor"
SVG_ICON = "svg_icon"  # the family these tests fill in


def WebForm(**values):  # the form's values, as the page hands them over
    return values


def test_explicit_endpoint_form_to_args():
    form = WebForm(
        base_url=" http://127.0.0.1:9/v1 ",
        model="m",
        api_key="sk-1",
        harness="pi",
        max_turns=5,
        agent_timeout_s=30,
        max_tokens_cap=0,
        top_logprobs=3,
        instruction="do it",
        setup="git init -q .\n\n",
        verify="test -f a\ngrep -q x a",
        files=[("a.txt", "x"), ("", "ignored")],
    )
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


def test_an_empty_instruction_is_named_for_the_harness_chosen():
    for harness in ("pi", "opencode", None):
        with pytest.raises(InvalidRequestError) as e:
            to_args(WebForm(base_url="http://x/v1", model="m", harness=harness, instruction="  "))
        assert str(e.value) == f"the instruction is empty: write the task for the {harness or 'pi'} agent"
    with pytest.raises(InvalidRequestError, match="write what to draw for the pi agent"):
        to_args(WebForm(base_url="http://x/v1", model="m", harness="pi", task_family=SVG_ICON))
    with pytest.raises(InvalidRequestError, match="harbor.task_dir or harbor.dataset"):  # Harbor may name a task instead
        to_args(WebForm(base_url="http://x/v1", model="m", harness=HARBOR))


def test_choices_follow_the_registry_and_catalog():
    infos = [
        HarnessInfo(name="pi", installed=True, version="1.6.0", pinned_version="1.6.0"),
        HarnessInfo(name="zeta", installed=False, version=None, pinned_version=None),
        HarnessInfo(name="opencode", installed=True, version="1.2", pinned_version="1.2"),
    ]
    assert harness_choices(infos) == [("pi 1.6.0", "pi"), ("opencode 1.2", "opencode"), ("zeta (not installed)", "zeta")]
    catalog = [{"name": "vllm", "configured": True}, {"name": "openai", "configured": False}]
    assert endpoint_choices(catalog) == ["vllm", EXPLICIT]
    assert lines(" a \n\n b") == [" a ", " b"]


def test_examples_are_valid_tasks():
    assert {"write a file", "fix a failing Python test", "a task that fails on purpose"} <= set(example_names())
    for ex in examples():
        family = ex.task_family or SHELL_TASK
        form = WebForm(
            base_url="http://127.0.0.1:9/v1",
            model="m",
            instruction=ex.instruction,
            setup="\n".join(ex.setup),
            verify="\n".join(ex.verify),
            files=list(ex.files.items()),
            task_family=family,
            **({family: ex.family_options} if ex.task_family else {}),
        )
        args = to_args(form)
        assert args.verify if family == SHELL_TASK else (args.task_family == SVG_ICON and not args.verify)
    svg = get_example("draw an icon (svg_icon)")
    assert svg.task_family == SVG_ICON and "red square" in svg.instruction
    with pytest.raises(KeyError):
        get_example("nope")


def test_every_registered_harness_is_offered():
    from harness_env.server.service import RolloutService

    offered = dict((value, label) for label, value in harness_choices(RolloutService.list_harnesses()))
    assert set(offered) == {"pi", "opencode", "whitebox", "harbor", "codex", "claude-code", "gemini-cli"} and offered["whitebox"] == "whitebox 1"


def test_svg_icon_form_to_family_options():
    from harness_env.families.svg_icon.judge import DEFAULT_RUBRIC

    rubric = json.dumps(DEFAULT_RUBRIC.model_dump(mode="json"), indent=1)
    form = WebForm(
        base_url="http://127.0.0.1:9/v1",
        model="m",
        instruction="a red square",
        task_family=SVG_ICON,
        verify="test -f hidden-field-left-over",
        svg_icon=dict(reference_png=" refs/sq.png ", source_prompt=" a red square icon ", renderer="resvg", rubric=rubric),
    )
    args = to_args(form)
    assert args.task_family == "svg_icon" and args.verify == []  # the verify field is hidden and ignored
    opts = args.family_options
    assert opts["renderer"] == "resvg" and opts["reference_png"] == "refs/sq.png" and opts["source_prompt"] == "a red square icon"
    assert opts["rubric"] == DEFAULT_RUBRIC.model_dump(mode="json")
    # Optional fields left blank are not sent; a blank rubric means the judge's default.
    bare = to_args(WebForm(base_url="http://x/v1", model="m", instruction="i", task_family=SVG_ICON, svg_icon=dict(renderer="chromium", rubric="  ")))
    assert bare.family_options == {"renderer": "chromium"}
    # A shell task sends no family at all, whatever the hidden family fields hold.
    shell = to_args(WebForm(base_url="http://x/v1", model="m", instruction="i", verify="true", svg_icon=dict(reference_png="x.png", rubric="{")))
    assert shell.task_family is None and shell.family_options == {} and shell.verify == ["true"]


def test_the_family_controls_are_its_options_fields():
    model, controls = family_controls()[SVG_ICON]
    assert [c.name for c in controls] == list(model.model_fields) and task_families() == [SHELL_TASK, SVG_ICON]
    by_name = {c.name: c for c in controls}
    assert by_name["renderer"].kind == "radio" and by_name["renderer"].choices == ("chromium", "resvg")
    assert by_name["rubric"].kind == "json" and '"semantic_match"' in by_name["rubric"].placeholder  # the default, shown
    assert by_name["reference_png"].kind == "text" and "HARNESS_ENV_REFERENCE_DIR" in by_name["reference_png"].info


def test_edited_rubric_weights_and_bad_rubrics():
    rubric = '{"dimensions": [{"name": "shape", "description": "a square?", "weight": 3}, {"name": "colour", "description": "red?"}]}'
    sent = to_args(WebForm(base_url="http://x/v1", model="m", instruction="i", task_family=SVG_ICON, svg_icon=dict(rubric=rubric)))
    assert [d["name"] for d in sent.family_options["rubric"]["dimensions"]] == ["shape", "colour"]
    for text, match in [
        ('{"dimensions": [', "rubric .*is not valid JSON: .* line 1, column"),
        ('{"dimensions": [{"name": "a", "description": "x", "weight": 0}]}', "svg_icon .*rubric.*greater than 0"),
        ('{"dimensions": [{"name": "Bad Name", "description": "x"}]}', "svg_icon .*rubric.*name"),
        ('{"dims": []}', "svg_icon .*rubric"),
    ]:
        with pytest.raises(InvalidRequestError, match=match) as e:
            to_args(WebForm(base_url="http://x/v1", model="m", instruction="i", task_family=SVG_ICON, svg_icon=dict(rubric=text)))
        assert "\n" not in str(e.value)
    with pytest.raises(InvalidRequestError, match="svg_icon .*renderer.*'chromium' or 'resvg'"):
        to_args(WebForm(base_url="http://x/v1", model="m", instruction="i", task_family=SVG_ICON, svg_icon=dict(renderer="inkscape")))
    with pytest.raises(InvalidRequestError, match="unknown task family"):
        to_args(WebForm(base_url="http://x/v1", model="m", instruction="i", task_family="chess"))


HARBOR_FILLED = dict(harbor=dict(agent="oracle", sandbox="docker", task_dir=" tasks/hello ", task_index=3, reward_key=" score "))


def test_harbor_form_sends_only_what_was_filled_in():
    uniform = to_args(WebForm(base_url="http://x/v1", model="m", harness=HARBOR, instruction="do nothing", verify="true"))
    assert uniform.harness_options.model_dump(exclude_defaults=True) == {}  # agent pi, sandbox local: the defaults
    assert (uniform.harness_options.agent, uniform.harness_options.sandbox, uniform.harness_options.task_dir) == ("pi", "local", None)
    assert uniform.instruction == "do nothing" and uniform.verify == ["true"]  # the task Harbor converts
    named = to_args(WebForm(base_url="http://x/v1", model="m", harness=HARBOR, instruction="", **HARBOR_FILLED))
    assert named.harness_options.model_dump(exclude_defaults=True) == {
        "agent": "oracle",
        "sandbox": "docker",
        "task_dir": "tasks/hello",
        "task_index": 3,
        "reward_key": "score",
    }
    assert named.instruction == ""  # a named Harbor task brings its own
    dataset = to_args(
        WebForm(
            base_url="http://x/v1",
            model="m",
            harness=HARBOR,
            harbor=dict(dataset="bench", task_index=None, agent="", sandbox=" ", reward_key="  ", split=" ", agent_kwargs=" "),
        )
    )
    assert dataset.harness_options.model_dump(exclude_defaults=True) == {"dataset": "bench"}
    assert (dataset.harness_options.agent, dataset.harness_options.sandbox) == ("pi", "local")  # blank dropdowns fall back to the defaults
    split = to_args(
        WebForm(
            base_url="http://x/v1",
            model="m",
            harness=HARBOR,
            harbor=dict(dataset="bench", split=" train ", task_index=2, agent_kwargs='{"reasoning_effort": "low"}'),
        )
    )
    assert split.harness_options.model_dump(exclude_defaults=True) == {
        "dataset": "bench",
        "split": "train",
        "task_index": 2,
        "agent_kwargs": {"reasoning_effort": "low"},
    }


def test_other_harnesses_send_nothing_harbor():
    args = to_args(WebForm(base_url="http://x/v1", model="m", harness="pi", instruction="i", verify="true", **HARBOR_FILLED))
    assert args.harness_options is None and "harbor" not in args.model_dump(exclude_defaults=True)


def test_bad_harbor_input_is_one_line():
    for form, match in [
        (dict(instruction=""), "instruction is required .*harbor.task_dir"),
        (dict(instruction="i", harbor=dict(task_dir="a", dataset="b")), "not both"),
        (dict(instruction="i", harbor=dict(task_index=-1)), "task_index"),
        (dict(instruction="i", harbor=dict(agent="rm -rf")), "agent"),
        (dict(instruction="i", harbor=dict(split="train")), "give the dataset too"),
        (dict(instruction="i", harbor=dict(agent_kwargs="{version: 1")), "agent options is not valid JSON: .* line 1"),
        (dict(instruction="i", harbor=dict(agent_kwargs='["low"]')), "agent options must be a JSON object"),
        (dict(instruction="i", harbor=dict(agent_kwargs="[" * 100_000)), "agent options is nested too deeply"),
    ]:
        with pytest.raises(InvalidRequestError, match=match) as e:
            to_args(WebForm(base_url="http://x/v1", model="m", api_key="sk-secret", harness=HARBOR, **form))
        assert "\n" not in str(e.value) and "sk-secret" not in str(e.value)


def test_harbor_choices_put_the_local_ones_first():
    names = ["aider", "claude-code", "nop", "opencode", "oracle", "pi", "terminus-2"]
    assert agent_choices(names) == [
        ("pi", "pi"),
        ("claude-code", "claude-code"),
        ("opencode", "opencode"),
        ("nop", "nop"),
        ("oracle", "oracle"),
        ("aider (provider sandbox)", "aider"),
        ("terminus-2 (provider sandbox)", "terminus-2"),
    ]
    assert sandbox_choices(["daytona", "local", "docker"]) == ["local", "daytona", "docker"]
    assert sandbox_choices([]) == ["local"]


def _stored(**kw) -> dict:
    """A request as the job store keeps it: RolloutRequest's JSON, the key masked."""
    from harness_env.models import Endpoint, RolloutRequest, Task

    task = Task(instruction="Create a.txt", setup=["git init -q ."], verify=["test -f a.txt"], files={"b.txt": "x"}, task_id="t-7")
    request = RolloutRequest(task=task, endpoint=Endpoint(base_url="http://127.0.0.1:9/v1", model="m", api_key="sk-stored"), **kw)
    return request.model_dump(mode="json")


def test_a_stored_request_loads_into_the_form_and_runs_as_it_was():
    from harness_env.server.web.form import request_form

    stored = _stored(harness="pi", max_turns=5, top_logprobs=3, temperature=0.5, harness_config={"k": 1})
    form = request_form(stored, catalog=[])
    assert "sk-stored" not in json.dumps(form) and form["endpoint"] == EXPLICIT
    assert (form["instruction"], form["setup"], form["verify"], form["task_id"]) == ("Create a.txt", "git init -q .", "test -f a.txt", "t-7")
    args = to_args({**form, "api_key": "sk-again"})  # the key is typed again
    assert (args.base_url, args.model, args.task_id, args.files) == ("http://127.0.0.1:9/v1", "m", "t-7", {"b.txt": "x"})
    assert (args.max_turns, args.top_logprobs, args.temperature, args.harness_config) == (5, 3, 0.5, {"k": 1})
    assert (args.setup, args.verify, args.harness) == (["git init -q ."], ["test -f a.txt"], "pi")


def test_a_stored_request_of_a_catalog_endpoint_picks_it_again():
    from harness_env.server.web.form import request_form

    catalog = [{"name": "vllm", "configured": True, "base_url": "http://127.0.0.1:9/v1", "model": "m"}]
    form = request_form(_stored(), catalog)
    assert (form["endpoint"], form["base_url"], form["model"]) == ("vllm", "", "")
    assert to_args(form).endpoint == "vllm"


def test_the_form_sends_its_task_id():
    assert to_args(WebForm(base_url="http://127.0.0.1:9/v1", model="m", instruction="x", task_id=" t-1 ")).task_id == "t-1"
