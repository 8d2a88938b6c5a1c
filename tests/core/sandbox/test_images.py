"""Task images, as a task author uses them: a tiny image built here (the host's bash and its
libraries, plus a program only the image has), in an oci: layout and pushed with skopeo to a real
docker-registry on loopback; white-box rollouts run on it under bubblewrap."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from harness_env import Endpoint, RolloutRequest, Task, run_rollout
from harness_env.core.errors import SandboxError
from harness_env.core.sandbox.cachebound import CacheBound, tree_bytes
from harness_env.core.sandbox.host import mounts_at_or_below, sandboxes_root
from harness_env.core.sandbox.images import (
    SIZE_VAR,
    TEMP_DIR_PREFIX,
    ensure_image,
    evict_images,
    image_cache_bound,
    image_cache_root,
    pinned_source,
    release_image,
    source_of,
)
from harness_env.core.sandbox.lease import lease_path, own_lease, write_lease
from harness_env.core.sandbox.local import create_local_sandbox
from harness_env.core.sandbox.sweep import sweep_sandboxes

TOOLS = {"skopeo": "skopeo", "umoci": "umoci", "docker-registry": "docker-registry"}
ONLY_IN_IMAGE = "#!/bin/bash\necho image-ok\n"
VERIFY = ['test "$(only-in-image)" = image-ok', 'test "$IMAGE_VAR" = from-the-image', 'test "$(pwd)" = /srv/app -a -f seed.txt']


def _needs_tools() -> None:
    missing = [pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"task images need {', '.join(missing)}: apt-get install {' '.join(missing)} (./dev test installs them)")
    if os.geteuid() != 0:
        pytest.fail("a task image's writable layer is an overlay mount: run the suite as root (CI and ./dev test do)")


def _run(*argv: str | Path) -> None:
    subprocess.run([str(a) for a in argv], check=True, capture_output=True, timeout=120)


def _libraries(program: str) -> list[str]:
    out = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
    return [part for line in out.splitlines() for part in line.split() if part.startswith("/")]


@pytest.fixture(scope="module")
def image_layout(tmp_path_factory) -> str:
    """oci:PATH:tiny, an image of bash (with its libraries), /usr/local/bin/only-in-image and a
    WorkingDir /srv/app holding seed.txt, a world-writable /data, and User 4242."""
    return _build_image(tmp_path_factory.mktemp("image"))


def _build_image(
    work: Path,
    env: tuple[str, ...] = (),
    files: dict[str, str] | None = None,
    user: str = "4242:4242",
    libraries_of: tuple[str, ...] = (),
    programs: tuple[str, ...] = (),
) -> str:
    """The image of `image_layout`, with `env` ("NAME=VALUE") added to its config, `files` to its root,
    the shared libraries the programs `libraries_of` load (not the programs) and the host's
    `programs` (names on PATH) with theirs."""
    _needs_tools()
    layout, bundle = work / "layout", work / "bundle"
    _run("umoci", "init", "--layout", layout)
    _run("umoci", "new", "--image", f"{layout}:tiny")
    _run("umoci", "unpack", "--image", f"{layout}:tiny", bundle)
    rootfs = bundle / "rootfs"
    bash = os.path.realpath(shutil.which("bash") or "/bin/bash")
    found = [shutil.which(p) or p for p in programs]
    for path in [bash, *found, *(lib for program in (bash, *libraries_of, *found) for lib in _libraries(program))]:
        for name in {path, os.path.realpath(path)}:  # the loader's and libraries' names as ldd gives them
            dest = rootfs / name.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(name), dest)
    (rootfs / "bin").mkdir(exist_ok=True)
    if not (rootfs / "bin" / "bash").exists():
        shutil.copy2(bash, rootfs / "bin" / "bash")
    tool = rootfs / "usr/local/bin/only-in-image"
    tool.parent.mkdir(parents=True)
    tool.write_text(ONLY_IN_IMAGE)
    tool.chmod(0o755)
    (rootfs / "srv/app").mkdir(parents=True)
    (rootfs / "data").mkdir()
    (rootfs / "data").chmod(0o1777)  # a directory of the image's that anyone may write: lands in each rollout's own layer
    (rootfs / "srv/app/seed.txt").write_text("from the image\n")
    for name, content in (files or {}).items():
        (rootfs / name.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (rootfs / name.lstrip("/")).write_text(content)
    _run("umoci", "repack", "--image", f"{layout}:tiny", bundle)
    _run(
        "umoci",
        "config",
        "--image",
        f"{layout}:tiny",
        "--config.env",
        "PATH=/usr/local/bin:/usr/bin:/bin",
        "--config.env",
        "IMAGE_VAR=from-the-image",
        "--config.workingdir",
        "/srv/app",
        "--config.user",
        user,
        *(a for e in env for a in ("--config.env", e)),
    )
    _run("umoci", "gc", "--layout", layout)
    return f"oci:{layout}:tiny"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def registry_host(tmp_path_factory):
    """A real docker-registry on a loopback port: its host:port."""
    _needs_tools()
    work = tmp_path_factory.mktemp("registry")
    port = _free_port()
    config = work / "config.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {work / 'storage'}\nhttp:\n  addr: 127.0.0.1:{port}\n")
    proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def push(layout: str, ref: str) -> str:
    """`layout` pushed with skopeo to `ref` (on the loopback registry); returns `ref`."""
    _run("skopeo", "copy", "--insecure-policy", "--dest-tls-verify=false", layout, f"docker://{ref}")
    return ref


@pytest.fixture(scope="module")
def registry(registry_host, image_layout):
    """The registry holding the image as test/tiny:1; its reference."""
    return push(image_layout, f"{registry_host}/test/tiny:1")


def _request(policy_server, image: str | None) -> RolloutRequest:
    policy_server.policy.scripts["m"] = [{"bash": "only-in-image > made.txt"}, {"text": "done"}]
    return RolloutRequest(
        task=Task(instruction="run only-in-image", verify=VERIFY, image=image),
        harness="whitebox",
        endpoint=Endpoint(base_url=policy_server.base_url, model="m"),
        agent_timeout_s=60,
    )


def _cache_entries() -> list[str]:
    root = image_cache_root()
    return sorted(os.listdir(root)) if root.exists() else []


def _nothing_mounted() -> None:
    assert mounts_at_or_below(sandboxes_root().resolve()) == []
    assert mounts_at_or_below(image_cache_root().resolve()) == []
    with open("/proc/self/mounts") as f:
        assert str(image_cache_root()) not in f.read()


@pytest.mark.slow
@pytest.mark.usefixtures("needs_bwrap")
async def test_a_task_whose_verify_needs_the_images_program_passes_with_it_and_fails_without(policy_server, registry):
    with_image = await run_rollout(_request(policy_server, registry))
    assert (with_image.reward, with_image.error) == (1.0, None), (with_image.error, with_image.verify_results)
    assert with_image.files.get("made.txt") == "image-ok\n"  # made in the image's WorkingDir: the workspace
    assert with_image.files.get("seed.txt") == "from the image\n"
    assert not any("network open" in note for note in with_image.sandbox_notes), with_image.sandbox_notes
    _nothing_mounted()
    without = await run_rollout(_request(policy_server, None))
    assert without.reward == 0.0 and without.error_kind is None, (without.error, without.verify_results)


@pytest.mark.slow
@pytest.mark.usefixtures("needs_bwrap")
async def test_the_oci_transport_works_and_two_rollouts_share_one_cache_entry(policy_server, image_layout):
    first = await run_rollout(_request(policy_server, image_layout))
    assert first.reward == 1.0, (first.error, first.verify_results)
    [entry] = _cache_entries()
    stamp = os.stat(image_cache_root() / entry).st_ino
    second = await run_rollout(_request(policy_server, image_layout))
    assert second.reward == 1.0, (second.error, second.verify_results)
    assert _cache_entries() == [entry] and os.stat(image_cache_root() / entry).st_ino == stamp  # not pulled again
    assert os.stat(image_cache_root()).st_mode & 0o777 == 0o700  # its setuid files and devices are nobody else's
    _nothing_mounted()


@pytest.mark.slow
@pytest.mark.usefixtures("needs_bwrap")
async def test_an_unreachable_registry_is_one_sandbox_error_and_leaves_nothing(policy_server):
    res = await run_rollout(_request(policy_server, f"127.0.0.1:{_free_port()}/test/tiny:1"))
    assert (res.error_kind, res.reward) == ("sandbox", None)
    assert "could not read image" in res.error and "/test/tiny:1" in res.error
    assert [p.name for p in res.phases if p.name in ("setup", "agent", "verify")] == []
    assert not any(e.startswith(TEMP_DIR_PREFIX) for e in _cache_entries())


@pytest.mark.slow
@pytest.mark.usefixtures("needs_bwrap")
def test_a_pull_that_fails_midway_leaves_no_entry_and_no_temporary_directory(image_layout, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(image_layout.split(":")[1], broken)
    blobs = broken / "blobs" / "sha256"
    biggest = max(blobs.iterdir(), key=lambda p: p.stat().st_size)  # the layer: the manifest still reads
    biggest.unlink()
    with pytest.raises(SandboxError, match="could not pull image"):
        create_local_sandbox(image=f"oci:{broken}:tiny")
    assert _cache_entries() == []  # no entry, no leased temporary directory, no lease


@pytest.mark.slow
@pytest.mark.usefixtures("needs_bwrap")
async def test_the_image_root_keeps_isolation_and_its_writes_are_the_rollouts_own(image_layout):
    a, b = create_local_sandbox(image=image_layout), create_local_sandbox(image=image_layout)
    try:
        r = await a.exec("echo mine > /data/x; echo $UID; [ -e /etc/shadow ] || [ -e /run/harness-env/host/etc ] && echo host-etc; echo done", timeout=30)
        assert r.exit_code == 0 and "done" in r.stdout and "host-etc" not in r.stdout
        assert r.stdout.split()[0] == "4242"  # the image's User (never root)
        assert (await a.exec("echo x > /usr/local/bin/only-in-image", timeout=30)).exit_code != 0  # the image's files are not the agent's
        assert (await a.exec("cat_=$(</data/x); echo $cat_", timeout=30)).stdout.strip() == "mine"  # kept in its layer
        other = await b.exec(f"test -e {a.root}/workspace || echo hidden; test -e /data/x || echo fresh", timeout=30)
        assert other.stdout.split() == ["hidden", "fresh"]
    finally:
        await a.close()
        await b.close()
    _nothing_mounted()


@pytest.mark.slow
@pytest.mark.usefixtures("needs_bwrap")
async def test_the_network_inside_an_image_reaches_the_capture_socket_and_nothing_else(image_layout, registry, tmp_path):
    """proxy_only holds in an image that has neither socat nor setpriv: the host's run there."""
    capture = socket.socket(socket.AF_UNIX)
    capture.bind(str(tmp_path / "capture.sock"))
    capture.listen(8)
    sb = create_local_sandbox(image=image_layout, capture_socket=str(tmp_path / "capture.sock"))
    try:
        assert sb.network_isolated
        port = registry.split("/")[0].rsplit(":", 1)[1]
        r = await sb.exec(f"(exec 3<>/dev/tcp/127.0.0.1/18080) && echo proxy; (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null || echo cut", timeout=30)
        assert r.stdout.split() == ["proxy", "cut"], (r.stdout, r.stderr)
    finally:
        await sb.close()
        capture.close()
    _nothing_mounted()


