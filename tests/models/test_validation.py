"""The wire types refuse what would otherwise fail later, deep inside a rollout (a 500, a traceback,
a lost result): with one message naming the field, and never echoing the input."""

import json

import pytest
from pydantic import ValidationError

from harness_env.models import MAX_NESTING, Endpoint, RolloutArgs, RolloutRequest, Task


def _args(**kw) -> dict:
    return {"instruction": "x", "base_url": "http://h:1/v1", "model": "m", **kw}


def _refused(model, data: dict, field: str, needle: str) -> str:
    with pytest.raises(ValidationError) as e:
        model.model_validate(data)
    errors = e.value.errors(include_input=False)
    text = "; ".join(err["msg"] for err in errors)
    assert any(field in map(str, err["loc"]) for err in errors) or field in text, errors  # named
    assert needle in text, text
    return text


@pytest.mark.parametrize("field", ["temperature", "agent_timeout_s", "setup_timeout_s", "verify_timeout_s"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_floats_must_be_finite(field, value):
    _refused(RolloutArgs, _args(**{field: value}), field, "finite number")


def test_an_integer_from_an_infinite_json_number_is_refused():
    _refused(RolloutArgs, json.loads('{"instruction": "x", "max_turns": 1e400}'), "max_turns", "finite number")


@pytest.mark.parametrize(
    "field,value",
    [
        ("instruction", "draw \ud800 this"),
        ("setup", ["echo ok", "echo \udcff"]),
        ("verify", ["test \ud83d"]),
        ("files", {"a.txt": "\ud800"}),
        ("files", {"\udc80.txt": "x"}),
        ("model", "m\ud800"),
        ("api_key", "sk-\ud800"),
        ("task_id", "t\udfff"),
        ("harness_config", {"provider": {"x": ["ok", "\ud800"]}}),
        ("harness_config", {"\ud800": 1}),
        ("family_options", {"rubric": "\ud800"}),
        ("harbor", {"agent_kwargs": {"a": "\ud800"}}),
    ],
)
def test_lone_surrogates_are_refused_in_every_field(field, value):
    text = _refused(RolloutArgs, _args(**{field: value}), field, "lone surrogate")
    assert "\ud800" not in text and "sk-" not in text  # the value is not echoed


@pytest.mark.parametrize(
    "field,value",
    [
        ("instruction", "draw\x00 this"),
        ("setup", ["echo ok", "echo \x00"]),
        ("verify", ["test -f a\x00b"]),
        ("files", {"a\x00.txt": "x"}),
        ("task_id", "t\x00"),
        ("model", "m\x00"),
        ("api_key", "sk-\x00"),
        ("base_url", "http://h\x00/v1"),
        ("harness_config", {"provider": {"x": ["ok", "\x00"]}}),
        ("harness_config", {"k\x00": 1}),
        ("family_options", {"rubric": "\x00"}),
        ("harbor", {"agent_kwargs": {"a": "\x00"}}),
    ],
)
def test_nul_bytes_are_refused_in_every_string_that_can_become_an_argv_env_or_path(field, value):
    text = _refused(RolloutArgs, _args(**{field: value}), field, "NUL byte")
    assert "\x00" not in text and "remove it" in text


def test_nul_bytes_are_refused_in_the_resolved_request_but_allowed_in_file_contents():
    base = {"task": {"instruction": "x"}, "endpoint": {"base_url": "http://h/v1", "model": "m"}}
    _refused(RolloutRequest, {**base, "task": {"instruction": "x", "verify": ["true\x00"]}}, "verify", "NUL byte")
    _refused(RolloutRequest, {**base, "task": {"instruction": "x", "task_id": "a\x00"}}, "task_id", "NUL byte")
    _refused(Task, {"instruction": "x", "metadata": {"k": "\x00"}}, "metadata", "NUL byte")
    assert Task(instruction="x", files={"blob.bin": "a\x00b"}).files == {"blob.bin": "a\x00b"}  # written as bytes: fine


def test_valid_unicode_is_fine():
    args = RolloutArgs.model_validate(_args(instruction="dessine un cœur 🫀", setup=["echo 日本"], files={"ü/é.txt": "🙂"}))
    assert args.instruction.endswith("🫀")


def test_surrogates_are_refused_in_the_resolved_request_too():
    base = {"task": {"instruction": "x"}, "endpoint": {"base_url": "http://h/v1", "model": "m"}}
    _refused(RolloutRequest, {**base, "task": {"instruction": "x", "setup": ["\ud800"]}}, "setup", "lone surrogate")
    _refused(RolloutRequest, {**base, "endpoint": {"base_url": "http://h/v1", "model": "\ud800"}}, "model", "lone surrogate")
    _refused(Task, {"instruction": "x", "metadata": {"k": "\ud800"}}, "metadata", "lone surrogate")


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def test_free_form_values_are_bounded_in_depth():
    RolloutArgs.model_validate(_args(harness_config=_nested(MAX_NESTING - 1)))
    _refused(RolloutArgs, _args(harness="opencode", harness_config=_nested(900)), "harness_config", f"more than {MAX_NESTING} levels")
    deep_list: list = [1]
    for _ in range(MAX_NESTING):
        deep_list = [deep_list]
    _refused(RolloutArgs, _args(family_options={"x": deep_list}), "family_options", "levels")
    _refused(Task, {"instruction": "x", "metadata": _nested(5000)}, "metadata", "levels")  # any depth: no RecursionError


@pytest.mark.parametrize(
    "files,needle",
    [
        ({"a": "x", "a/b": "y"}, "'a' is both a file and the directory of 'a/b'"),
        ({"d/e/f": "x", "d/e": "y"}, "'d/e' is both a file and the directory of 'd/e/f'"),
        ({"a/b": "x", "a/./b": "y"}, "given twice"),
        ({"n" * 256: "x"}, "over 255 bytes"),
        ({"d/" + "é" * 128 + "/f": "x"}, "over 255 bytes"),  # 256 bytes in 128 characters
        ({"../x": "y"}, "inside the workspace"),
    ],
)
def test_file_trees_that_cannot_be_written_are_refused(files, needle):
    _refused(Task, {"instruction": "x", "files": files}, "files", needle)


def test_file_trees_that_can_be_written_are_fine():
    task = Task(instruction="x", files={"a/b": "1", "a/c": "2", "ab": "3", "n" * 255: "4", "é" * 127 + "e": "5"})
    assert len(task.files) == 5


@pytest.mark.parametrize("url", ["http://[::1", "http://h:99999/v1", "http://h:port/v1", "http://", "https:///v1"])
def test_unparsable_base_urls_are_one_clear_error(url):
    text = _refused(Endpoint, {"base_url": url, "model": "m"}, "base_url", "base_url")
    assert "http(s)://host" in text
    if url != "http://":
        _refused(RolloutArgs, _args(base_url=url), "base_url", "http(s)://host")


def test_a_parsable_base_url_of_another_scheme_is_left_to_the_catalog():
    assert RolloutArgs.model_validate(_args(base_url="ftp://h")).base_url == "ftp://h"  # the catalog names the schemes


@pytest.mark.parametrize(
    "url,needle",
    [
        ("http://bob:hunter2-pw@h:8000/v1", "user name or password"),
        ("https://hunter2-pw@h/v1", "user name or password"),
        ("http://bob:hunter2-pw@[::1/v1", "user name or password"),  # unparsable too: still not quoted
        ("ftp://bob:hunter2-pw@h", "user name or password"),
        ("http://h/v1?api_key=hunter2-pw", "query string"),
        ("http://h/v1#hunter2-pw", "query string"),
    ],
)
def test_credentials_in_a_base_url_are_refused_without_being_quoted(url, needle):
    for model, data in ((Endpoint, {"base_url": url, "model": "m"}), (RolloutArgs, _args(base_url=url))):
        text = _refused(model, data, "base_url", needle)
        assert "api_key" in text and "hunter2" not in text  # what to do instead; the secret not echoed


def _request(**kw):
    return RolloutRequest.model_validate({"task": {"instruction": "x"}, "endpoint": {"base_url": "http://h/v1", "model": "m"}, **kw})


def test_harness_options_under_their_own_name_and_the_former_key():
    from harness_env.envs.harbor.options import HarborOptions  # loads the registry: the options are typed

    new = _request(harness="harbor", harness_options={"agent": "oracle"})
    old = _request(harness="harbor", harbor={"agent": "oracle"})  # upgraded by Harbor (HarborOptions.upgrade_request)
    assert isinstance(new.harness_options, HarborOptions) and new == old
    assert "harbor" not in old.model_dump() and old.model_dump(mode="json")["harness_options"]["agent"] == "oracle"
    assert _request(harness="harbor", harbor=None).harness_options is None  # a former key sent empty: nothing to read
    _refused(RolloutArgs, _args(harness="harbor", harbor={"agent": "nop"}, harness_options={"agent": "oracle"}), "harbor", "not both")
    _refused(
        RolloutRequest,
        {**_request().model_dump(), "harness": "pi", "harness_options": {"agent": "nop"}},
        "harness_options",
        "harness 'pi' has no options of its own",
    )
    _refused(RolloutArgs, _args(harness="pi", harbor={"agent": "nop"}), "harbor", "`harbor` options are for harness='harbor', not 'pi'")
    _refused(RolloutArgs, _args(harness="harbor", harbor={"agnet": "nop"}), "agnet", "Extra inputs")


def test_a_task_named_by_the_harness_options_brings_its_own_instruction():
    request = RolloutRequest.model_validate({"endpoint": {"base_url": "http://h/v1", "model": "m"}, "harness": "harbor", "harbor": {"task_dir": "tasks/hello"}})
    assert request.task.instruction and request.harness_options.names_task
    assert RolloutArgs.model_validate({"harness": "harbor", "harness_options": {"dataset": "d"}}).instruction == ""
    _refused(RolloutArgs, {"harness": "harbor"}, "instruction", "instruction is required (it may be left out only when harbor.task_dir")
