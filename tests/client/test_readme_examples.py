"""The Python examples of the README and docs/server.md, run as written against a server started
as the README says (`VLLM_URL=... VLLM_MODEL=Qwen/Qwen3-8B harness-env serve`): only the
addresses are changed, to the test's server and scripted policy. Every Python example of those
pages carries a marker (`<!-- client-example -->`, `<!-- mcp-example -->`), so none goes unrun."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import openenv_env

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
PAGES = {name: (ROOT / name).read_text() for name in ("README.md", "docs/server.md")}
README = PAGES["README.md"]


def examples(kind: str, lang: str = "python") -> list[tuple[str, str]]:
    """(page, code) of every example of a kind, page by page."""
    return [(name, code) for name, text in PAGES.items() for code in re.findall(rf"<!-- {kind}-example -->\n```{lang}\n(.*?)```", text, re.S)]


CLIENT = examples("client")
MCP = examples("mcp")
CLI = [code for _, code in examples("cli", "bash")]
SERVER = "http://127.0.0.1:8100"  # where the README's server listens
VLLM = "http://127.0.0.1:8000/v1"  # where the README's policy is served
MODEL = "Qwen/Qwen3-8B"
WORK = [{"bash": "echo hello > hello.txt; touch file0.txt file1.txt file2.txt file3.txt"}, {"text": "done"}]
ROLLOUTS = {("README.md", "HarnessEnv("): 1, ("README.md", "AsyncHarnessEnv("): 4, ("docs/server.md", "env.submit("): 1}


def _rollouts(page: str, code: str) -> int:
    """How many rollouts a client example runs (each prints its reward)."""
    [n] = [n for (p, mark), n in ROLLOUTS.items() if p == page and mark in code and not (mark == "HarnessEnv(" and "AsyncHarnessEnv(" in code)]
    return n


def test_there_are_the_examples_the_tests_run():
    assert [p for p, _ in CLIENT] == ["README.md", "README.md", "docs/server.md"]
    assert [p for p, _ in MCP] == ["README.md", "docs/server.md", "docs/server.md"] and len(CLI) == 1
    for name, text in PAGES.items():  # an unmarked Python example would not be run
        assert text.count("```python\n") == len([p for p, _ in (*CLIENT, *MCP) if p == name]), name
    for _, example in (*CLIENT, *MCP):
        assert SERVER in example
    assert VLLM in CLI[0] and MODEL in CLI[0] and f"VLLM_MODEL={MODEL}" in README


def _run_python(code: str) -> tuple[str, str]:
    # An example with OpenEnv's client runs in OpenEnv's venv (tests/openenv_env.py), as its users run it.
    python = str(openenv_env.python()) if "openenv" in code else sys.executable
    p = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    # A library's complaint (the MCP SDK logs an ERROR when a progress callback cannot be awaited)
    # is a broken example even when it exits 0.
    assert "ERROR" not in p.stderr and "Traceback" not in p.stderr, p.stderr
    return p.stdout, p.stderr


@pytest.fixture
def readme_server(start_server, policy_server):
    policy_server.policy.scripts[MODEL] = WORK
    return start_server(env={"VLLM_URL": policy_server.base_url, "VLLM_MODEL": MODEL})


@pytest.mark.parametrize("index", range(len(CLIENT)))
def test_client_example_runs(index, readme_server):
    page, code = CLIENT[index]
    out, _ = _run_python(code.replace(SERVER, readme_server.url))
    rewards = re.findall(r"(?:^|\s)reward (\S+)", out, re.M)  # as printed: not an event's "detail='reward 1.0'"
    assert rewards and all(r == "1.0" for r in rewards), out
    assert len(rewards) == _rollouts(page, code)


@pytest.mark.parametrize("index", range(len(MCP)))
def test_mcp_example_runs(index, readme_server):
    _, code = MCP[index]
    out, _ = _run_python(code.replace(SERVER, readme_server.url))
    lines = out.strip().splitlines()
    assert lines[-1] == "reward 1.0", out
    if "progress_callback" in code:  # one line per phase, as they happened
        phases = [line.split()[1].rstrip(":") for line in lines[:-1]]
        assert phases[0] == "endpoint" and "agent" in phases and phases[-1] in ("collect", "done"), out


def test_the_pages_name_every_mcp_tool_the_server_lists(readme_server):
    code = (
        "import asyncio\nfrom mcp import ClientSession\nfrom mcp.client.streamable_http import streamable_http_client\n"
        "async def main():\n    async with streamable_http_client(%r) as (r, w):\n        async with ClientSession(r, w) as s:\n"
        "            await s.initialize()\n            print(' '.join(t.name for t in (await s.list_tools()).tools))\n"
        "asyncio.run(main())\n"
    ) % (readme_server.url + "/mcp")
    tools = set(_run_python(code)[0].split())
    count = {4: "four", 5: "five", 6: "six", 7: "seven"}[len(tools)]
    said = re.search(r"`/mcp` serves .*? with (\w+) tools: (.*?)\. `run_rollout`", README, re.S)
    assert said and said.group(1) == count and set(re.findall(r"`(\w+)`", said.group(2))) == tools, said and said.group(0)
    row = next(line for line in PAGES["docs/server.md"].splitlines() if line.startswith("| `/mcp` |"))
    assert set(re.findall(r"`(\w+)`", row.split("Tools:")[1].split(".")[0])) == tools


def test_readme_cli_example_runs(tmp_path, policy_server):
    policy_server.policy.scripts[MODEL] = [{"bash": "echo hello > hello.txt"}, {"text": "done"}]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # harness-env, as after ./dev
    p = subprocess.run(["bash", "-e", "-c", CLI[0].replace(VLLM, policy_server.base_url)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    result = (tmp_path / "result.json").read_text()
    assert '"reward": 1.0' in result and '"task_id": "hello-1"' in result
