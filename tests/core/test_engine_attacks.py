"""Issue 18's attacks on the engine, performed for real: a scripted policy makes the agent (the
white-box loop and Pi's real CLI) run the attack in a real sandbox; each test asserts the reward is
not forged, the rollout returns within its timeouts, and nothing is left behind (conftest checks
the sandboxes directory; `_no_process_left` the processes)."""

from __future__ import annotations

import asyncio
import re
from urllib.parse import urlsplit

import pytest

from harness_env import Endpoint, RolloutRequest, Task, run_rollout
from harness_env.core.errors import ToolMissingError
from harness_env.core.sandbox.backends import SandboxSettings
from harness_env.envs import get_harness
from harness_env.rollout import local_sandboxes
from tests import needs
from tests.envs.test_e2e import _no_process_left

pytestmark = pytest.mark.e2e

# The agent's view of the rollout directory is $(dirname $HOME) (HOME is <rollout>/home).
LINK_FORGE = (
    "R=$(dirname $HOME); mkdir -p $R/workspace/.x; echo 1.0 > $R/workspace/.x/reward.txt; "
    "rm -rf $R/verifier 2>/dev/null; mv $R/verifier $R/workspace/.old 2>/dev/null; ln -s $R/workspace/.x $R/verifier 2>/dev/null; "
    "ln -sf $R/workspace/.x/reward.txt /logs/verifier/reward.txt 2>/dev/null; echo 1.0 > /logs/verifier/reward.txt 2>/dev/null; true"
)
FIFO_FORGE = (
    "R=$(dirname $HOME); mkdir -p $R/workspace/.x; mkfifo $R/workspace/.x/reward.txt; "
    "rm -rf $R/verifier 2>/dev/null; ln -s $R/workspace/.x $R/verifier 2>/dev/null; "
    "rm -f $R/verifier/reward.txt 2>/dev/null; mkfifo $R/verifier/reward.txt 2>/dev/null; mkfifo pipe; true"
)


def _need(harness: str) -> None:
    needs.bwrap()
    try:
        get_harness(harness).check_installed()
    except ToolMissingError as e:
        pytest.fail(f"{e} (./dev test installs it)")


@pytest.fixture
def attack(policy_server):
    async def run(harness: str, command: str, *, verify=("false",), setup=(), use_bwrap=True, **kw):
        _need(harness)
        policy_server.policy.scripts["policy-m"] = [{"bash": command}, {"text": "done"}]
        task = Task(instruction="Do the task.", setup=list(setup), verify=list(verify), task_id="attack")
        kw.setdefault("agent_timeout_s", 60)
        kw.setdefault("verify_timeout_s", 20)
        endpoint = Endpoint(base_url=policy_server.base_url, api_key="sk-attack-upstream-key", model="policy-m")
        req = RolloutRequest(task=task, endpoint=endpoint, harness=harness, **kw)
        sandboxes = local_sandboxes(SandboxSettings(use_bwrap=use_bwrap))
        res = await asyncio.wait_for(run_rollout(req, sandbox_factory=sandboxes), kw["agent_timeout_s"] + kw["verify_timeout_s"] + 60)
        if res.sandbox_id:
            _no_process_left(res)
        return res

    return run


@pytest.mark.parametrize("harness", ["whitebox", "pi"])
async def test_a_verifier_dir_replaced_by_a_link_does_not_forge_the_reward(attack, harness):
    res = await attack(harness, LINK_FORGE)
    assert res.error is None, res.error
    assert res.reward == 0.0 and res.reward_source == "verify_ratio", (res.reward, res.reward_notes)


async def test_a_link_in_plain_mode_does_not_forge_the_reward_either(attack):
    res = await attack("whitebox", LINK_FORGE, use_bwrap=False)
    assert res.error is None, res.error
    assert res.reward == 0.0, (res.reward, res.reward_notes)
    assert any("NOT SAFE" in n for n in res.sandbox_notes)  # plain mode says what it is


@pytest.mark.parametrize("use_bwrap", [True, False])
async def test_a_fifo_as_reward_file_neither_hangs_nor_forges(attack, use_bwrap):
    res = await attack("whitebox", FIFO_FORGE, use_bwrap=use_bwrap)
    assert res.error is None, res.error
    assert res.reward == 0.0
    assert "pipe" not in res.files  # a FIFO in the workspace is not collected (nor opened)
    # Nothing waited on a FIFO: verify ran to its end, and clean-up removed them (a hang fails the fixture's wait_for).
    assert [r.timed_out for r in res.verify_results] == [False]
    assert not any("clean-up" in n for n in res.sandbox_notes), res.sandbox_notes


async def test_a_fifo_reward_file_written_by_verify_is_ignored(attack):
    res = await attack("whitebox", "true", verify=["mkfifo $HARNESS_ENV_REWARD_FILE", "true"])
    assert res.error is None and res.reward == 1.0 and res.reward_source == "verify_ratio"


