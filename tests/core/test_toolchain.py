import json

import pytest

from harness_env import envs  # noqa: F401 - registers the harnesses: their pins are the table
from harness_env.core import toolchain
from harness_env.core.errors import ToolMissingError


def test_missing_harness_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_ENV_TOOLS_DIR", str(tmp_path))
    with pytest.raises(ToolMissingError, match="run `harness-env install pi`"):
        toolchain.harness_command("pi")


def test_wrong_installed_version_is_reported(tmp_path, monkeypatch):
    pin = toolchain.pin_of("pi")
    pkg = tmp_path / "pi" / "node_modules" / pin.package
    pkg.mkdir(parents=True)
    (pkg / "package.json").write_text(json.dumps({"version": "0.0.1", "bin": {"pi": "cli.js"}}))
    monkeypatch.setenv("HARNESS_ENV_TOOLS_DIR", str(tmp_path))
    with pytest.raises(ToolMissingError, match=f"pi {pin.version} is needed but version 0.0.1 is installed"):
        toolchain.harness_command("pi")


def test_unknown_harness_install_is_refused(tmp_path):
    with pytest.raises(ToolMissingError, match="unknown harness nope"):
        toolchain.install(["nope"], root=tmp_path)


def test_pins_are_the_single_table():
    pins = json.loads(toolchain.pins_json())
    assert pins["pi"]["version"] == toolchain.pin_of("pi").version and pins["node"] == toolchain.NODE_VERSION


def test_each_pin_is_its_harness_class_s_own():
    from harness_env.core.registry import HARNESSES

    assert toolchain.pins() == {name: cls.pin for name, cls in HARNESSES.items() if cls.pin is not None}
    assert all(name == pin.name for name, pin in toolchain.pins().items())  # the install directory is the harness's name


def test_a_harness_finds_its_cli_by_its_own_pin_registered_or_not(tmp_path, monkeypatch):
    """A harness instance carries its pin: one never registered under its name (a subclass made
    for a test, a plug-in wrapping another's CLI) still finds and reports its CLI."""
    from harness_env.core.harness import PinnedCliHarness

    class Unregistered(PinnedCliHarness):
        name = "not-registered"
        pin = toolchain.pin_of("pi")

    h = Unregistered()
    monkeypatch.setenv("HARNESS_ENV_TOOLS_DIR", str(tmp_path))
    assert h.version() is None  # nothing installed here: no version, not "no harness registered"
    with pytest.raises(ToolMissingError, match="run `harness-env install pi`"):
        h.check_installed()
    monkeypatch.delenv("HARNESS_ENV_TOOLS_DIR")
    assert h.version() == toolchain.installed_version("pi") and h.command()[0]
