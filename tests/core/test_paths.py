"""Paths a remote caller names stay under the operator's root; bad names are one clear error."""

import pytest

from harness_env.core.errors import InvalidRequestError
from harness_env.core.paths import confined_path

VAR = "HARNESS_ENV_TEST_ROOT"


@pytest.fixture
def root(tmp_path, monkeypatch):
    (tmp_path / "root" / "sub").mkdir(parents=True)
    monkeypatch.setenv(VAR, str(tmp_path / "root"))
    return tmp_path / "root"


def test_remote_relative_paths_are_under_the_root(root):
    assert confined_path("sub", VAR, "dataset", trusted=False) == root / "sub"
    assert confined_path(str(root / "sub"), VAR, "dataset", trusted=False) == root / "sub"


@pytest.mark.parametrize("path", ["..", "sub/../..", "/etc", "sub/../../root-sibling"])
def test_remote_paths_outside_the_root_are_refused(root, path):
    with pytest.raises(InvalidRequestError, match=f"must lie under \\${VAR}"):
        confined_path(path, VAR, "dataset", trusted=False)


def test_remote_tilde_is_a_literal_name_not_the_servers_home(root, monkeypatch):
    monkeypatch.delenv("HOME", raising=False)  # as under a service manager: expanding ~ would raise
    assert confined_path("~", VAR, "dataset", trusted=False) == root / "~"
    assert confined_path("~nosuchuser/x", VAR, "dataset", trusted=False) == root / "~nosuchuser" / "x"


@pytest.mark.parametrize(
    ("path", "said"), [("a\x00b", "NUL byte"), ("\ud800", "not valid UTF-8"), ("0" * 20 + "\x80" * 200, "too long"), ("/".join(["d" * 200] * 21), "too long")]
)
@pytest.mark.parametrize("trusted", [True, False])
def test_names_the_os_cannot_hold_are_refused(root, path, said, trusted):
    with pytest.raises(InvalidRequestError, match=said):
        confined_path(path, VAR, "dataset", trusted=trusted)


def test_trusted_callers_get_home_expansion_and_a_clear_error_for_unknown_users(root, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert confined_path("~/root", VAR, "dataset", trusted=True) == root
    with pytest.raises(InvalidRequestError, match="home directory is unknown"):
        confined_path("~nosuchuser-harness-env/x", VAR, "dataset", trusted=True)


def test_remote_paths_need_the_root_configured(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    with pytest.raises(InvalidRequestError, match=f"only under \\${VAR}, which is not set"):
        confined_path("sub", VAR, "dataset", trusted=False)
