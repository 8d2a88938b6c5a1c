"""Every face of the server runs its rollouts on the app's one Runner (core/runner.py): a called
rollout (POST /rollout) and a submitted one (POST /rollouts, the job manager) with the same
arguments run the same prepared request. The server's entry points import nothing of the CLI."""

import subprocess
import sys

import httpx
import pytest

from harness_env.core.runner import Runner
from harness_env.core.sandbox.backends import SandboxSettings
from tests.fakes.policy import hello_rollout
from tests.server_process import served_in_process

pytestmark = pytest.mark.e2e


async def test_a_called_and_a_submitted_rollout_run_the_same_prepared_request_on_one_runner(tmp_path, policy_server, monkeypatch):
    from harness_env.server.app import create_app

    ran: list[tuple[Runner, object]] = []
    real = Runner.rollout

    def recording(self, prepared, *a, **kw):
        ran.append((self, prepared.request))
        return real(self, prepared, *a, **kw)

    monkeypatch.setattr(Runner, "rollout", recording)
    body = hello_rollout(policy_server, "one-path")
    make_app = lambda url: create_app(public_url=url, data_dir=tmp_path / "data", sandbox_settings=SandboxSettings(use_bwrap=False))  # noqa: E731
    async with served_in_process(make_app) as url, httpx.AsyncClient(base_url=url, timeout=120) as client:
        called = await client.post("/rollout", json=body)
        submitted = await client.post("/rollouts", json=body)
        assert called.status_code == 200 and submitted.status_code == 202, (called.text, submitted.text)
        job = (await client.get(f"/rollouts/{submitted.json()['rollout_id']}", params={"wait": 60, "detail": "full"})).json()
    assert called.json()["reward"] == 1.0 and job["status"] == "finished" and job["result"]["reward"] == 1.0
    assert [p["name"] for p in job["result"]["phases"]][:2] == ["queue", "endpoint"] == [p["name"] for p in called.json()["phases"]][:2]
    (runner_a, request_a), (runner_b, request_b) = ran
    assert runner_a is runner_b and request_a == request_b


def test_the_server_script_refuses_an_unknown_backend_in_one_line_without_loading_the_cli():
    code = (
        "import sys\n"
        "from harness_env.server.main import main\n"
        "try:\n    main(['--sandbox-backend', 'nowhere'])\nexcept SystemExit as e:\n    code = e.code\n"
        "print(code, sorted(m for m in sys.modules if m.startswith('harness_env.cli')))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.stdout.strip() == "2 []", (p.stdout, p.stderr)
    assert p.stderr == "harness-env: error: unknown --sandbox-backend 'nowhere'; choose one of: local\n"
