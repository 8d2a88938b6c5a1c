import os

import pytest

from tests.fakes.policy import FakePolicy, FakePolicyServer
from tests.server_process import ServerProcess


@pytest.fixture
def policy_server():
    with FakePolicyServer(FakePolicy()) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _isolated_sandbox_dir(tmp_path_factory, monkeypatch):
    # Each test gets its own sandboxes root so "nothing left behind" is checkable.
    root = tmp_path_factory.mktemp("sandboxes")
    monkeypatch.setenv("HARNESS_ENV_SANDBOX_DIR", str(root))
    # And its own job store: a server a test starts never writes to the user's data directory.
    monkeypatch.setenv("HARNESS_ENV_DATA_DIR", str(tmp_path_factory.mktemp("data")))
    yield
    leftovers = os.listdir(root)
    assert leftovers == [], f"rollout directories left behind: {leftovers}"


@pytest.fixture
def start_server(tmp_path_factory):
    servers: list[ServerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> ServerProcess:
        s = ServerProcess(tmp_path_factory.mktemp("server-sandboxes"), *args, env=env)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()
        assert os.listdir(s.sandbox_dir) == [], "the server left rollout directories behind"


@pytest.fixture(scope="module")
def module_server(tmp_path_factory):
    """One plain `harness-env serve` (no token) shared by a module's tests that only read from it."""
    s = ServerProcess(tmp_path_factory.mktemp("module-server"))
    try:
        yield s
    finally:
        s.stop()
