"""OpenEnv's venv (tests/openenv_env.py): a missing one fails the OpenEnv checks with how to make it,
never skips them."""

import subprocess

import pytest

from tests import openenv_env


def test_a_missing_openenv_venv_is_an_error_naming_the_install(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_ENV_TOOLS_DIR", str(tmp_path))
    assert not openenv_env.installed()
    for attempt in (lambda: openenv_env.cli("--help"), lambda: openenv_env.check("mcp_client", {}), openenv_env.python):
        with pytest.raises(RuntimeError, match="no OpenEnv installed at .*tests.openenv_env install"):
            attempt()


def test_the_installed_venv_holds_the_pinned_openenv_and_nothing_of_ours():
    run = openenv_env.cli("--help", timeout=120)
    assert run.returncode == 0 and "validate" in run.stdout, run.stderr
    code = "import importlib.metadata as m, importlib.util as u; print(m.version('openenv'), u.find_spec('harness_env') is None)"
    out = subprocess.run([str(openenv_env.python()), "-c", code], capture_output=True, text=True, cwd="/", timeout=120)
    assert out.stdout.split() == [openenv_env.OPENENV_PIN.split("==")[1], "True"], out.stderr
