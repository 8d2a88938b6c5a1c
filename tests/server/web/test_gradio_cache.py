"""The web UI's Gradio cache is a leased temporary directory: removed when the UI closes, and by the
next start's sweep when the server was killed."""

from __future__ import annotations

import os
from pathlib import Path

from harness_env.core.sandbox.lease import TEMP_DIR_PREFIX, lease_path, read_lease, remove_leased
from harness_env.server import web


def test_the_gradio_cache_made_for_the_ui_carries_this_process_s_lease(monkeypatch):
    monkeypatch.delenv("GRADIO_TEMP_DIR", raising=False)
    monkeypatch.setattr(web, "_own_gradio_cache", None)
    made = web._gradio_environment()
    assert made is not None and os.environ["GRADIO_TEMP_DIR"] == made
    path = Path(made)
    try:
        assert path.is_dir() and path.name.startswith(f"{TEMP_DIR_PREFIX}gradio-")
        lease = read_lease(lease_path(path))
        assert lease is not None and lease.pid == os.getpid()
    finally:
        assert remove_leased(path) is None
    assert not path.exists() and not lease_path(path).exists()


def test_an_operator_s_gradio_temp_dir_is_left_to_the_operator(monkeypatch, tmp_path):
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    monkeypatch.setattr(web, "_own_gradio_cache", None)
    assert web._gradio_environment() is None and not lease_path(tmp_path).exists()
