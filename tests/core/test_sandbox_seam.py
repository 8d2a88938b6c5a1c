"""The engine runs a real rollout through a sandbox backend it has never heard of: the test-only
DirSandbox (tests/fakes/sandbox.py), written from the Sandbox protocol alone."""

import pytest

from harness_env import Endpoint, RolloutRequest, Task, run_rollout
from harness_env.core.registry import HARNESSES
from tests.fakes.sandbox import DirSandboxFactory

pytestmark = pytest.mark.e2e
LOCAL_HARNESSES = [name for name, cls in HARNESSES.items() if not hasattr(cls, "run_trial")]  # those that run in our sandbox


@pytest.mark.parametrize("harness", LOCAL_HARNESSES)
async def test_a_rollout_through_a_second_sandbox_backend(policy_server, harness):
    policy_server.policy.scripts["m"] = [{"bash": "echo hello > hello.txt"}, {"text": "done"}]
    task = Task(instruction="make hello.txt", setup=["echo set > setup.txt"], verify=["grep -qx hello hello.txt", "echo 0.75 > $HARNESS_ENV_REWARD_FILE"])
    factory = DirSandboxFactory()
    res = await run_rollout(
        RolloutRequest(task=task, endpoint=Endpoint(base_url=policy_server.base_url, model="m"), harness=harness, agent_timeout_s=60), sandbox_factory=factory
    )
    assert res.error is None, res.error
    assert res.sandbox_backend == "test-dir" and res.sandbox_notes[0] == "test-only directory sandbox"
    assert res.reward == 0.75 and res.reward_source == "reward_file"
    assert res.files["hello.txt"] == "hello\n" and res.files["setup.txt"] == "set\n"
    assert res.proxy_turns and res.capture_level == "tokens"
    (sandbox,) = factory.made
    assert "echo set > setup.txt" in sandbox.commands and not sandbox.root.exists()
