"""The sandbox registry: a server names its backend, the registry makes the factory."""

import pytest

from harness_env.core.errors import InvalidRequestError
from harness_env.core.sandbox import backends
from harness_env.core.sandbox.factory import LocalSandboxFactory


def test_local_is_the_default_and_gets_the_server_s_bubblewrap_setting(monkeypatch):
    monkeypatch.delenv(backends.BACKEND_VAR, raising=False)
    assert backends.default_backend() == "local"
    factory = backends.sandbox_factory("local", backends.SandboxSettings(use_bwrap=False))
    assert factory == LocalSandboxFactory(use_bwrap=False)


def test_the_environment_names_another_backend(monkeypatch):
    monkeypatch.setenv(backends.BACKEND_VAR, "elsewhere")
    assert backends.default_backend() == "elsewhere"


def test_an_unknown_backend_is_refused_naming_the_registered_ones():
    with pytest.raises(InvalidRequestError, match="unknown sandbox backend 'nope'; choose one of: .*local"):
        backends.sandbox_factory("nope", backends.SandboxSettings())


def test_every_backend_s_sweep_runs_and_one_that_fails_is_one_note(monkeypatch):
    swept: list[str] = []

    def broken() -> list[str]:
        raise OSError("the provider is down")

    monkeypatch.setitem(backends.SANDBOX_BACKENDS, "first", backends.SandboxBackend("first", lambda s: None, broken))

    def works() -> list[str]:
        swept.append("second")
        return ["swept second"]

    monkeypatch.setitem(backends.SANDBOX_BACKENDS, "second", backends.SandboxBackend("second", lambda s: None, works))
    notes = backends.sweep_backends()
    assert "sandbox backend 'first': its start-up sweep failed (OSError: the provider is down)" in notes and "swept second" in notes
    assert swept == ["second"]


def test_a_dead_server_s_sandbox_is_removed_by_the_backend_that_claims_it(monkeypatch, tmp_path):
    monkeypatch.setitem(backends.SANDBOX_BACKENDS, "mine", backends.SandboxBackend("mine", lambda s: None, remove=lambda p: "gone" if "mine-" in p else None))
    assert backends.remove_leftover(str(tmp_path / "mine-1")) == "gone"
    assert backends.remove_leftover(str(tmp_path / "nobody-s")) is None  # the local backend claims only its own names
