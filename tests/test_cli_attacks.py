"""Issue 18's sandbox attacks through `harness-env run`, as a user (or the held-out red team) runs
it: white-box and Pi, a scripted policy that runs the attack, a real bubblewrap sandbox. The reward
is never forged, the command returns within its timeouts, SIGTERM stops it cleanly, and nothing is
left on disk or running."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time

import pytest

from tests.core.test_engine_attacks import FIFO_FORGE, GIT_PLANTS, LINK_FORGE

CLI = [sys.executable, "-m", "harness_env.cli"]
pytestmark = pytest.mark.e2e

# One process makes the tree (1500 forks of mkdir take long on a loaded 2-core machine).
DEEP = "python3 -c \"import os\nfor _ in range(1500): os.mkdir('d'); os.chdir('d')\"; fallocate -l 256M d/big.bin; true"


def _run_cli(tmp_path, policy_server, harness, attack, *, setup=(), verify=("false",), last=None):
    """`harness-env run` in `tmp_path` (a short_tmp: the CLI's TMPDIR too, which it must leave empty)."""
    policy_server.policy.scripts["m"] = [{"bash": attack}, last or {"text": "done"}]
    task = {"instruction": "do it", "setup": list(setup), "verify": list(verify), "task_id": "cli-attack"}
    (tmp_path / "task.json").write_text(json.dumps(task))
    sandboxes = tmp_path / "sandboxes"
    sandboxes.mkdir(exist_ok=True)
    env = {**os.environ, "HARNESS_ENV_SANDBOX_DIR": str(sandboxes), "TMPDIR": str(tmp_path)}
    p = subprocess.run(
        [
            *CLI,
            "run",
            "--harness",
            harness,
            "--task",
            "task.json",
            "--base-url",
            policy_server.base_url,
            "--model",
            "m",
            "--agent-timeout-s",
            "120",
            "--verify-timeout-s",
            "30",
            "--quiet",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )  # a hang fails
    assert p.returncode == 0, p.stderr
    assert os.listdir(sandboxes) == []
    assert [n for n in os.listdir(tmp_path) if n.startswith("harness-env")] == []  # no socket or temp dir left
    return json.loads(p.stdout)


@pytest.mark.parametrize("harness", ["whitebox", "pi"])
@pytest.mark.parametrize(
    "attack,verify,setup,reward",
    [
        (LINK_FORGE, ["false"], [], 0.0),
        (FIFO_FORGE, ["false"], [], 0.0),
        (GIT_PLANTS, ["git status --porcelain | grep -q hello.txt"], ["git init -q ."], 0.0),
        (DEEP, ["true"], [], 1.0),
    ],
    ids=["link", "fifo", "git-config", "deep-tree"],
)
def test_attacks_through_the_cli(short_tmp, policy_server, harness, attack, verify, setup, reward):
    result = _run_cli(short_tmp, policy_server, harness, attack, setup=setup, verify=verify)
    assert result["error"] is None, result["error"]  # the agent did not run into its timeout
    assert result["reward"] == reward and result["reward_source"] == "verify_ratio"
    assert [r["timed_out"] for r in result["verify_results"]] == [False] * len(verify)  # nor did verify
    assert not any("clean-up" in n for n in result["sandbox_notes"]), result["sandbox_notes"]


# The policy's last answer holds a lone surrogate, escaped as JSON allows (whole, and streamed).
SURROGATE_TEXT = '"done \\udfff"'
SURROGATE_WHOLE = (
    '{"id": "x", "object": "chat.completion", "model": "m", "choices": [{"index": 0, "message": '
    '{"role": "assistant", "content": ' + SURROGATE_TEXT + '}, "finish_reason": "stop"}]}'
)
SURROGATE_STREAM = [
    'data: {"id": "x", "object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, "delta": '
    '{"role": "assistant", "content": ' + SURROGATE_TEXT + '}, "finish_reason": "stop"}]}\n\n',
    "data: [DONE]\n\n",
]


@pytest.mark.parametrize("harness", ["whitebox", "pi"])
def test_what_cannot_be_encoded_still_gives_a_result(short_tmp, policy_server, harness):
    """A file name that is not UTF-8 and the policy's lone surrogate: the command prints the whole
    result (exit 0, no traceback), the name's byte kept as an escape, the text made valid."""
    last = {"raw": SURROGATE_WHOLE if harness == "whitebox" else SURROGATE_STREAM}
    attack = "echo hello > hello.txt && touch \"$(printf 'bad\\377name')\""
    result = _run_cli(short_tmp, policy_server, harness, attack, verify=["grep -qx hello hello.txt"], last=last)
    assert result["reward"] == 1.0
    assert result["files"]["bad\\xffname"] == ""
    assert any(t["completion_text"] == "done \ufffd" for t in result["proxy_turns"])


def test_sigterm_stops_the_cli_and_cleans_up(short_tmp, policy_server):
    nap = f"sleep 300.{secrets.randbelow(10**9):09d}"  # this test's own: other tests sleep 300 at the same time
    policy_server.policy.scripts["m"] = [{"bash": nap}, {"text": "done"}]
    (short_tmp / "task.json").write_text(json.dumps({"instruction": "wait", "verify": ["true"]}))
    sandboxes = short_tmp / "sandboxes"
    sandboxes.mkdir()
    env = {**os.environ, "HARNESS_ENV_SANDBOX_DIR": str(sandboxes), "TMPDIR": str(short_tmp)}
    p = subprocess.Popen(
        [*CLI, "run", "--harness", "whitebox", "--task", "task.json", "--base-url", policy_server.base_url, "--model", "m"],
        cwd=short_tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not any(os.scandir(sandboxes)) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # the agent's sleep is running
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 143, err
    assert "stopped by SIGTERM" in err and "Traceback" not in err
    assert os.listdir(sandboxes) == []
    assert _alive_within(nap.replace(".", "\\."), 5) == []  # killed (a zombie may wait a moment for its reaper)


def _alive_within(pattern: str, seconds: float) -> list[str]:
    """Processes matching `pattern` that are still alive (not zombies) after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        alive = []
        for pid in subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(pid)
            except (OSError, IndexError):
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)