@pytest.mark.slow
@pytest.mark.usefixtures("needs_bwrap")
async def test_a_killed_owners_image_root_is_unmounted_by_the_next_start(image_layout):
    sb = create_local_sandbox(image=image_layout)
    assert any(m.endswith("/image/root") for m in mounts_at_or_below(sb.root.resolve()))
    dead = subprocess.Popen(["true"])
    dead.wait()
    lease_path(sb.root).unlink()  # as if its server had been killed: a lease naming a dead owner
    write_lease(sb.root, own_lease().model_copy(update={"pid": dead.pid, "start": "1"}))
    notes = sweep_sandboxes()
    assert len(notes) == 1 and "removed rollout" in notes[0], notes
    assert not sb.root.exists()
    _nothing_mounted()
    await sb.close()


def test_a_loopback_registry_is_spoken_to_over_plain_http_and_others_over_tls():
    assert source_of("127.0.0.1:5000/org/name:tag") == ("docker://127.0.0.1:5000/org/name:tag", True)
    assert source_of("localhost:5000/org/name@sha256:" + "a" * 64)[1] is True
    assert source_of("[::1]:5000/org/name:tag")[1] is True
    assert source_of("registry.example/org/name:tag") == ("docker://registry.example/org/name:tag", False)
    assert source_of("oci:/images/layout:tag") == ("oci:/images/layout:tag", False)
    with pytest.raises(SandboxError, match="neither a registry reference"):
        source_of("--src-creds=x")


