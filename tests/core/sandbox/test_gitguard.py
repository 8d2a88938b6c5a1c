"""Git run by verify starts no program the agent named (issue 25, critical 1 and item 8): each
member of the class (diff drivers, textconv, filters, merge drivers, signature programs, pagers,
includes, worktree configs, nested and bare repositories, links as config) is planted by a
command in a real sandbox (plain and bubblewrap), then ordinary verify commands run with the
sandbox's verify environment after the start of verify; the agent's program must not have run,
and honest git commands (`git diff`, `git log -p`, `git blame`, ...) must work."""

from __future__ import annotations

import pytest

from harness_env.core.sandbox.gitguard import allowed, parse_listing, render_config
from harness_env.core.sandbox.local import create_local_sandbox
from tests import needs

BACKENDS = [False, True]
# The agent's program: it forges the reward and leaves a mark in the workspace.
EVIL = "$HOME/evil.sh"
MAKE_EVIL = 'printf \'#!/bin/sh\\necho 1.0 > "$HARNESS_ENV_REWARD_FILE"\\necho ran >> %s/.pwned\\ncat\\n\' "$PWD" > $HOME/evil.sh && chmod +x $HOME/evil.sh'
REPO = (
    "git init -q . && git config user.email a@b && git config user.name a && echo one > f.txt && git add f.txt && "
    "git commit -qm first && echo two > f.txt && git add f.txt && git commit -qm second && echo three > f.txt"
)
HONEST_VERIFY = [
    "git diff HEAD",
    "git diff",
    "git log -p",
    "git log -1 --format=%s",
    "git log --oneline",
    "git blame f.txt",
    "git show HEAD",
    "git status --porcelain",
    "git diff HEAD~1 HEAD --stat",
    "git grep -n three",
    "git stash list",
    "git add -A",
    "git diff --cached",
    "git checkout -q -b verify-branch",
    "git merge -q HEAD~1 || true",
    "git log --show-signature -1",
]
PLANTS = {
    "diff_command": f"echo '* diff=evil' > .gitattributes && git config diff.evil.command \"{EVIL}\"",
    "textconv": f"echo '* diff=evil' > .gitattributes && git config diff.evil.textconv \"{EVIL}\"",
    "diff_external": f'git config diff.external "{EVIL}"',
    "clean_filter": f'echo \'* filter=evil\' > .gitattributes && git config filter.evil.clean "{EVIL}" && git config filter.evil.smudge "{EVIL}"',
    "process_filter": f"echo '* filter=evil' > .gitattributes && git config filter.evil.process \"{EVIL}\"",
    "merge_driver": f"echo '* merge=evil' > .gitattributes && git config merge.evil.driver \"{EVIL}\"",
    "x509_signature": (
        f'git config gpg.x509.program "{EVIL}" && git config gpg.format x509 && git config log.showSignature true && '
        "git cat-file commit HEAD | sed '/^committer/a gpgsig -----BEGIN SIGNED MESSAGE-----\\n -----END SIGNED MESSAGE-----' > c && "
        "git update-ref HEAD $(git hash-object -t commit -w c) && rm c"
    ),
    "ssh_signature": (
        f'git config gpg.ssh.program "{EVIL}" && git config gpg.format ssh && git config log.showSignature true && '
        "git cat-file commit HEAD | sed '/^committer/a gpgsig -----BEGIN SSH SIGNATURE-----\\n -----END SSH SIGNATURE-----' > c && "
        "git update-ref HEAD $(git hash-object -t commit -w c) && rm c"
    ),
    "pager": f'git config core.pager "{EVIL}" && git config pager.log "{EVIL}" && git config pager.diff "{EVIL}"',
    "fsmonitor_and_hooks": (
        f'git config core.fsmonitor "{EVIL}" && git config core.hooksPath .hooks && mkdir -p .hooks .git/hooks && '
        f"cp {EVIL} .hooks/post-checkout && cp {EVIL} .git/hooks/post-checkout && cp {EVIL} .git/hooks/pre-commit"
    ),
    "include_path": (
        f"git config -f $HOME/evil.cfg diff.evil.command \"{EVIL}\" && echo '* diff=evil' > .gitattributes && "
        "git config include.path $HOME/evil.cfg && git config includeIf.gitdir:/.path $HOME/evil.cfg"
    ),
    "worktree_config": (
        f"git config extensions.worktreeConfig true && git config --worktree diff.evil.command \"{EVIL}\" && echo '* diff=evil' > .gitattributes"
    ),
    "config_is_a_link": (
        f'git config -f $HOME/cfg core.repositoryformatversion 0 && git config -f $HOME/cfg diff.evil.command "{EVIL}" && '
        "rm .git/config && ln -s $HOME/cfg .git/config && echo '* diff=evil' > .gitattributes"
    ),
    "old_section_syntax": f"printf '[diff.evil]\\n\\tcommand = %s\\n' \"{EVIL}\" >> .git/config && echo '* diff=evil' > .gitattributes",
    "same_line_header": f"printf '[diff \"evil\"] command = %s\\n' \"{EVIL}\" >> .git/config && echo '* diff=evil' > .gitattributes",
    "alias_and_helpers": (
        f'git config alias.st "!{EVIL}" && git config credential.helper "!{EVIL}" && git config core.sshCommand "{EVIL}" && '
        f'git config core.editor "{EVIL}" && git config sequence.editor "{EVIL}" && git config core.askPass "{EVIL}"'
    ),
}


