"""The README's examples, run as written against a server started as the README says
(`VLLM_URL=... VLLM_MODEL=Qwen/Qwen3-8B harness-env serve`): only the addresses are changed, to
the test's server and scripted policy."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
CLIENT = re.findall(r"<!-- client-example -->\n```python\n(.*?)```", README, re.S)
MCP = re.findall(r"<!-- mcp-example -->\n```python\n(.*?)```", README, re.S)
CLI = re.findall(r"<!-- cli-example -->\n```bash\n(.*?)```", README, re.S)
SERVER = "http://127.0.0.1:8100"  # where the README's server listens
VLLM = "http://127.0.0.1:8000/v1"  # where the README's policy is served
MODEL = "Qwen/Qwen3-8B"
WORK = [{"bash": "echo hello > hello.txt; touch file0.txt file1.txt file2.txt file3.txt"}, {"text": "done"}]


def test_there_are_the_examples_the_tests_run():
    assert len(CLIENT) == 2 and "HarnessEnv(" in CLIENT[0] and "AsyncHarnessEnv(" in CLIENT[1]
    assert len(MCP) == 1 and len(CLI) == 1
    for example in (*CLIENT, *MCP):
        assert SERVER in example
    assert VLLM in CLI[0] and MODEL in CLI[0] and f"VLLM_MODEL={MODEL}" in README


def _run_python(code: str) -> str:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.fixture
def readme_server(start_server, policy_server):
    policy_server.policy.scripts[MODEL] = WORK
    return start_server(env={"VLLM_URL": policy_server.base_url, "VLLM_MODEL": MODEL})


@pytest.mark.parametrize("index", [0, 1])
def test_readme_client_example_runs(index, readme_server):
    out = _run_python(CLIENT[index].replace(SERVER, readme_server.url))
    rewards = re.findall(r"reward (\S+)", out)
    assert rewards and all(r == "1.0" for r in rewards), out
    assert len(rewards) == (1 if index == 0 else 4)


def test_readme_mcp_example_runs(readme_server):
    out = _run_python(MCP[0].replace(SERVER, readme_server.url))
    assert out.strip() == "reward 1.0"


def test_readme_cli_example_runs(tmp_path, policy_server):
    policy_server.policy.scripts[MODEL] = [{"bash": "echo hello > hello.txt"}, {"text": "done"}]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # harness-env, as after ./dev
    p = subprocess.run(["bash", "-e", "-c", CLI[0].replace(VLLM, policy_server.base_url)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    result = (tmp_path / "result.json").read_text()
    assert '"reward": 1.0' in result and '"task_id": "hello-1"' in result
