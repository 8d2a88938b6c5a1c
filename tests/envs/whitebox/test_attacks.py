"""Attacks on the white-box tools (issue 18, items 3, 8, 12 and 21), performed for real: the agent
makes links, FIFOs and huge files with the bash tool inside a real sandbox (bubblewrap, and plain
processes), then aims the server-side file tools at them. Each must fail safely: quickly, with a
message the model can act on, without touching or revealing anything outside the workspace and
without holding memory or a worker thread."""

import asyncio
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness_env.core.sandbox.local import create_local_sandbox
from harness_env.envs.whitebox import tools
from harness_env.envs.whitebox.tools import ToolBox, ToolLimits
from tests import needs

BACKENDS = [pytest.param(True, id="bwrap"), pytest.param(False, id="plain")]


@pytest.fixture(params=BACKENDS)
async def box(request):
    if request.param:
        needs.bwrap()
    sandbox = create_local_sandbox(use_bwrap=request.param, ro_paths=[])
    try:
        yield ToolBox(sandbox, ToolLimits(timeout_s=10, max_output_bytes=1024))
    finally:
        await sandbox.close()
    assert sandbox.alive_pids() == []


def call(box, name, **args):
    return box.call(name, json.dumps(args))


async def sh(box, command):
    r = await call(box, "bash", command=command)
    assert r.ok, r.content
    return r.content


async def answered(coro):
    """The reply (or replies) of a tool call that must answer from what it finds, not by giving up:
    a call blocked on what it opened says it ran out of time (the box's 10 s); a hang fails here."""
    reply = await asyncio.wait_for(coro, 60)
    for r in reply if isinstance(reply, list) else [reply]:
        assert not any(s in r.content for s in ("timed out", "did not finish within", "when its time was up")), r.content
    return reply


# -- item 3: FIFOs and devices ---------------------------------------------------------------


async def test_file_tools_on_a_fifo_answer_at_once_and_leave_it_alone(box):
    await sh(box, "mkfifo pipe && echo 'needle' > hay.txt")
    ws = Path(box.sandbox.workspace)
    r = await answered(call(box, "read", path="pipe"))
    assert not r.ok and r.content == "error: pipe is not a regular file (FIFO); tools read and write regular files only"
    r = await answered(call(box, "write", path="pipe", content="x"))
    assert not r.ok and "pipe is not a regular file (FIFO)" in r.content
    r = await answered(call(box, "edit", path="pipe", old_string="a", new_string="b"))
    assert not r.ok and "pipe is not a regular file (FIFO)" in r.content
    assert stat.S_ISFIFO(os.lstat(ws / "pipe").st_mode)  # not replaced either
    assert (await answered(call(box, "ls"))).content == "hay.txt\npipe"
    assert (await answered(call(box, "glob", pattern="*"))).content == "hay.txt\npipe"
    assert (await answered(call(box, "grep", pattern="needle"))).content == "./hay.txt:1:needle"
    r = await answered(call(box, "grep", pattern="needle", path="pipe"))
    assert "timed out" not in r.content


async def test_a_writer_waiting_on_the_fifo_does_not_change_that(box):
    # With a process holding the FIFO open for writing, opening it for reading would succeed and
    # then block in read(): the tools must still not open it.
    await sh(box, "mkfifo pipe; setsid sh -c 'sleep 30 > pipe' < /dev/null > /dev/null 2>&1 &")
    r = await answered(call(box, "read", path="pipe"))
    assert "not a regular file (FIFO)" in r.content
    r = await answered(call(box, "write", path="pipe", content="x"))
    assert "not a regular file (FIFO)" in r.content


async def test_many_fifo_reads_at_once_leave_the_worker_threads_free(box):
    await sh(box, "mkfifo pipe")
    replies = await answered(asyncio.gather(*(call(box, "read", path="pipe") for _ in range(24))))
    assert all("not a regular file (FIFO)" in r.content for r in replies)
    # The default executor (used by asyncio.to_thread everywhere in the server) still answers.
    assert await asyncio.wait_for(asyncio.gather(*(asyncio.to_thread(lambda: 7) for _ in range(32))), 5) == [7] * 32