def _need(use_bwrap: bool) -> None:
    if use_bwrap:
        needs.bwrap()


async def _plant_then_verify(use_bwrap: bool, plant: str, verify: list[str], *, setup: str = REPO):
    _need(use_bwrap)
    sb = create_local_sandbox(use_bwrap=use_bwrap)
    try:
        r = await sb.exec(f"{setup} && {MAKE_EVIL} && {plant}", timeout=60)
        assert r.exit_code == 0, (r.stdout, r.stderr)
        sb.clear_reward_file()
        results = [await sb.exec(cmd, timeout=30, env=sb.verify_env()) for cmd in verify]
        return sb, results, sb.read_reward_file(), sb.read_file(".pwned")
    finally:
        await sb.close()


@pytest.mark.parametrize("use_bwrap", BACKENDS)
@pytest.mark.parametrize("attack", sorted(PLANTS))
async def test_git_in_verify_runs_no_program_the_agent_named(use_bwrap, attack):
    sb, results, reward, pwned = await _plant_then_verify(use_bwrap, PLANTS[attack], HONEST_VERIFY)
    assert reward is None and pwned is None, (attack, reward, pwned)
    failed = [(cmd, r.exit_code, r.stderr[-300:]) for cmd, r in zip(HONEST_VERIFY, results, strict=True) if r.exit_code != 0]
    # Honest commands still work: signature checks report a bad signature, nothing else fails.
    assert failed == [], failed
    diff = results[0].stdout
    assert "-two" in diff and "+three" in diff, diff  # a real diff, by git's own machinery
    assert any("git config" in n for n in sb.notes), sb.notes  # the result says configs were reduced


@pytest.mark.parametrize("use_bwrap", BACKENDS)
async def test_plain_git_diff_and_friends_work_in_verify(use_bwrap):
    """Item 8: an honest agent's repository, honest verify commands: every one passes."""
    sb, results, reward, _ = await _plant_then_verify(use_bwrap, "true", HONEST_VERIFY)
    failed = [(cmd, r.exit_code, r.stderr[-300:]) for cmd, r in zip(HONEST_VERIFY, results, strict=True) if r.exit_code != 0]
    assert failed == [] and reward is None
    assert "+three" in results[0].stdout and "second" in results[4].stdout
    assert not any("git config" in n for n in sb.notes), sb.notes  # nothing to reduce: left as it was


@pytest.mark.parametrize("use_bwrap", BACKENDS)
async def test_nested_bare_and_linked_worktree_repositories_are_reduced_too(use_bwrap):
    plant = (
        f'git init -q --bare $HOME/bare.git && git -C $HOME/bare.git config diff.evil.command "{EVIL}" && '
        f"mkdir -p deep/a/b/c && cd deep/a/b/c && {REPO} && {MAKE_EVIL} && git config diff.evil.command \"{EVIL}\" && echo '* diff=evil' > .gitattributes && "
        f"git worktree add -q ../wt HEAD~1 && cd ../wt && git config extensions.worktreeConfig true && "
        f"git config --worktree diff.evil.textconv \"{EVIL}\" && echo '* diff=evil' > .gitattributes && echo changed > f.txt"
    )
    verify = ["cd deep/a/b/c && git diff HEAD", "cd deep/a/b/wt && git diff && git log -p -1", "git --git-dir=$HOME/../home/bare.git log 2>/dev/null; true"]
    _, results, reward, pwned = await _plant_then_verify(use_bwrap, plant, verify)
    assert reward is None and pwned is None
    assert [r.exit_code for r in results] == [0, 0, 0], [r.stderr for r in results]
    assert "+three" in results[0].stdout and "+changed" in results[1].stdout


