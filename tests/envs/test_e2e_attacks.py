"""Issue 25's criticals for every harness that runs in our sandbox: the real CLI (or the white-box
loop) runs the attack the scripted policy asks for, through the capture proxy, in bubblewrap.

- Git in verify starts no program the agent planted (a diff driver, textconv, a signature program).
- The agent cannot opt out of grading: killing its own harness or sleeping past the timeout ends
  the rollout graded (verify runs on what is there), with error_kind saying what happened.
"""

from __future__ import annotations

import pytest

from harness_env import run_rollout
from tests.envs.test_e2e import CLI_HARNESSES, _no_process_left, harness, make_request  # noqa: F401  (fixtures)

pytestmark = pytest.mark.e2e

REPO = "git init -q . && git config user.email a@b && git config user.name a && echo one > f.txt && git add f.txt && git commit -qm first"
# Planted by the agent: every way of making verify's git run its program that git offers, a
# program that forges the reward.
GIT_PLANT = (
    "printf '#!/bin/sh\\necho 1.0 > \"$HARNESS_ENV_REWARD_FILE\"\\ncat\\n' > $HOME/evil.sh && chmod +x $HOME/evil.sh && "
    "echo '* diff=evil filter=evil' > .gitattributes && git config diff.evil.command $HOME/evil.sh && "
    "git config diff.evil.textconv $HOME/evil.sh && git config filter.evil.clean $HOME/evil.sh && "
    "git config gpg.ssh.program $HOME/evil.sh && git config log.showSignature true && git config core.pager $HOME/evil.sh && "
    "echo hello > hello.txt"
)
# A commit with a forged OpenPGP signature on top: `git log` with log.showSignature runs gpg.program.
FORGE = (
    "p=$(git rev-parse HEAD); t=$(git rev-parse 'HEAD^{tree}'); printf 'tree %s\\nparent %s\\nauthor a <a@b> 1 +0000\\n"
    "committer a <a@b> 1 +0000\\ngpgsig -----BEGIN PGP SIGNATURE-----\\n \\n iQEz\\n -----END PGP SIGNATURE-----\\n\\n"
    'forged\\n\' "$t" "$p" > c.txt; git update-ref HEAD $(git hash-object -t commit -w c.txt); rm c.txt\n'
)


def written_by_printf(text: str, path: str) -> str:
    """A shell command that writes `text` to `path` with no quote, `$` or backquote of its own in
    the command line (Gemini CLI refuses a command with a command substitution in it)."""
    return "printf '" + "".join(c if c.isalnum() or c in " -_./:<>@{}^;|=+," else f"\\{ord(c):03o}" for c in text) + f"' > {path}"


GIT_PLANT += f" && {written_by_printf(FORGE, '$HOME/forge.sh')} && sh $HOME/forge.sh && git config gpg.program $HOME/evil.sh"
# Honest verify: the agent did not touch f.txt as asked (the first command fails), and ordinary git
# commands that must work, two of them reading the forged signature's commit.
GIT_VERIFY = [
    "git diff HEAD -- f.txt | grep -q '^+two'",
    "git log -p | grep -q first",
    "git blame f.txt",
    "test -f hello.txt",
    "git log -1 --format=%s | grep -qx forged",
    "git log --oneline | grep -q first",
]
# Kills every process of its own sandbox above this shell: the harness's CLI dies mid-run. (No
# command substitution: Gemini CLI refuses to run a command with one.)
KILL_HARNESS = (
    'p=$PPID; while [ "$p" -gt 1 ] && grep -qa HARNESS_ENV_SANDBOX_ID= /proc/$p/environ; do read -r _ _ _ n _ < /proc/$p/stat; kill -9 $p; p=$n; done'
)


async def test_git_in_verify_does_not_run_what_the_agent_planted(policy_server, make_request):  # noqa: F811 - an imported fixture
    script = [{"bash": GIT_PLANT}, {"text": "done"}]
    res = await run_rollout(make_request(script, setup=[REPO], verify=GIT_VERIFY))
    assert res.error is None, res.error
    assert (res.reward, res.reward_source) == (5 / 6, "verify_ratio"), [(r.cmd, r.exit_code, r.stderr[-200:]) for r in res.verify_results]
    notes = " ".join(res.sandbox_notes)
    assert "diff.evil.command" in notes and "gpg.program" in notes, res.sandbox_notes  # the result says what was dropped
    _no_process_left(res)