def test_a_pull_is_pinned_to_the_manifest_read_before_it():
    """The cache entry is named by the digest read first; the pull asks for exactly that manifest,
    never the tag again (a moved tag or a hostile registry would fill the entry with another image)."""
    d = "sha256:" + "b" * 64
    assert pinned_source("docker://127.0.0.1:5000/org/name:tag", d) == f"docker://127.0.0.1:5000/org/name@{d}"
    assert pinned_source("docker://127.0.0.1:5000/org/name", d) == f"docker://127.0.0.1:5000/org/name@{d}"
    assert pinned_source(f"docker://h:1/org/name@sha256:{'c' * 64}", d) == f"docker://h:1/org/name@{d}"
    assert pinned_source("docker://busybox:1", d) == f"docker://busybox@{d}"
    assert pinned_source("oci:/images/layout:tag", d) == "oci:/images/layout:tag"


def test_missing_skopeo_or_bubblewrap_is_one_clear_error(monkeypatch, tmp_path):
    with pytest.raises(SandboxError, match="needs bubblewrap"):
        create_local_sandbox(use_bwrap=False, image="oci:/nowhere:tag")
    monkeypatch.setenv("PATH", str(tmp_path))  # a host without skopeo and umoci
    with pytest.raises(SandboxError, match="need skopeo, which is not installed here; install them: apt-get install skopeo umoci"):
        ensure_image("oci:/nowhere:tag")