async def test_a_deep_tree_and_a_big_file_are_cleaned_up(attack):
    # One mkdir -p: bash's `cd` level by level re-reads the whole path each time (45 s of kernel time)
    deep = "D=$(printf 'd/%.0s' $(seq 1500)); mkdir -p $D && cd $D && fallocate -l 1G big.bin; chmod 000 .; true"
    res = await attack("whitebox", deep, verify=["test -d " + "d/" * 1500], agent_timeout_s=120)
    assert res.error is None, res.error
    assert res.reward == 1.0
    assert not any("clean-up" in n for n in res.sandbox_notes), res.sandbox_notes


GIT_PLANTS = (
    "git config --global core.fsmonitor 'echo 1.0 > $HARNESS_ENV_REWARD_FILE; echo'; "
    "git config core.fsmonitor 'echo 1.0 > $HARNESS_ENV_REWARD_FILE; echo'; "
    "printf '#!/bin/sh\\necho 1.0 > $HARNESS_ENV_REWARD_FILE\\n' > .git/hooks/post-checkout; chmod +x .git/hooks/post-checkout; "
    "mkdir -p $HOME/.local/lib/python3.11/site-packages; "
    "echo \"import os; open(os.environ['HARNESS_ENV_REWARD_FILE'], 'w').write('1.0') if 'HARNESS_ENV_REWARD_FILE' in os.environ else None\" "
    "> $HOME/.local/lib/python3.11/site-packages/evil.pth; "
    "echo 'echo 1.0 > $HARNESS_ENV_REWARD_FILE' >> $HOME/.bashrc; cp $HOME/.bashrc $HOME/.profile; "
    "echo 'x=1' > $HOME/.npmrc; true"
)


@pytest.mark.parametrize("use_bwrap", [True, False])
async def test_config_planted_in_home_and_repo_does_not_run_in_verify(attack, use_bwrap):
    verify = ["git status --porcelain | grep -q hello.txt", "git checkout -q -b other", "/usr/bin/python3 -c 'import sys; sys.exit(1)'"]
    res = await attack("whitebox", GIT_PLANTS, setup=["git init -q ."], verify=verify, use_bwrap=use_bwrap)
    assert res.error is None, res.error
    assert res.reward == pytest.approx(1 / 3), (res.reward, res.reward_source, res.verify_results)
    assert res.reward_source == "verify_ratio"


async def test_a_setsid_survivor_is_killed_before_verify_in_plain_mode(attack):
    survivor = (
        "R=$(dirname $HOME); setsid env -i bash -c 'while true; do echo 1.0 > '$R'/verifier/reward.txt 2>/dev/null; "
        "sleep 0.02; done' >/dev/null 2>&1 < /dev/null & true"
    )
    res = await attack("whitebox", survivor, verify=["sleep 1", "false"], use_bwrap=False)
    assert res.error is None, res.error
    assert (res.reward, res.reward_source) == (0.5, "verify_ratio")  # not the survivor's 1.0


async def test_host_files_and_ports_are_out_of_sight(attack, policy_server):
    shadow_head = open("/etc/shadow").readline().split(":")[0]  # "root"
    port = urlsplit(policy_server.base_url).port
    spy = (
        "{ cat /etc/shadow; cat /etc/gshadow; ls /work /opt /srv /var/lib /root/.local; id -u; cat /proc/net/tcp; } > spy.txt 2>&1; "
        f"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo POLICY-REACHED >> spy.txt; "
        "(exec 3<>/dev/tcp/1.1.1.1/80) 2>/dev/null && echo NET-REACHED >> spy.txt; true"
    )
    res = await attack("whitebox", spy, verify=["true"])
    assert res.error is None, res.error
    spy_out = res.files["spy.txt"]
    assert f"{shadow_head}:" not in spy_out
    assert "No such file or directory" in spy_out  # /work, /opt, /srv, /var are not mounted
    assert "main" not in spy_out.split()  # the project checkout (/work/main) is not listed
    assert "65534" in spy_out.split()  # an unprivileged uid
    assert "POLICY-REACHED" not in spy_out and "NET-REACHED" not in spy_out
    sockets = [ln.split() for ln in spy_out.splitlines() if re.match(r"\s*\d+: ", ln)]
    listening = [f[1] for f in sockets if f[3] == "0A"]
    assert listening == ["0100007F:46A0"], listening  # only the in-sandbox forwarder (127.0.0.1:18080)
    assert res.proxy_turns and res.proxy_turns[0].upstream_status == 200  # the capture proxy was reachable


async def test_open_network_is_a_choice(attack, policy_server):
    port = urlsplit(policy_server.base_url).port
    res = await attack("whitebox", f"(exec 3<>/dev/tcp/127.0.0.1/{port}) && echo POLICY-REACHED > net.txt; true", verify=["true"], network="open")
    assert res.error is None and "POLICY-REACHED" in res.files.get("net.txt", "")
    assert any("network open" in n for n in res.sandbox_notes)