async def test_sleeping_past_the_timeout_is_graded(policy_server, make_request, harness):  # noqa: F811 - an imported fixture
    # Slept again at every step: a harness whose shell tool has its own timeout (Codex's) is still
    # held past agent_timeout_s.
    script = [{"bash": "echo hello > hello.txt; sleep 900"}, *[{"bash": "sleep 900"}] * 40, {"text": "done"}]
    # Long enough for the CLI to start on a busy machine and make its first call (OpenCode is the slowest).
    timeout = {"opencode": 60, "whitebox": 8}.get(harness, 40)
    res = await run_rollout(make_request(script, verify=["test -f hello.txt", "false"], agent_timeout_s=timeout))
    assert res.error_kind == "agent_timeout", (res.error_kind, res.error)
    assert any(t.purpose == "policy" and t.upstream_status == 200 for t in res.proxy_turns), [(t.purpose, t.upstream_status) for t in res.proxy_turns]
    assert (res.reward, res.reward_source) == (0.5, "verify_ratio")  # graded as it stands, not left out
    assert [r.exit_code for r in res.verify_results] == [0, 1]
    _no_process_left(res)


# The white-box loop runs in the server: it has no harness process of the agent's to kill.
@pytest.mark.parametrize("harness", sorted(CLI_HARNESSES), indirect=True)
async def test_killing_its_own_harness_is_graded(policy_server, make_request, harness):  # noqa: F811 - an imported fixture
    script = [{"bash": f"echo hello > hello.txt; {KILL_HARNESS}"}, {"text": "done"}]
    res = await run_rollout(make_request(script, verify=["test -f hello.txt", "false"], agent_timeout_s=60))
    # The CLI dies (agent_error), or a part of it that survives waits for the dead one (agent_timeout).
    assert res.error_kind in ("agent_error", "agent_timeout"), (res.error_kind, res.error, res.agent_log_tail[-500:])
    assert (res.reward, res.reward_source) == (0.5, "verify_ratio")
    _no_process_left(res)


async def test_the_endpoint_rejecting_its_later_calls_is_graded(policy_server, make_request, harness):  # noqa: F811 - an imported fixture
    # The agent's first call is answered (it acted); then the endpoint refuses what the agent asks
    # (a request the agent shaped): the rollout ends graded as the workspace stands, never reward None.
    script = [{"bash": "echo hello > hello.txt"}, *[{"status": 400}] * 12]
    res = await run_rollout(make_request(script, verify=["test -f hello.txt", "false"], agent_timeout_s=120))
    assert any(t.purpose == "policy" and t.upstream_status == 200 for t in res.proxy_turns), [(t.purpose, t.upstream_status) for t in res.proxy_turns]
    assert (res.reward, res.reward_source) == (0.5, "verify_ratio"), (res.error_kind, res.error)
    assert res.error_kind != "endpoint"
    _no_process_left(res)


# The agent starts model calls of its own with the capture key its harness holds (Pi's models.json),
# long ones that take every slot of an endpoint with few: its harness's next calls get 503s, as if
# the endpoint were down. Detached, they outlive the harness. Each body differs: equal ones would be
# one engine call (a retry is answered from the record, core/capture/retries.py).
FLOOD = (
    "echo hello > hello.txt; CFG=$HOME/.pi/agent/models.json; "
    "KEY=$(python3 -c \"import json; print(list(json.load(open('$CFG'))['providers'].values())[0]['apiKey'])\"); "
    "URL=$(python3 -c \"import json; print(list(json.load(open('$CFG'))['providers'].values())[0]['baseUrl'])\"); "
    'for i in 1 2 3 4 5; do setsid nohup curl -s -m 300 "$URL/chat/completions" -H "authorization: Bearer $KEY" '
    '-H \'content-type: application/json\' -d \'{"model": "m", "messages": [{"role": "user", "content": "[tag:flood] \'$i\'"}], '
    '"tools": [{"type": "function", "function": {"name": "x", "parameters": {}}}]}\' >/dev/null 2>&1 & done; sleep 3'
)


@pytest.mark.parametrize("harness", ["pi"], indirect=True)
async def test_overloading_the_endpoint_with_its_own_calls_is_graded(policy_server, make_request, harness):  # noqa: F811
    """Its own calls are refused and aborted before the proxy asks the endpoint whether it is down:
    the endpoint answers, so the failures were the agent's doing (graded), not reward None."""
    policy_server.policy.max_in_flight = 3
    policy_server.policy.scripts["flood"] = [{"hang": 200}]
    script = [{"bash": FLOOD}, *[{"bash": "echo next"}] * 6, {"text": "done"}]
    res = await run_rollout(make_request(script, verify=["test -f hello.txt", "false"], agent_timeout_s=120))
    assert any(t.upstream_status == 503 for t in res.proxy_turns), [(t.purpose, t.upstream_status) for t in res.proxy_turns]
    assert (res.error_kind, res.reward) == ("agent_error", 0.5), (res.error_kind, res.error)
    assert "answers the proxy's own call" in res.error
    _no_process_left(res)