@pytest.mark.slow
@pytest.mark.usefixtures("needs_bwrap")
async def test_an_images_loader_settings_reach_only_its_own_programs_never_what_runs_as_root(tmp_path):
    """An image's Env (LD_PRELOAD, ...) and its /etc/ld.so.preload would make the host's root-side
    processes (the entry shell, bwrap, the setpriv that drops to the sandbox's uid) load the image's
    code as root. The loader says each time it is asked to preload: the image's LD_PRELOAD is seen by
    the image's own program alone, its ld.so.preload by nothing."""
    hostile = _build_image(
        tmp_path, env=("LD_PRELOAD=/from-env-missing.so", "GLIBC_TUNABLES=glibc.malloc.check=3"), files={"/etc/ld.so.preload": "/from-file-missing.so\n"}
    )
    sb = create_local_sandbox(image=hostile)
    try:
        r = await sb.exec("echo ran; echo $LD_PRELOAD", timeout=30)
    finally:
        await sb.close()
    assert r.stdout.split() == ["ran", "/from-env-missing.so"], r  # the image's program runs with its Env
    assert r.stderr.count("/from-env-missing.so") == 1, r.stderr  # bash, the command itself: nothing before it
    assert "/from-file-missing.so" not in r.stderr, r.stderr
    _nothing_mounted()


@pytest.mark.slow
@pytest.mark.usefixtures("needs_bwrap")
async def test_an_images_user_never_runs_with_roots_group(tmp_path):
    from harness_env.core.sandbox.host import sandbox_user

    sb = create_local_sandbox(image=_build_image(tmp_path, user="4243:0"))
    try:
        r = await sb.exec("echo $UID ${GROUPS[0]}", timeout=30)
    finally:
        await sb.close()
    assert r.stdout.split() == ["4243", str(sandbox_user()[1])], r


