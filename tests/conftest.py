import os
import shutil
import tempfile
from pathlib import Path

import pytest

from harness_env.core.sandbox.host import mounts_at_or_below, sandboxes_root
from tests import needs
from tests.fakes.loopback import LoopbackServer
from tests.fakes.policy import FakePolicy, FakePolicyServer
from tests.fakes.tap import Tap
from tests.leftovers import Before
from tests.server_process import ServerProcess
from tests.vllm_engine import VllmServer

# On several workers, torch (in the workers and the processes they start) computes on one thread:
# with two per worker on this 2-core machine, the same forward and backward pass cost 52 s of CPU,
# not 31 (OpenMP threads spinning for each other), and the suite is bound by the CPU.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# The fast tier, `pytest -m unit`: no harness CLI (e2e), no real model, no browser, no database
# server, no server process. Derived from what a test uses, so a new test is sorted without a mark.
HEAVY_MARKS = {"e2e", "real_model", "slow"}
RAY_TESTS = Path(__file__).parent / "server" / "ray"
HEAVY_FIXTURES = {"vllm_server", "raw_vllm_server", "tap", "postgres_server", "chromium", "web_server", "start_server", "module_server"}


# `./dev test` runs the suite on several pytest-xdist workers (`--dist loadgroup`). What shares one
# resource runs on one worker, in turn: the one vLLM ("model": its tests load weights into it and
# time its answers), the real model in torch without vLLM ("torch": the CPU training tests, kept
# apart from each other, not from vLLM's, which was the suite's critical path), a local Ray
# cluster, and a module's tests that share a module-scoped fixture (its server).
MODEL_FIXTURES = {"vllm_server", "raw_vllm_server", "tap"}


def _xdist_group(item: pytest.Item, marks: set[str]) -> str | None:
    if MODEL_FIXTURES & set(item.fixturenames):
        return "model"
    if "real_model" in marks:
        return "torch"
    if item.path.is_relative_to(RAY_TESTS):
        return "ray"
    defs = getattr(item, "_fixtureinfo", None)
    scopes = {d.scope for fixturedefs in (defs.name2fixturedefs.values() if defs else ()) for d in fixturedefs}
    return str(item.path) if scopes & {"module", "package", "class"} else None


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the test ids
def pytest_collection_modifyitems(items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        marks = {m.name for m in item.iter_markers()}
        heavy = HEAVY_MARKS & marks or HEAVY_FIXTURES & set(item.fixturenames) or (callspec is not None and callspec.params.get("store_url") == "postgresql")
        if not heavy:
            item.add_marker(pytest.mark.unit)
        if "xdist_group" not in marks and (group := _xdist_group(item, marks)):
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def needs_bwrap():
    """`pytest.mark.usefixtures("needs_bwrap")`: fails, saying how to install it, without bubblewrap."""
    needs.bwrap()


@pytest.fixture
def short_tmp():
    """A directory with a short path, directly in the temporary directory, removed after the test:
    a TMPDIR for a process whose capture socket lives there (a socket's path holds 107 bytes, and
    pytest's own directories under xdist are too deep for it)."""
    path = Path(tempfile.mkdtemp(prefix="he-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def policy_server():
    with FakePolicyServer(FakePolicy()) as srv:
        yield srv


@pytest.fixture(scope="session")
def vllm_server():
    """One real vLLM for the whole suite (float32, processed logprobs), started by the first test
    that asks for it. Not installed is a failure that says how to install it, never a skip.
    HARNESS_ENV_TEST_VLLM_PORT names one already serving on loopback (`python -m tests.vllm_engine
    serve`), for a developer running a few tests at a time."""
    port = os.environ.get("HARNESS_ENV_TEST_VLLM_PORT")
    if port:
        yield VllmServer(port=int(port))
        return
    with VllmServer() as srv:
        yield srv


@pytest.fixture
def tap(vllm_server):
    """A recording pass-through (tests/fakes/tap.py) in front of the real vLLM: point the rollout's
    endpoint at `tap.base_url`."""
    recorder = Tap(vllm_server.root_url)
    with LoopbackServer(recorder) as srv:
        recorder.base_url = srv.base_url
        yield recorder


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
    assert mounts_at_or_below(root.resolve()) == [], "mounts left behind"


@pytest.fixture(scope="session", autouse=True)
def _the_suite_leaves_nothing(tmp_path_factory):
    """Gradio's cache in a directory of this session's, removed at the end; and at the end nothing
    of the suite's own is left: whatever is (rollouts of killed runs and servers, their mounts,
    cgroups and sockets) is swept, so the machine is clean, and reported as a failure. Looked for
    under pytest's temporary base AND in the default sandbox directory (tests/leftovers.py)."""
    before = Before.take(tmp_path_factory.getbasetemp(), sandboxes_root())  # before any test sets HARNESS_ENV_SANDBOX_DIR
    gradio = tmp_path_factory.mktemp("gradio")
    saved = os.environ.get("GRADIO_TEMP_DIR")
    os.environ["GRADIO_TEMP_DIR"] = str(gradio)
    yield
    if saved is None:
        os.environ.pop("GRADIO_TEMP_DIR", None)
    else:
        os.environ["GRADIO_TEMP_DIR"] = saved
    shutil.rmtree(gradio, ignore_errors=True)
    left, in_default = before.left_mounted(), before.left_in_default_root()
    swept = before.sweep(left)
    assert left == [], f"the suite left mounted: {left} (swept now: {swept})"
    assert in_default == [], f"the suite left in the default sandbox directory {before.default_root}: {in_default} (swept now: {swept})"


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
