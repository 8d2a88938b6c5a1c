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