@pytest.mark.usefixtures("needs_bwrap")
async def test_the_cache_keeps_its_bound_least_recently_used_first_never_an_image_in_use(image_layout, tmp_path, monkeypatch):
    other = _build_image(tmp_path / "other", files={"other.txt": "other"})
    third = _build_image(tmp_path / "third", files={"third.txt": "third"})
    entry = {ref: ensure_image(ref) for ref in (image_layout, other)}
    for image in entry.values():
        release_image(image.digest)  # pulled, not in use
    name = {ref: image.digest.replace(":", "-") for ref, image in entry.items()}
    ensure_image(image_layout)  # used again: now `other` is the least recently used
    release_image(entry[image_layout].digest)
    one = max(tree_bytes(image_cache_root() / n) for n in name.values())
    assert evict_images(CacheBound(max_bytes=one + 4096, max_age_s=0)) == [name[other]]
    assert _cache_entries() == [name[image_layout]]

    sandbox = create_local_sandbox(image=other)  # in use: its overlay is mounted
    try:
        monkeypatch.setenv(SIZE_VAR, "0.001")  # smaller than any image: whatever is not in use goes
        pulled = ensure_image(third)  # a pull bounds the cache; it holds its own entry
        assert _cache_entries() == sorted([name[other], pulled.digest.replace(":", "-")])
        release_image(pulled.digest)
    finally:
        await sandbox.close()
    # Unused for longer than the age bound: gone, whatever the size.
    left = _cache_entries()
    assert len(left) == 2 and sorted(evict_images(CacheBound(max_bytes=0, max_age_s=60), now=time.time() + 120)) == left
    assert _cache_entries() == []


def test_a_cache_bound_that_is_not_a_number_is_one_clear_error():
    with pytest.raises(ValueError, match=r"\$HARNESS_ENV_IMAGE_CACHE_MB='lots' is not a number >= 0"):
        image_cache_bound({SIZE_VAR: "lots"})
    assert image_cache_bound({}) == CacheBound(max_bytes=20_480 * 1024**2, max_age_s=14 * 24 * 3600.0)


@pytest.fixture(scope="module")
def distro_layout(tmp_path_factory) -> str:
    """`image_layout` with what a distribution's base image has for Node (glibc, libstdc++), but
    neither Node nor any harness CLI."""
    from harness_env.core import toolchain
    from harness_env.envs import get_harness

    get_harness("pi")  # registers the pins
    node = toolchain.harness_command("pi")[0]
    return _build_image(tmp_path_factory.mktemp("distro"), libraries_of=(node,))


@pytest.mark.e2e
@pytest.mark.usefixtures("needs_bwrap")
@pytest.mark.parametrize("harness", ["pi", "codex"])
async def test_a_harness_cli_runs_inside_an_image_that_has_none_of_the_toolchain(policy_server, distro_layout, registry_host, harness):
    """The CLI and Node come from the host's tools directory (read-only); the command the model
    asks for runs in the image (pulled from the loopback registry): its program, its WorkingDir and
    its environment."""
    from tests.envs.harnesses import installed

    harness = installed(harness)
    image = push(distro_layout, f"{registry_host}/test/distro:1")
    model = f"image-{harness}"
    policy_server.policy.scripts[model] = [{"bash": "only-in-image > made.txt"}, {"text": "done"}]
    res = await run_rollout(
        RolloutRequest(
            task=Task(instruction="run only-in-image", verify=VERIFY, image=image),
            harness=harness,
            endpoint=Endpoint(base_url=policy_server.base_url, model=model),
            agent_timeout_s=120,
        )
    )
    assert (res.reward, res.error) == (1.0, None), (res.error, res.verify_results, res.agent_log_tail)
    assert res.files.get("made.txt") == "image-ok\n"
    assert res.graph.branches == 1 and res.graph.trained_share == 1.0
    _nothing_mounted()