async def test_the_agents_data_keys_stay():
    """What verify may grade of a repository's config (identity, remotes, branches) is kept."""
    keep = "git remote add origin https://example.invalid/r.git && git config branch.main.remote origin && git config user.name 'Agent Name'"
    verify = ["git config user.name", "git remote get-url origin", "git config branch.main.remote", "git config diff.evil.command || echo gone"]
    _, results, _, _ = await _plant_then_verify(True, f'{keep} && git config diff.evil.command "{EVIL}"', verify)
    assert [r.stdout.strip() for r in results] == ["Agent Name", "https://example.invalid/r.git", "origin", "gone"]


def test_allow_list_keeps_only_data_keys():
    assert allowed("core.repositoryformatversion", "0") and allowed("remote.origin.url", "x") and allowed("extensions.objectformat", "sha256")
    assert allowed("remote.a.b.url", "x")  # a remote whose name has a dot
    assert allowed("submodule.s.update", "rebase") and not allowed("submodule.s.update", "!sh -c x")
    for key in (
        "diff.evil.command",
        "core.pager",
        "core.fsmonitor",
        "include.path",
        "includeif.gitdir:/.path",
        "alias.st",
        "remote.origin.uploadpack",
        "remote.origin.vcs",
        "core.sshcommand",
        "filter.x.clean",
        "gpg.ssh.program",
        "url.x.insteadof",
        "core.hookspath",
        "diff.external",
        "core.x.y",
        "remote.url",
        "unknownsection.key",
    ):
        assert not allowed(key, "x"), key


def test_rendered_config_reads_back_as_the_same_entries(tmp_path):
    from harness_env.core.sandbox.gitguard import read_entries

    entries = [("core.bare", "false"), ("user.name", 'a "quoted" \\ name\twith tab'), ('remote.we ird"x.url', "u"), ("core.symlinks", None)]
    path = tmp_path / "config"
    path.write_text(render_config(entries))
    assert read_entries(path) == entries
    assert parse_listing(b"a.b\nc\0d.e\0") == [("a.b", "c"), ("d.e", None)]


async def test_a_tree_too_large_to_check_leaves_verify_no_repository(monkeypatch):
    """Entries past the walk's bound hide nothing: verify's git then sees no repository at all."""
    from harness_env.core.sandbox import gitguard

    monkeypatch.setattr(gitguard, "MAX_ENTRIES", 200)
    plant = f"mkdir $HOME/many && cd $HOME/many && touch $(seq 300) && cd - >/dev/null && {PLANTS['diff_command']}"
    sb, results, reward, pwned = await _plant_then_verify(True, plant, ["git diff HEAD", "git log --oneline"])
    assert reward is None and pwned is None
    assert all(r.exit_code != 0 and "not a git repository" in r.stderr.lower() for r in results), [r.stderr for r in results]
    assert any("could not all be checked (over 200 entries)" in n for n in sb.notes), sb.notes


def _guard_as(uid: int, root) -> list:
    """neutralise_git run by a server of uid `uid` (one that owns the agent's files, no root): in
    a forked child that gives up root, so this process keeps its own."""
    import json
    import os

    from harness_env.core.sandbox.gitguard import neutralise_git

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.setgid(uid)
            os.setuid(uid)
            r = neutralise_git(root, ["workspace"])
            os.write(write, json.dumps([r.rewritten, r.unchecked]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return json.loads(out)


def _agent_repo(tmp_path, uid: int):
    import subprocess

    ws = tmp_path / "workspace"
    ws.mkdir()
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    subprocess.run(["git", "-C", str(ws), "config", "diff.evil.command", "/bin/evil"], check=True)
    subprocess.run(["chown", "-R", f"{uid}:{uid}", str(tmp_path)], check=True)
    tmp_path.chmod(0o755)
    return ws


NOBODY = 65534


@pytest.fixture
def open_tmp():
    """A directory anyone may traverse (pytest's own are root's alone)."""
    import shutil
    import tempfile
    from pathlib import Path

    base = Path(tempfile.mkdtemp(prefix="gitguard-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_a_git_dir_the_agent_made_unlistable_is_checked_all_the_same(open_tmp):
    """A server that is not root owns the agent's files: `chmod 0311 .git` (git can still open
    .git/config by name) must not hide the config from the walk."""
    ws = _agent_repo(open_tmp, NOBODY)
    (ws / ".git").chmod(0o311)
    rewritten, unchecked = _guard_as(NOBODY, open_tmp)
    assert rewritten == ["workspace/.git/config"] and unchecked is None
    assert "evil" not in (ws / ".git" / "config").read_text()


def test_a_config_that_cannot_be_replaced_fails_closed(open_tmp):
    ws = _agent_repo(open_tmp, NOBODY)
    import os

    os.chown(ws / ".git", 0, 0)  # the server cannot write beside the config
    rewritten, unchecked = _guard_as(NOBODY, open_tmp)
    assert rewritten == [] and "cannot be replaced" in unchecked