async def test_devices_are_never_opened(box):
    # An agent in a plain sandbox runs as the server's user (root here) and can make device nodes.
    ws = Path(box.sandbox.workspace)
    os.mknod(ws / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))  # reading it never ends
    os.mknod(ws / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    r = await answered(call(box, "read", path="zero"))
    assert r.content == "error: zero is not a regular file (character device); tools read and write regular files only"
    r = await answered(call(box, "write", path="null", content="x"))
    assert "null is not a regular file (character device)" in r.content
    r = await answered(call(box, "edit", path="zero", old_string="\0", new_string="x"))
    assert "zero is not a regular file (character device)" in r.content
    assert stat.S_ISCHR(os.lstat(ws / "null").st_mode)


# -- item 12: links the agent made -------------------------------------------------------------


@pytest.fixture
def host_dir(tmp_path):
    d = tmp_path / "host"
    d.mkdir()
    (d / "secret.txt").write_text("host secret\n")
    return d


async def test_no_file_tool_follows_a_link_out_of_the_workspace(box, host_dir):
    other = create_local_sandbox(use_bwrap=box.sandbox.backend == "bwrap", ro_paths=[])
    try:
        other.write_file("other.txt", "other rollout")
        await sh(
            box,
            f"ln -s {host_dir} h; ln -s / root; ln -s /proc p; ln -s {other.workspace} o; ln -s {host_dir}/secret.txt s.txt;"
            " mkdir d; ln -s ../.. d/up; echo mine > d/mine.txt",
        )
        ws = Path(box.sandbox.workspace)
        everything = {"d", "d/mine.txt", "d/up", "h", "o", "p", "root", "s.txt"}
        for pattern in ("**", "**/*"):
            assert set((await answered(call(box, "glob", pattern=pattern))).content.splitlines()) == everything
        for pattern in ("h/*", "root/*", "p/*", "o/*", "*/*/*", "d/up/*", "**/secret.txt", "**/other.txt", "p/self/*", "root/etc/passwd"):
            assert (await answered(call(box, "glob", pattern=pattern))).content == "no files match", pattern
        assert (await call(box, "glob", pattern="*/*")).content == "d/mine.txt\nd/up"

        link_says = "is a symbolic link; the file tools do not follow links"
        for path, culprit in [
            ("s.txt", "s.txt"),
            ("h/secret.txt", "h"),
            ("o/other.txt", "o"),
            ("root/etc/passwd", "root"),
            ("p/self/environ", "p"),
            ("d/up/etc/passwd", "d/up"),
            (f"{ws}/h/secret.txt", "h"),
        ]:
            r = await answered(call(box, "read", path=path))
            assert not r.ok and r.content.startswith(f"error: {culprit} {link_says}"), (path, r.content)
        for path in ("h", "root", "p", "o", "d/up"):
            r = await answered(call(box, "ls", path=path))
            assert not r.ok and link_says in r.content, path
        assert (await call(box, "ls")).content == "d/\nh@\no@\np@\nroot@\ns.txt@"

        for path in ("s.txt", "h/new.txt", "h/secret.txt", "o/other.txt", "d/up/x.txt", "o/sub/new.txt"):
            r = await answered(call(box, "write", path=path, content="pwned\n"))
            assert not r.ok and link_says in r.content, (path, r.content)
        r = await call(box, "edit", path="s.txt", old_string="host", new_string="pwned")
        assert not r.ok and link_says in r.content
        assert [p.name for p in host_dir.iterdir()] == ["secret.txt"] and (host_dir / "secret.txt").read_text() == "host secret\n"
        assert sorted(os.listdir(other.workspace)) == ["other.txt"] and other.read_file("other.txt") == b"other rollout"
        assert os.path.islink(ws / "s.txt") and os.readlink(ws / "s.txt") == f"{host_dir}/secret.txt"
    finally:
        await other.close()


async def test_a_file_swapped_for_a_link_is_not_written_through(box, host_dir):
    assert (await call(box, "write", path="a.txt", content="one\n")).ok
    await sh(box, f"rm a.txt && ln -s {host_dir}/secret.txt a.txt")
    r = await call(box, "edit", path="a.txt", old_string="one", new_string="two")
    assert "a.txt is a symbolic link" in r.content
    r = await call(box, "write", path="a.txt", content="two\n")
    assert "a.txt is a symbolic link" in r.content
    assert (host_dir / "secret.txt").read_text() == "host secret\n"


async def test_a_hard_link_to_a_file_outside_the_workspace_is_replaced_not_written_through(box):
    # A hard link cannot be told from the file itself; write and edit replace the name instead of
    # writing into the inode (here a file of the rollout outside the workspace: same filesystem).
    ws = Path(box.sandbox.workspace)
    outside = Path(box.sandbox.root) / "logs" / "server-only.txt"
    outside.parent.mkdir(exist_ok=True)
    outside.write_text("server data\n")
    os.link(outside, ws / "hard.txt")
    assert (await call(box, "edit", path="hard.txt", old_string="server", new_string="agent")).ok
    assert (await call(box, "read", path="hard.txt")).content == "     1\tagent data"
    assert (await call(box, "write", path="hard.txt", content="new\n")).ok
    assert outside.read_text() == "server data\n" and os.stat(outside).st_nlink == 1


async def test_a_workspace_replaced_by_a_link_is_not_entered(box, host_dir):
    # Possible without bubblewrap (under it the rollout directory is read-only): done here directly.
    ws = box.sandbox.workspace
    os.rename(ws, ws + ".old")
    os.symlink(host_dir, ws)
    r = await answered(call(box, "read", path="secret.txt"))
    assert not r.ok and "host secret" not in r.content
    r = await answered(call(box, "ls"))
    assert not r.ok and "secret.txt" not in r.content
    r = await answered(call(box, "write", path="x.txt", content="x"))
    assert not r.ok
    assert (await call(box, "glob", pattern="**")).content == "no files match"
    assert [p.name for p in host_dir.iterdir()] == ["secret.txt"]
    os.unlink(ws)  # let close() remove a real directory tree
    os.rename(ws + ".old", ws)


@pytest.mark.parametrize(
    ("path", "fine"),
    [
        ("a/../b.txt", True),
        ("./b.txt", True),
        ("../b.txt", False),
        ("a/../../b.txt", False),
        ("/etc/passwd", False),
        ("{ws}/b.txt", True),
        ("{ws}/../home/b.txt", False),
        ("{ws}x/b.txt", False),
    ],
)
async def test_paths_are_resolved_by_name_inside_the_workspace(box, path, fine):
    path = path.format(ws=box.sandbox.workspace)
    box.sandbox.write_file("b.txt", "bee\n")
    for name, args in [("read", {}), ("write", {"content": "bee\n"}), ("grep", {"pattern": "bee"})]:
        r = await call(box, name, path=path, **args)
        assert r.ok == fine, (name, r.content)
        if not fine:
            assert "outside sandbox workspace" in r.content and "use a path relative to the workspace" in r.content


async def test_grep_sees_the_links_in_the_sandboxs_own_view(host_dir):
    # grep runs inside the sandbox: under bubblewrap a link to a host directory leads nowhere.
    needs.bwrap()
    sandbox = create_local_sandbox(use_bwrap=True, ro_paths=[])
    try:
        box = ToolBox(sandbox, ToolLimits(timeout_s=10))
        await sh(box, f"ln -s {host_dir} h; ln -s {host_dir}/secret.txt s.txt")
        for path in ("h", "s.txt", "."):
            r = await call(box, "grep", pattern="secret", path=path)
            assert "host secret" not in r.content and r.content != "no matches" or path == ".", r.content
    finally:
        await sandbox.close()


# -- item 8: huge files ---------------------------------------------------------------------


async def test_a_huge_file_is_read_a_page_at_a_time(box):
    ws = Path(box.sandbox.workspace)
    await sh(box, "seq 1 3000000 > big.txt")  # 20 MB, past what one read looks at
    r = await answered(call(box, "read", path="big.txt", limit=3))
    size = (ws / "big.txt").stat().st_size
    assert r.content == (
        "     1\t1\n     2\t2\n     3\t3\n"
        f"[more lines follow: big.txt is {size} bytes, more than one read looks at (8 MiB); read again with offset=4,"
        " or use bash (head, tail, sed -n, grep -n)]"
    )
    r = await answered(call(box, "read", path="big.txt", offset=1000000, limit=2))
    assert r.content.startswith("1000000\t1000000\n1000001\t1000001\n[more lines follow")
    r = await answered(call(box, "read", path="big.txt", offset=2900000))
    assert not r.ok and "past the first 8 MiB that read looks at" in r.content and "sed -n '2900000,+99p' big.txt" in r.content
    r = await answered(call(box, "read", path="big.txt"))  # the default page: bounded by bytes, not 2000 lines
    assert len(r.content.encode()) < 1024 + 300 and r.content.splitlines()[-1].startswith("[more lines follow")
    r = await answered(call(box, "edit", path="big.txt", old_string="2999999", new_string="x"))
    assert r.content == f"error: big.txt is {size} bytes; edit rewrites files up to 8 MiB (use bash, e.g. sed -i, for bigger ones)"


async def test_a_huge_line_is_cut(box):
    await sh(box, "head -c 30000000 /dev/zero | tr '\\0' a > one-line.txt; printf 'x\\ny\\n' >> one-line.txt")
    r = await answered(call(box, "read", path="one-line.txt"))
    first, *rest = r.content.splitlines()
    assert first.startswith("     1\taaaa") and first.endswith("[... line cut: over 8388608 bytes in all; see it with bash, e.g. cut -c or fold]")
    assert len(r.content.encode()) < 1024 + 400 and rest[-1].startswith("[more lines follow") and "offset=2" in rest[-1]


READ_RSS_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from harness_env.core.sandbox.local import create_local_sandbox
    from harness_env.envs.whitebox.tools import ToolBox, ToolLimits

    def hwm_kib():
        with open("/proc/self/status") as f:
            return int(next(l for l in f if l.startswith("VmHWM:")).split()[1])

    async def main():
        sb = create_local_sandbox(use_bwrap=False, ro_paths=[])
        try:
            ws = sb.workspace
            line = b"0123456789" * 9 + b"012345678\\n"  # 100 bytes a line
            with open(os.path.join(ws, "lines.txt"), "wb") as f:
                block = line * 10000
                for _ in range(200):
                    f.write(block)
            with open(os.path.join(ws, "one-line.txt"), "wb") as f:
                block = b"a" * (1 << 20)
                for _ in range(200):
                    f.write(block)
            with open(os.path.join(ws, "sparse.bin"), "wb") as f:
                f.truncate(200 << 20)
            box = ToolBox(sb, ToolLimits(timeout_s=60))
            calls = [("read", {"path": "lines.txt"}), ("read", {"path": "lines.txt", "offset": 80000, "limit": 100000}),
                     ("read", {"path": "one-line.txt"}), ("read", {"path": "sparse.bin"}),
                     ("edit", {"path": "lines.txt", "old_string": "0123", "new_string": "x", "replace_all": True}),
                     ("glob", {"pattern": "**"}), ("ls", {})]
            await box.call("ls", "{}")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM (peak RSS) to the current RSS
            before = hwm_kib()
            out = []
            for name, args in calls:
                r = await box.call(name, json.dumps(args))
                out.append({"call": name, "args": args, "bytes": len(r.content.encode()), "head": r.content[:80], "tail": r.content[-600:]})
            print(json.dumps({"grew_kib": hwm_kib() - before, "replies": out}))
        finally:
            await sb.close()

    asyncio.run(main())
    """
)


def test_reading_200_mb_files_does_not_grow_the_server():
    p = subprocess.run([sys.executable, "-c", READ_RSS_SCRIPT], capture_output=True, text=True, timeout=180, env=os.environ.copy())
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    replies = report["replies"]
    assert all(r["bytes"] < 16 * 1024 + 500 for r in replies), [(r["call"], r["bytes"]) for r in replies]
    assert "more lines follow: lines.txt is 200000000 bytes" in replies[0]["tail"]
    assert replies[1]["head"].startswith(" 80000\t0123456789")
    assert "line cut: over 8388608 bytes" in replies[2]["tail"]
    assert replies[3]["head"] == "error: sparse.bin is a binary file (209715200 bytes)"
    assert replies[4]["head"].startswith("error: lines.txt is 200000000 bytes; edit rewrites files up to 8 MiB")
    assert report["grew_kib"] < 50 * 1024, report["grew_kib"]


async def test_glob_and_ls_are_bounded(box, monkeypatch):
    await sh(box, "mkdir wide && cd wide && touch $(seq -f f%04g 1 700); cd ..; p=deep; for i in $(seq 80); do p=$p/d; done; mkdir -p $p && touch $p/leaf")
    *names, note = (await call(box, "ls", path="wide")).content.splitlines()
    assert names == [f"f{i:04d}" for i in range(1, len(names) + 1)] and len("\n".join(names)) <= 1024
    assert note == f"[{700 - len(names)} more entries; use bash (ls | head, find) to page through them]"
    box.limits = ToolLimits(timeout_s=10, max_output_bytes=100_000)
    *names, note = (await call(box, "ls", path="wide")).content.splitlines()
    assert len(names) == 500 and note == "[200 more entries; use bash (ls | head, find) to page through them]"
    *names, note = (await call(box, "glob", pattern="wide/*")).content.splitlines()
    assert len(names) == 500 and note == "[200 more matches; narrow the pattern]"
    r = await call(box, "glob", pattern="**/leaf")
    assert r.content.endswith("[the search stopped at depth 64; the list may be incomplete: narrow the pattern or use bash (find)]")
    monkeypatch.setattr(tools, "MAX_SCAN_ENTRIES", 50)
    r = await call(box, "glob", pattern="wide/*")
    assert r.content.endswith("[the search stopped after looking at 50 entries; the list may be incomplete: narrow the pattern or use bash (find)]")
    assert 40 < len(r.content.splitlines()) <= 50


# -- item 21: how much output was cut ----------------------------------------------------------


async def test_the_model_is_told_the_real_number_of_bytes_cut(box):
    box.limits = ToolLimits(timeout_s=60, max_output_bytes=1024)
    r = await call(box, "bash", command="yes aaaaaaaaa | head -c 300000000; echo END")
    assert r.content.startswith(f"[... {300_000_004 - 1024} bytes cut ...]\n")
    assert r.content.endswith("aaaaaaaaa\nEND\n[exit code 0]")
    r = await call(box, "bash", command="echo out; head -c 5000000 /dev/zero | tr '\\0' b >&2")
    assert r.content.startswith(f"[... {5_000_004 - 1024} bytes cut ...]\n") and r.content.endswith("bbbb\n[exit code 0]")


async def test_text_that_is_not_unicode_is_an_error_for_the_model(box):
    r = await box.call("write", '{"path": "x.txt", "content": "a\\ud800b"}')
    assert r.content == "error: argument content of write has a lone surrogate ('\\ud800') at position 1; send valid Unicode text"
    r = await box.call("read", '{"path": "x\\u0000.txt"}')
    assert r.content == "error: argument path of read has a NUL character; send the file's name as it is"
    (Path(box.sandbox.workspace) / "latin1.txt").write_bytes(b"caf\xe9\n")
    r = await call(box, "edit", path="latin1.txt", old_string="caf", new_string="tea")
    assert r.content == "error: latin1.txt is not UTF-8 text; edit changes text files only (use bash for others)"


async def test_what_the_tools_write_stays_the_agents_to_change(box):
    # Under bubblewrap the agent runs as an unprivileged user: files and directories the
    # server-side tools make must be its own, and an edit must not take a file away from it.
    ws = Path(box.sandbox.workspace)
    uid = int((await sh(box, "id -u")).splitlines()[0])
    assert os.stat(ws).st_uid == uid
    assert (await call(box, "write", path="new/dir/f.txt", content="one\n")).ok
    await sh(box, "echo two >> new/dir/f.txt && touch new/dir/g.txt && mkdir new/dir/h")
    assert (await call(box, "read", path="new/dir/f.txt")).content == "     1\tone\n     2\ttwo"
    await sh(box, "echo mine > mine.txt && chmod 640 mine.txt")
    assert (await call(box, "edit", path="mine.txt", old_string="mine", new_string="edited")).ok
    st = os.stat(ws / "mine.txt")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (uid, 0o640)
    await sh(box, "echo again >> mine.txt")
