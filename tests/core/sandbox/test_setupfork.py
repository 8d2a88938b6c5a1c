"""A group member started from the saved setup layer by overlay (core/sandbox/setupfork.py):
nothing is copied, a member neither sees nor changes another member's files or the layer, the
overlays go with the member (close, and the sweep after its server was killed), a layer under a
live member is never evicted, and where overlays cannot be had each member copies, saying why."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness_env.core.errors import SandboxError
from harness_env.core.sandbox import setupfork
from harness_env.core.sandbox.cachebound import CacheBound
from harness_env.core.sandbox.host import mount_table, mounts_at_or_below, sandboxes_root
from harness_env.core.sandbox.images import image_cache_root
from harness_env.core.sandbox.lease import remove_leased
from harness_env.core.sandbox.local import create_local_sandbox
from harness_env.core.sandbox.rolloutdir import AGENT_DIRS
from harness_env.core.sandbox.setuplayers import MEMORY_VAR, SetupLayers, mounted_layers
from harness_env.core.sandbox.sweep import remove_rollout, sweep_sandboxes, sweep_temp_dirs

pytestmark = pytest.mark.usefixtures("needs_bwrap")
KEY = "a" * 64
SETUP = "echo setup > kept.txt && echo setup > changed.txt && echo setup > removed.txt && mkdir -p pkg && echo lib > pkg/lib.py"


@pytest.fixture
def as_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("overlay mounts need root: run the suite as root (CI and ./dev test do)")


@pytest.fixture
async def layer(as_root):
    """A saved setup layer, made by a leader sandbox as the engine makes one (its cache removed after)."""
    layers = SetupLayers(CacheBound(1 << 30, 3600.0))
    lead = create_local_sandbox()
    try:
        assert (await lead.exec(SETUP, timeout=30)).exit_code == 0
        saved = layers.save(KEY, lead.root, AGENT_DIRS, None, [])
    finally:
        await lead.close()
    yield layers, saved
    assert remove_leased(layers._root()) is None


def _mounts() -> str:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return f.read()


def _tmpfs_at(path: str | Path) -> bool:
    return any(f[1] == os.path.realpath(path) and f[2] == "tmpfs" for f in mount_table())


def _tree(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): p.read_text() for p in sorted(path.rglob("*")) if p.is_file()}


async def test_members_start_by_overlay_and_neither_see_nor_change_each_other_or_the_layer(layer, monkeypatch):
    monkeypatch.delenv(setupfork.OVERLAY_VAR, raising=False)
    _, saved = layer
    before = _tree(saved.path)
    a, b = create_local_sandbox(setup_layer=saved), create_local_sandbox(setup_layer=saved)
    try:
        assert a.notes[-1] == setupfork.BY_OVERLAY and b.notes[-1] == setupfork.BY_OVERLAY
        assert f" {a.workspace} " in _mounts() and f"lowerdir={saved.path}/workspace" in _mounts()
        write = "echo a >> changed.txt && rm removed.txt && echo mine > new.txt && echo a >> pkg/lib.py && echo a > $HOME/h && id -u"
        r = await a.exec(write, timeout=30)
        assert r.exit_code == 0, r.stderr
        assert r.stdout.strip() != "0"  # an unprivileged uid wrote through the overlay
        # B still has what setup left, and none of A's files; neither A's directory nor the layer is in its view.
        r = await b.exec("cat kept.txt changed.txt removed.txt pkg/lib.py; ls; test -e $HOME/h || echo no-h", timeout=30)
        assert r.stdout.split() == ["setup", "setup", "setup", "lib", "changed.txt", "kept.txt", "pkg", "removed.txt", "no-h"]
        r = await b.exec(f"ls {a.root} {saved.path}", timeout=30)
        assert r.exit_code != 0 and r.stdout == "" and r.stderr.count("No such file") == 2
        # A's writes are its own: in its upper directories, never in the layer.
        r = await a.exec(f"cat changed.txt; test -e removed.txt || echo gone; cat new.txt; ls {saved.path}", timeout=30)
        assert r.stdout.split() == ["setup", "a", "gone", "mine"] and "cannot access" in r.stderr
        assert (a.root / setupfork.FORK_DIR / "workspace" / "upper" / "new.txt").read_text() == "mine\n"
        assert _tree(saved.path) == before
        # A cannot write into its overlays' own directories (the server's), nor below the layer.
        r = await a.exec(f"ls {a.root / setupfork.FORK_DIR} || touch {a.root / setupfork.FORK_DIR}/x", timeout=30)
        assert r.exit_code != 0
    finally:
        await a.close()
        await b.close()
    assert a.root.as_posix() not in _mounts() and b.root.as_posix() not in _mounts()
    assert not a.root.exists() and not b.root.exists()
    assert _tree(saved.path) == before


async def test_a_member_whose_server_is_killed_leaves_nothing_after_the_sweep(layer):
    """SIGKILL the process that made a member (its close never runs): the next start's sweep
    detaches the member's overlays and removes its directory and the dead server's layers."""
    env = {**os.environ, "HARNESS_ENV_SETUP_OVERLAY": "1"}
    script = textwrap.dedent(
        """
        import json, sys, time
        from harness_env.core.sandbox.cachebound import CacheBound
        from harness_env.core.sandbox.local import create_local_sandbox
        from harness_env.core.sandbox.setuplayers import SetupLayers, mounted_layers
        layers = SetupLayers(CacheBound(1 << 30, 3600.0))
        lead = create_local_sandbox()
        (lead.root / "workspace" / "f").write_text("setup")
        layer = layers.save("b" * 64, lead.root, ("workspace", "home", "tmp", "xdg", "logs"), None, [])
        member = create_local_sandbox(setup_layer=layer)
        print(json.dumps([str(member.root), str(layer.path), member.notes[-1]]), flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        root, layer_path, note = json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert note == setupfork.BY_OVERLAY
    assert f" {root}/workspace " in _mounts()  # the kill left the member's overlays
    notes = sweep_sandboxes(sandboxes_root())
    assert any("removed rollout" in n for n in notes), notes
    assert root not in _mounts() and layer_path not in _mounts()
    assert not Path(root).exists() and not any(sandboxes_root().iterdir())
    assert _tmpfs_at(Path(layer_path).parent)  # the dead server's cache, in memory
    sweep_temp_dirs(image_cache_root())  # the dead server's setup cache
    assert not Path(layer_path).exists() and not _tmpfs_at(Path(layer_path).parent)


async def test_a_layer_under_a_live_member_is_never_evicted(layer):
    layers, saved = layer
    layers.bound = CacheBound(1, 0.0)  # every layer is past the bound
    member = create_local_sandbox(setup_layer=saved)
    try:
        assert layers.evict() == [] and saved.path.is_dir()
        assert (await member.exec("cat kept.txt", timeout=30)).stdout == "setup\n"
    finally:
        await member.close()
    assert layers.evict() == [KEY] and not saved.path.exists()


async def test_members_copy_the_layer_where_overlays_cannot_be_mounted_and_say_why(layer, monkeypatch):
    _, saved = layer
    monkeypatch.setenv(setupfork.OVERLAY_VAR, "0")
    member = create_local_sandbox(setup_layer=saved)
    try:
        assert member.notes[-1] == f"copied the group's setup layer (no overlay: {setupfork.OVERLAY_VAR}=0)"
        assert member.root.as_posix() + "/workspace " not in _mounts()
        assert (await member.exec("cat kept.txt", timeout=30)).stdout == "setup\n"
    finally:
        await member.close()

    monkeypatch.delenv(setupfork.OVERLAY_VAR)
    monkeypatch.setattr(setupfork, "host_refusal", lambda: "the server is not root (an overlay mount needs root)")
    member = create_local_sandbox(setup_layer=saved)
    try:
        assert "no overlay: the server is not root" in member.notes[-1]
        assert (await member.exec("cat kept.txt", timeout=30)).stdout == "setup\n"
    finally:
        await member.close()


async def test_a_member_whose_mounts_fail_part_way_copies_with_none_of_them_left(layer, monkeypatch):
    _, saved = layer
    monkeypatch.delenv(setupfork.OVERLAY_VAR, raising=False)
    real = setupfork.mount_overlay
    calls = []

    def third_fails(lower: str, upper: Path, work: Path, target: Path) -> str | None:
        calls.append(target)
        return "could not mount an overlay: refused" if len(calls) == 3 else real(lower, upper, work, target)

    monkeypatch.setattr(setupfork, "mount_overlay", third_fails)
    member = create_local_sandbox(setup_layer=saved)
    try:
        assert member.notes[-1] == "copied the group's setup layer (no overlay: could not mount an overlay: refused)"
        assert [m for m in mounts_at_or_below(member.root) if m != str(member.root)] == []  # its tmpfs only
        assert not (member.root / setupfork.FORK_DIR).exists()
        assert (await member.exec("cat kept.txt pkg/lib.py", timeout=30)).stdout == "setup\nlib\n"
    finally:
        await member.close()


def test_the_layers_some_overlay_has_below_it_are_found_by_name(layer, tmp_path):
    layers, saved = layer
    assert mounted_layers(layers._root()) == set()
    member_dir = tmp_path / "m"
    member_dir.mkdir()
    (member_dir / "workspace").mkdir()
    assert setupfork.mount_fork(saved, member_dir, ("workspace",)) is None
    try:
        assert mounted_layers(layers._root()) == {KEY}
    finally:
        subprocess.run(["umount", str(member_dir / "workspace")], check=True)
    assert mounted_layers(layers._root()) == set()


async def test_a_dead_servers_member_named_by_the_job_store_is_removed_with_its_overlays(layer):
    """server/jobs/upkeep.py removes the sandbox directory of a job whose server died (sweep.remove_rollout)."""
    _, saved = layer
    member = create_local_sandbox(setup_layer=saved)
    try:
        assert member.notes[-1] == setupfork.BY_OVERLAY and f"{member.root}/" in _mounts()
        assert remove_rollout(str(member.root)) == "sandbox directory removed"
        assert str(member.root) not in _mounts() and not member.root.exists()
        assert (saved.path / "workspace" / "kept.txt").read_text() == "setup\n"
    finally:
        await member.close()


def test_the_setup_cache_is_a_tmpfs_of_its_own_that_goes_with_it_and_can_stay_on_disk(as_root, monkeypatch):
    monkeypatch.delenv(MEMORY_VAR, raising=False)
    layers = SetupLayers(CacheBound(64 << 20, 3600.0))
    root = layers._root()
    assert layers.in_memory
    mine = [f for f in mount_table() if f[1] == os.path.realpath(root)]
    assert [(f[2], "size=131072k" in f[3]) for f in mine] == [("tmpfs", True)]  # twice the bound
    assert os.stat(root).st_mode & 0o777 == 0o700
    assert remove_leased(root) is None
    assert not root.exists() and not _tmpfs_at(root)

    monkeypatch.setenv(MEMORY_VAR, "0")
    on_disk = SetupLayers(CacheBound(64 << 20, 3600.0))
    try:
        assert not on_disk.in_memory and mounts_at_or_below(on_disk._root()) == []
    finally:
        assert remove_leased(on_disk._root()) is None


async def test_a_layer_the_memory_cache_cannot_hold_is_not_saved_and_nothing_half_written_stays(as_root, monkeypatch):
    """The tmpfs holds twice the bound: a setup that left more fails its save (the group's members
    then run their own setup), and the cache keeps no part of it."""
    monkeypatch.delenv(MEMORY_VAR, raising=False)
    layers = SetupLayers(CacheBound(1 << 20, 3600.0))
    lead = create_local_sandbox()
    try:
        assert (await lead.exec("head -c 3000000 /dev/zero > big.bin", timeout=30)).exit_code == 0
        with pytest.raises(SandboxError, match="could not copy the group's setup layer: .*No space left"):
            layers.save(KEY, lead.root, AGENT_DIRS, None, [])
        assert list(layers._root().iterdir()) == [] and layers.find(KEY) is None
    finally:
        await lead.close()
        assert remove_leased(layers._root()) is None
