"""The white-box environment used the way TRL's GRPOTrainer (trl 1.16, the training extra's pin)
uses an `environment_factory`: construct with no arguments, probe with inspect.getmembers, expose
every public method but reset/get_reward as a tool whose schema transformers derives from the type
hints and docstring, reset(**row) per rollout, call tools with parsed arguments, get_reward()."""

import inspect
import os

from transformers.utils import get_json_schema

from harness_env.core.sandbox.local import sandboxes_root
from harness_env.envs.whitebox.tools import TOOL_SPECS
from harness_env.envs.whitebox.trl_env import WhiteboxEnv, close

ROW = {
    "prompt": [{"role": "user", "content": "ignored by the env"}],  # TRL's own column, passed along
    "instruction": "Fix add() so the test passes.",
    "files": {"calc.py": "def add(a, b):\n    return a - b\n"},
    "setup": ["test -f calc.py"],
    "verify": ["python3 -c 'import calc; assert calc.add(2, 3) == 5'"],
}


def trl_tools(env):
    """What TRL 1.16 exposes as tools (GRPOTrainer.__init__ / _generate_and_score_completions)."""
    members = inspect.getmembers(env, predicate=inspect.ismethod)
    names = {n for n, _ in members}
    assert "reset" in names and "get_reward" in names
    return [m for n, m in members if n not in ("reset", "get_reward") and not n.startswith("_")]


def test_trl_sees_the_documented_tools_with_the_documented_schema():
    env = WhiteboxEnv()
    try:
        tools = trl_tools(env)
        schemas = {t.__name__: get_json_schema(t) for t in tools}
        assert sorted(schemas) == sorted(s["function"]["name"] for s in TOOL_SPECS)
        for spec in TOOL_SPECS:
            got = schemas[spec["function"]["name"]]["function"]
            assert got["description"] == spec["function"]["description"]
            assert got["parameters"] == spec["function"]["parameters"], spec["function"]["name"]
    finally:
        close(env)


def test_a_rollout_as_trl_runs_it(monkeypatch):
    env = WhiteboxEnv()  # the factory takes no arguments
    try:
        observation = env.reset(**ROW)
        assert observation == ROW["instruction"]
        tools = {t.__name__: t for t in trl_tools(env)}
        assert "return a - b" in tools["read"](path="calc.py")
        assert tools["edit"](path="calc.py", old_string="a - b", new_string="a + b").startswith("replaced")
        assert tools["bash"](command="python3 -c 'import calc; print(calc.add(2, 3))'") == "5\n[exit code 0]"
        assert tools["submit"](answer="fixed") == "submitted"
        assert env.get_reward() == 1.0 and env.tool_calls == 3 and env.answer == "fixed"
        # The pool reuses instances: a second reset starts from a clean sandbox.
        env.reset(**ROW)
        assert env.get_reward() == 0.0 and env.tool_calls == 0
    finally:
        close(env)
    assert os.listdir(sandboxes_root()) == []


def test_a_failed_setup_leaves_the_rollout_unscored_instead_of_crashing_the_step():
    env = WhiteboxEnv()
    try:
        assert env.reset(**{**ROW, "setup": ["exit 7"]}) == ROW["instruction"]
        assert "exited 7" in env.error
        assert env.bash(command="ls").startswith("error: setup command 'exit 7' exited 7")
        assert env.get_reward() is None
    finally:
        close(env)
