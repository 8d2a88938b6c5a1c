"""One setup per group, as a trainer sees it: a GRPO group of identical rollouts (in-process
run_many, the white-box harness, bubblewrap) runs the task's setup once, every member starts from
what setup left (an overlay of its own on it, or its own copy), and a failing setup fails every
member that waited for it."""

from __future__ import annotations

import socket
import threading

import pytest

from harness_env import Endpoint, RolloutRequest, Task
from harness_env.core.sandbox import imageroot, rolloutdir, setupfork
from harness_env.core.sandbox.setupfork import BY_OVERLAY
from harness_env.rollout import run_many
from tests.core.sandbox.test_images import image_layout  # noqa: F401 - a tiny image with a world-writable /data

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("needs_bwrap")]


class Counter:
    """A TCP port on loopback that counts connections: setup commands knock on it (setup keeps the
    host's network), so the test knows how many times setup ran."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.count = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.count += 1
            conn.close()

    @property
    def knock(self) -> str:
        return f"(exec 3<>/dev/tcp/127.0.0.1/{self.port})"


@pytest.fixture
def counter():
    c = Counter()
    yield c
    c.sock.close()


def _group(policy_server, n: int, setup: list[str], verify: list[str], agent: str) -> list[RolloutRequest]:
    policy_server.policy.scripts["m"] = [{"bash": agent}, {"text": "done"}]
    task = Task(instruction="work on the setup's files", setup=setup, verify=verify, files={"given.txt": "given\n"})
    return [RolloutRequest(task=task, harness="whitebox", endpoint=Endpoint(base_url=policy_server.base_url, model="m"), agent_timeout_s=60) for _ in range(n)]


async def test_a_group_runs_setup_once_and_each_member_works_on_its_own_copy(policy_server, counter):
    setup = [
        counter.knock,
        "sleep 1",
        "echo setup >> log.txt",
        "echo made-in-setup >> given.txt",
        # a link naming the directory setup ran in (as a venv's scripts name their interpreter)
        "printf '#!/bin/bash\\necho tool-ok\\n' > tool.sh && chmod +x tool.sh && ln -s \"$PWD/tool.sh\" tool",
    ]
    verify = [
        'test "$(cat log.txt)" = "$(printf "setup\\nagent")"',  # setup's line, then this member's own only
        'test "$(cat given.txt)" = "$(printf "given\\nmade-in-setup")"',
        'test "$(./tool)" = tool-ok',
    ]
    results = await run_many(_group(policy_server, 4, setup, verify, "echo agent >> log.txt"), concurrency=4)
    assert [(r.error, r.reward) for r in results] == [(None, 1.0)] * 4, [(r.error, r.verify_results) for r in results]
    assert counter.count == 1
    for r in results:  # every member reports what setup printed, and which ones started from a copy
        assert [c.cmd for c in r.setup_results] == setup and all(c.exit_code == 0 for c in r.setup_results)
    shared = [r for r in results if "run once for the group" in next(p.detail for p in r.phases if p.name == "setup")]
    assert len(shared) == 3
    assert all(BY_OVERLAY in r.sandbox_notes for r in shared)  # as root with overlayfs: mounted, not copied (test_setupfork.py)

    # The saved setup serves a later member too (an eval's next attempt): still one run.
    again = await run_many(_group(policy_server, 1, setup, verify, "echo agent >> log.txt"))
    assert again[0].reward == 1.0 and counter.count == 1


async def test_a_failing_setup_fails_the_whole_group_as_setup_and_is_not_kept(policy_server, counter):
    setup = [counter.knock, "sleep 1", "echo broken >&2; exit 3"]
    results = await run_many(_group(policy_server, 3, setup, ["true"], "true"), concurrency=3)
    assert [(r.error_kind, r.reward) for r in results] == [("setup", None)] * 3
    assert all("exited 3" in (r.error or "") and "broken" in (r.error or "") for r in results)
    assert all(r.setup_results[-1].exit_code == 3 for r in results)
    assert counter.count == 1
    again = await run_many(_group(policy_server, 1, setup, ["true"], "true"))  # not kept: a later rollout tries again
    assert again[0].error_kind == "setup" and counter.count == 2


async def test_a_task_without_setup_commands_or_with_sharing_off_runs_its_own(policy_server, counter, monkeypatch):
    from harness_env.core.sandbox import setuplayers

    monkeypatch.setenv(setuplayers.SIZE_VAR, "0")
    setuplayers.process_setup_layers.cache_clear()
    try:
        setup = [counter.knock, "echo setup >> log.txt"]
        results = await run_many(
            _group(policy_server, 2, setup, ['test "$(cat log.txt)" = "$(printf "setup\\nagent")"'], "echo agent >> log.txt"), concurrency=2
        )
        assert [r.reward for r in results] == [1.0, 1.0] and counter.count == 2
    finally:
        setuplayers.process_setup_layers.cache_clear()


def _no_copy(src, dest) -> None:
    raise AssertionError(f"a member copied {src}")


@pytest.mark.parametrize(("overlay", "note"), [("1", BY_OVERLAY), ("0", "copied the group's setup layer (no overlay: HARNESS_ENV_SETUP_OVERLAY=0)")])
async def test_an_image_groups_members_stack_its_setup_layer_below_their_own_or_copy_it(policy_server, counter, image_layout, monkeypatch, overlay, note):  # noqa: F811
    monkeypatch.setenv("HARNESS_ENV_SETUP_OVERLAY", overlay)
    if overlay == "1":  # a member that copied anything (its directories, its image layer) fails
        for module in (imageroot, rolloutdir, setupfork):
            monkeypatch.setattr(module, "copy_tree", _no_copy)
    setup = [counter.knock, "SECONDS=0; while [ $SECONDS -lt 2 ]; do :; done", "echo setup >> /data/log", "echo setup >> seed.txt"]  # the image has no sleep
    verify = ['test "$(< /data/log)" = "$(printf "setup\\nagent")"', 'test "$(< seed.txt)" = "$(printf "from the image\\nsetup")"']
    requests = [  # each member appends to a file setup made in the image: copied up into its own layer, unseen by the others
        r.model_copy(update={"task": r.task.model_copy(update={"image": image_layout})})
        for r in _group(policy_server, 3, setup, verify, "echo agent >> /data/log")
    ]
    results = await run_many(requests, concurrency=3)
    assert [(r.error, r.reward) for r in results] == [(None, 1.0)] * 3, [(r.error, r.verify_results) for r in results]
    assert counter.count == 1
    assert sum(note in r.sandbox_notes for r in results) == 2
