"""The white-box tools against a real sandbox: bounded output, bad calls as messages, timeouts."""

import json
import re
import time

import pytest

from harness_env.core.errors import InvalidRequestError
from harness_env.core.sandbox.local import create_local_sandbox
from harness_env.envs.whitebox.tools import TOOL_NAMES, TOOL_SPECS, ToolBox, ToolLimits


@pytest.fixture
async def box():
    sandbox = create_local_sandbox(ro_paths=[])
    try:
        yield ToolBox(sandbox, ToolLimits(timeout_s=3, max_output_bytes=1024))
    finally:
        await sandbox.close()
    assert sandbox.alive_pids() == []


def call(box, name, **args):
    return box.call(name, json.dumps(args))


def test_the_tool_set_is_the_documented_one():
    assert TOOL_NAMES == ("bash", "read", "write", "edit", "ls", "grep", "glob", "submit")
    for spec in TOOL_SPECS:
        params = spec["function"]["parameters"]
        assert set(params.get("required", [])) <= set(params["properties"])
        assert spec["function"]["description"] and all(p["description"] for p in params["properties"].values())


async def test_bash_output_is_bounded_to_its_tail_and_says_how_much_was_cut(box):
    r = await call(box, "bash", command="seq 1 5000; echo LAST")
    assert r.content.endswith("LAST\n[exit code 0]")
    assert "bytes cut" in r.content and "\n1\n" not in r.content
    assert len(r.content.encode()) < 1024 + 100


async def test_bash_reports_the_exit_code_and_stderr(box):
    r = await call(box, "bash", command="echo out; echo err >&2; exit 3")
    assert not r.ok and "out" in r.content and "err" in r.content and r.content.endswith("[exit code 3]")


async def test_a_command_past_its_timeout_is_killed_and_the_model_told(box):
    r = await call(box, "bash", command="sleep 60 & sleep 60; echo AFTER")
    assert "timed out after 3s" in r.content and not r.ok and "AFTER" not in r.content
    assert box.sandbox.alive_pids() == []


async def test_the_rollout_deadline_caps_the_per_call_timeout(box):
    box.deadline = time.monotonic() + 1  # before the call's own 3 s
    r = await call(box, "bash", command="sleep 30")
    assert re.search(r"timed out after [01]s", r.content), r.content


async def test_file_tools_round_trip(box):
    assert (await call(box, "write", path="src/a.py", content="x = 1\ny = 2\n")).ok
    assert (await call(box, "read", path="src/a.py")).content == "     1\tx = 1\n     2\ty = 2"
    assert (await call(box, "read", path="src/a.py", offset=2, limit=1)).content == "     2\ty = 2"
    assert (await call(box, "edit", path="src/a.py", old_string="y = 2", new_string="y = 3")).ok
    assert box.sandbox.read_file("src/a.py") == b"x = 1\ny = 3\n"
    assert (await call(box, "ls")).content == "src/"
    assert (await call(box, "glob", pattern="**/*.py")).content == "src/a.py"
    assert (await call(box, "grep", pattern="y = [0-9]", include="*.py")).content == "./src/a.py:2:y = 3"
    assert (await call(box, "grep", pattern="nothing-here")).content == "no matches"


async def test_long_files_are_read_in_pages(box):
    box.sandbox.write_file("big.txt", "".join(f"line {i}\n" for i in range(1, 101)))
    r = await call(box, "read", path="big.txt", limit=10)
    assert r.content.splitlines()[-1] == "[90 more lines; read again with offset=11]"


@pytest.mark.parametrize(
    ("name", "arguments", "says"),
    [
        ("python", '{"code": "1"}', "there is no tool 'python'; the tools are: bash, read"),
        ("bash", '{"command": "ls"', "not valid JSON"),
        ("bash", '["ls"]', "must be a JSON object"),
        ("bash", "{}", "bash needs the argument(s) command"),
        ("bash", '{"command": 5}', "argument command of bash must be a string, got int"),
        ("read", '{"path": "a", "offset": true}', "argument offset of read must be a integer"),
        ("ls", '{"dir": "."}', "ls has no argument(s) dir"),
        ("read", '{"path": "../../../etc/passwd"}', "outside sandbox"),
        ("write", '{"path": "/etc/x", "content": "no"}', "outside sandbox"),
        ("read", '{"path": "missing.txt"}', "No such file"),
        ("edit", '{"path": "e.txt", "old_string": "zz", "new_string": "y"}', "old_string was not found"),
        ("edit", '{"path": "e.txt", "old_string": "a", "new_string": "y"}', "occurs 2 times"),
        ("glob", '{"pattern": "../*"}', "relative to the workspace"),
    ],
)
async def test_a_bad_call_is_an_error_message_for_the_model(box, name, arguments, says):
    box.sandbox.write_file("e.txt", "a a")
    r = await box.call(name, arguments)
    assert not r.ok and r.content.startswith("error: ") and says in r.content


async def test_submit_carries_the_answer(box):
    r = await call(box, "submit", answer="42")
    assert r.submitted == "42"


def test_harness_config_keys_are_checked():
    assert ToolLimits.from_config({"tool_timeout_s": 5}).timeout_s == 5.0
    with pytest.raises(InvalidRequestError, match="unknown keys \\['tool_timeout'\\]"):
        ToolLimits.from_config({"tool_timeout": 5})
    with pytest.raises(InvalidRequestError, match="must be in"):
        ToolLimits.from_config({"max_tool_output_bytes": 10})