@pytest.mark.parametrize("harness", ["whitebox", "pi"])
async def test_pi_and_whitebox_reach_the_proxy_through_the_cut_network(attack, harness):
    res = await attack(harness, "echo hello > hello.txt", verify=["grep -qx hello hello.txt"])
    assert res.error is None and res.reward == 1.0
    assert not any("network" in n for n in res.sandbox_notes), res.sandbox_notes
    assert res.capture_level == "tokens"


async def test_memory_limit_is_enforced_and_reported(attack):
    hog = "python3 -c 'x = bytearray(600 * 1024 * 1024); print(len(x))' > hog.txt 2>&1; echo exit=$? >> hog.txt"
    res = await attack("whitebox", hog, verify=["true"], memory_limit_mb=200)
    assert res.error is None, res.error
    assert "exit=137" in res.files["hog.txt"]  # killed by the OOM killer, not allocated
    assert any("memory limit" in hit for hit in res.limits_hit), res.limits_hit


async def test_process_limit_is_enforced_and_reported(attack):
    # sh, not bash: bash retries a failed fork for seconds
    bomb = "sh -c 'for i in $(seq 300); do sleep 3 & done; wait' 2>/dev/null; true"
    res = await attack("whitebox", bomb, verify=["true"], pids_limit=64)
    assert res.error is None, res.error
    assert any("process limit" in hit for hit in res.limits_hit), res.limits_hit


async def test_disk_limit_is_enforced_and_reported(attack):
    fill = (
        "dd if=/dev/zero of=big.bin bs=1M count=200 2>/tmp/dd.txt; echo exit=$? >> /tmp/dd.txt; rm -f big.bin; "
        "cp /tmp/dd.txt dd.txt; dd if=/dev/zero of=big2.bin bs=1M count=200 2>/dev/null; true"
    )
    res = await attack("whitebox", fill, verify=["true"], disk_limit_mb=64, memory_limit_mb=512)
    assert res.error is None, res.error
    assert "No space left on device" in res.files["dd.txt"] and "exit=1" in res.files["dd.txt"]
    assert any("disk limit" in hit for hit in res.limits_hit), res.limits_hit


async def test_limits_over_the_server_maximum_are_refused(attack, monkeypatch):
    monkeypatch.setenv("HARNESS_ENV_MAX_MEMORY_LIMIT_MB", "1024")
    res = await attack("whitebox", "true", verify=["true"], memory_limit_mb=2048)
    assert res.error_kind == "invalid_request" and "memory_limit_mb=2048" in (res.error or "")
    assert res.reward is None


# Verify writes its checker afresh and imports it isolated from the workspace, as docs/security.md
# advises; the agent planted bytecode for it that Python never checks against a source.
PYC_PLANT = (
    'mkdir -p tests && printf \'import os\\ndef check():\\n    open(os.environ["HARNESS_ENV_REWARD_FILE"], "w").write("1.0")\\n'
    "    return True\\n' > tests/checker.py && python3 -c \"import py_compile, importlib.util as u; "
    "py_compile.compile('tests/checker.py', cfile=u.cache_from_source('tests/checker.py'), "
    'invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)" && rm tests/checker.py && ls tests/__pycache__'
)
PYC_VERIFY = (
    "printf 'def check():\\n    return False\\n' > tests/checker.py && "
    "PYTHONSAFEPATH=1 PYTHONPATH=tests python3 -c 'import checker, sys; sys.exit(0 if checker.check() else 1)'"
)
# A project .npmrc naming the shell npm runs scripts with.
NPMRC_PLANT = (
    "printf '#!/bin/sh\\necho 1.0 > \"$HARNESS_ENV_REWARD_FILE\"\\n' > $HOME/sh.sh && chmod +x $HOME/sh.sh && "
    "printf 'script-shell=%s\\nnode-options=--require %s/x.js\\n' $HOME/sh.sh $HOME > .npmrc"
)
NPM_VERIFY = 'printf \'{"name": "t", "version": "1.0.0", "scripts": {"test": "false"}}\' > package.json && npm test'


@pytest.mark.parametrize(("plant", "verify"), [(PYC_PLANT, PYC_VERIFY), (NPMRC_PLANT, NPM_VERIFY)], ids=["pycache", "npmrc"])
async def test_bytecode_and_project_config_the_agent_planted_run_nothing_in_verify(attack, plant, verify):
    res = await attack("whitebox", plant, verify=[verify])
    assert res.error is None, res.error
    assert (res.reward, res.reward_source) == (0.0, "verify_ratio"), [(r.cmd, r.exit_code, r.stderr[-300:]) for r in res.verify_results]
