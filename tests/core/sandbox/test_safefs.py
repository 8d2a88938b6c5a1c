"""safefs against trees an agent can make: links to /etc, FIFOs (with and without a writer),
devices, read-only and unreadable directories, files swapped for links, and chains 3000 levels
deep (past PATH_MAX and Python's recursion limit)."""

import os
import shutil
import stat
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness_env.core.sandbox import safefs

DEEP = 3000
_D = os.O_RDONLY | os.O_DIRECTORY


def make_deep(root: Path, depth: int = DEEP, *, bottom: bytes = b"bottom\n") -> None:
    """d/d/.../d/bottom.txt, `depth` levels, built with directory descriptors (the full path is
    longer than PATH_MAX)."""
    fd = os.open(root, _D)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", _D, dir_fd=fd)
            os.close(fd)
            fd = nxt
        wfd = os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(wfd, bottom)
        os.close(wfd)
    finally:
        os.close(fd)


def soon(fn, *args, within: float = 60.0, **kw):
    """fn(...) in a thread, which must return (a FIFO that blocked it never would: this fails instead of hanging)."""
    pool = ThreadPoolExecutor(1)
    try:
        return pool.submit(fn, *args, **kw).result(timeout=within)
    finally:
        pool.shutdown(wait=False)


@pytest.fixture(autouse=True)
def _clean_tmp_path(tmp_path):
    # pytest's own clean-up of old temporary directories (shutil.rmtree) would fail on the
    # 3000-level trees, in whichever later test run reaches them
    yield
    assert safefs.remove_tree(tmp_path) is None


@pytest.fixture
def tree(tmp_path):
    """A workspace with a file, a subdirectory, links out to /etc, a FIFO and a device."""
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "a.txt").write_bytes(b"0123456789")
    (ws / "sub" / "b.txt").write_bytes(b"bee\n")
    os.symlink("/etc", ws / "etc")
    os.symlink("/etc/passwd", ws / "passwd")
    os.symlink("sub", ws / "inner")  # even a link that stays inside is not followed
    os.mkfifo(ws / "pipe")
    os.mknod(ws / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))
    return ws


# -- the existing functions -----------------------------------------------------------------


def test_open_dir_follows_no_link(tree):
    fd = safefs.open_dir(tree, "sub")
    try:
        assert sorted(os.listdir(fd)) == ["b.txt"]
    finally:
        os.close(fd)
    for rel in ("etc", "inner", "etc/ssh", "a.txt", "missing"):
        with pytest.raises(OSError):
            safefs.open_dir(tree, rel)
    with pytest.raises(ValueError, match="goes up"):
        safefs.open_dir(tree, "sub/../..")
    with pytest.raises(OSError):  # the root itself a link
        safefs.open_dir(tree / "etc")


def test_read_regular_reads_regular_files_only_and_never_blocks(tree):
    assert safefs.read_regular(tree, "a.txt", 4) == b"0123"
    assert safefs.read_regular(tree, "a.txt", 4, tail=True) == b"6789"
    assert safefs.read_regular(tree, "sub/b.txt", 100) == b"bee\n"
    for rel in ("passwd", "etc/passwd", "inner/b.txt", "pipe", "zero", "sub", "missing", "../ws/a.txt", ""):
        assert soon(safefs.read_regular, tree, rel, 100) is None, rel
    writer = os.open(tree / "pipe", os.O_RDWR)  # a FIFO with a writer: open() would succeed, read() block
    try:
        assert soon(safefs.read_regular, tree, "pipe", 100) is None
    finally:
        os.close(writer)


def test_a_file_swapped_for_a_link_is_not_read(tree):
    assert safefs.read_regular(tree, "a.txt", 100) == b"0123456789"
    os.unlink(tree / "a.txt")
    os.symlink("/etc/passwd", tree / "a.txt")
    assert safefs.read_regular(tree, "a.txt", 100) is None
    assert safefs.file_size(tree, "a.txt") is None
    shutil.rmtree(tree / "sub")
    os.symlink("/etc", tree / "sub")
    assert safefs.read_regular(tree, "sub/passwd", 100) is None


def test_file_size_is_for_regular_files_only(tree):
    assert safefs.file_size(tree, "a.txt") == 10
    for rel in ("passwd", "etc/passwd", "pipe", "zero", "sub", "missing", "../x"):
        assert safefs.file_size(tree, rel) is None, rel


def test_walk_files_skips_links_and_special_files(tree):
    (tree / "node_modules").mkdir()
    (tree / "node_modules" / "x.js").write_text("x")
    found = soon(lambda: list(safefs.walk_files(tree, skip_dirs=frozenset({"node_modules"}), max_bytes=4)))
    assert [(f.rel, f.data, f.size) for f in found] == [("a.txt", b"01234", 10), ("sub/b.txt", b"bee\n", 4)]
    assert [f.rel for f in safefs.walk_files(tree, max_files=1)] == ["a.txt"]
    assert list(safefs.walk_files(tree / "etc")) == []  # the root itself a link


def test_walk_files_is_bounded_in_depth_and_entries(tmp_path, monkeypatch):
    make_deep(tmp_path)
    (tmp_path / "top.txt").write_text("top")
    opened_dirs = []
    real_open = os.open

    def counting_open(path, flags, *args, **kw):
        if flags & os.O_DIRECTORY:
            opened_dirs.append(path)
        return real_open(path, flags, *args, **kw)

    with monkeypatch.context() as m:
        m.setattr(os, "open", counting_open)
        assert [f.rel for f in safefs.walk_files(tmp_path)] == ["top.txt"]  # the bottom is past max_depth
    assert 0 < len(opened_dirs) <= 40, len(opened_dirs)  # it stopped going down at max_depth (32), not at the bottom (3000)
    found = list(safefs.walk_files(tmp_path, max_depth=DEEP + 2))
    assert [f.rel for f in found] == ["d/" * DEEP + "bottom.txt", "top.txt"] and found[0].data == b"bottom\n"
    for i in range(50):
        (tmp_path / f"f{i:02d}").write_text("")
    assert len(list(safefs.walk_files(tmp_path, max_entries=10))) < 10


def test_remove_tree_removes_whatever_the_agent_made(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    victim = tmp_path / "rollout"
    victim.mkdir()
    make_deep(victim)
    (victim / "big.bin").write_bytes(b"\0" * (1 << 20))
    os.symlink(outside, victim / "to-outside")
    os.symlink(outside / "keep.txt", victim / "keep-link")
    os.symlink("/etc", victim / "etc")
    os.mkfifo(victim / "pipe")
    os.mknod(victim / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))
    ro = victim / "ro" / "inner"
    ro.mkdir(parents=True)
    (ro / "f.txt").write_text("f")
    os.chmod(ro, 0o500)
    os.chmod(victim / "ro", 0o000)
    (victim / "immutable.txt").write_text("i")
    assert subprocess.run(["chattr", "+i", str(victim / "immutable.txt")]).returncode == 0
    assert subprocess.run(["chattr", "+a", str(victim / "ro")]).returncode == 0
    assert safefs.remove_tree(victim) is None  # nothing left that it could not remove
    assert not os.path.lexists(victim)
    assert (outside / "keep.txt").read_text() == "keep" and os.path.isfile("/etc/passwd")


def test_remove_tree_removes_a_link_or_a_file_not_what_it_points_to(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("keep")
    os.symlink(target, tmp_path / "link")
    assert safefs.remove_tree(tmp_path / "link") is None
    assert not os.path.lexists(tmp_path / "link") and (target / "keep.txt").exists()
    assert safefs.remove_tree(target / "keep.txt") is None and not (target / "keep.txt").exists()
    assert safefs.remove_tree(tmp_path / "missing") is None


def test_remove_tree_reports_what_would_not_go_and_does_not_raise(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)]).returncode != 0:
        pytest.fail("this test mounts a tmpfs (run it as root, as the suite's sandboxes do)")
    try:
        (mnt / "stuck").mkdir()
        (mnt / "stuck" / "f.txt").write_text("f")
        assert subprocess.run(["mount", "-o", "remount,ro", str(mnt)]).returncode == 0
        problem = safefs.remove_tree(mnt / "stuck")
        assert problem is not None and str(mnt / "stuck") in problem and "would not go" in problem
        assert (mnt / "stuck" / "f.txt").exists()
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


# -- what the white-box file tools use -----------------------------------------------------------


def test_stat_entry_does_not_follow_links(tree):
    assert stat.S_ISLNK(safefs.stat_entry(tree, "etc").st_mode)
    assert stat.S_ISFIFO(soon(safefs.stat_entry, tree, "pipe").st_mode)
    assert stat.S_ISDIR(safefs.stat_entry(tree, "").st_mode)
    with pytest.raises(safefs.UnsafeEntry, match="etc is a symbolic link, not a directory"):
        safefs.stat_entry(tree, "etc/passwd")
    with pytest.raises(FileNotFoundError) as e:
        safefs.stat_entry(tree, "sub/nope/x")
    assert e.value.filename == "sub/nope"


@pytest.mark.parametrize(
    ("rel", "says"),
    [
        ("passwd", "passwd is a symbolic link, not a regular file"),
        ("pipe", "pipe is a FIFO, not a regular file"),
        ("zero", "zero is a character device, not a regular file"),
        ("sub", "sub is a directory, not a regular file"),
        ("etc/passwd", "etc is a symbolic link, not a directory"),
        ("inner/b.txt", "inner is a symbolic link, not a directory"),
        ("a.txt/x", "a.txt is a regular file, not a directory"),
    ],
)
def test_open_regular_refuses_anything_but_a_regular_file(tree, rel, says):
    with pytest.raises(safefs.UnsafeEntry, match=says):
        soon(safefs.open_regular, tree, rel)


def test_open_regular_gives_a_nonblocking_descriptor(tree):
    fd = safefs.open_regular(tree, "sub/b.txt")
    try:
        assert os.read(fd, 100) == b"bee\n" and os.get_blocking(fd) is False
    finally:
        os.close(fd)
    with pytest.raises(FileNotFoundError):
        safefs.open_regular(tree, "missing.txt")


def test_write_regular_creates_and_replaces_regular_files(tree):
    safefs.write_regular(tree, "new/deeper/c.txt", b"sea\n")
    assert (tree / "new" / "deeper" / "c.txt").read_bytes() == b"sea\n"
    os.chmod(tree / "a.txt", 0o751)
    safefs.write_regular(tree, "a.txt", b"rewritten")
    assert (tree / "a.txt").read_bytes() == b"rewritten" and stat.S_IMODE(os.stat(tree / "a.txt").st_mode) == 0o751
    os.chmod(tree / "sub", 0o500)  # a read-only directory (the server runs as root here)
    safefs.write_regular(tree, "sub/b.txt", b"two\n")
    assert (tree / "sub" / "b.txt").read_bytes() == b"two\n"
    assert not [n for d in (tree, tree / "sub", tree / "new" / "deeper") for n in os.listdir(d) if n.endswith(".tmp")]
    with pytest.raises(FileNotFoundError):
        safefs.write_regular(tree, "absent/x.txt", b"x", make_parents=False)


def test_write_regular_gives_what_it_makes_to_the_owner_and_keeps_an_old_files_owner(tree):
    safefs.write_regular(tree, "made/here/f.txt", b"x", owner=(65534, 65534))
    for rel in ("made", "made/here", "made/here/f.txt"):
        st = os.stat(tree / rel)
        assert (st.st_uid, st.st_gid) == (65534, 65534), rel
    os.chown(tree / "a.txt", 4242, 4343)
    safefs.write_regular(tree, "a.txt", b"y", owner=(65534, 65534))
    st = os.stat(tree / "a.txt")
    assert (st.st_uid, st.st_gid) == (4242, 4343)


def test_write_regular_replaces_a_hard_link_instead_of_writing_through_it(tmp_path, tree):
    outside = tmp_path / "outside.txt"
    outside.write_text("outside\n")
    os.link(outside, tree / "hard.txt")
    safefs.write_regular(tree, "hard.txt", b"agent\n")
    assert outside.read_text() == "outside\n" and (tree / "hard.txt").read_text() == "agent\n"


@pytest.mark.parametrize(
    ("rel", "says"),
    [
        ("passwd", "passwd is a symbolic link, not a regular file"),
        ("pipe", "pipe is a FIFO"),
        ("zero", "zero is a character device"),
        ("sub", "sub is a directory"),
        ("etc/new.txt", "etc is a symbolic link, not a directory"),
        ("etc/passwd", "etc is a symbolic link"),
        ("inner/new.txt", "inner is a symbolic link"),
        ("a.txt/new.txt", "a.txt is a regular file, not a directory"),
    ],
)
def test_write_regular_refuses_links_and_special_files(tree, rel, says):
    before = {p: os.lstat(tree / p) for p in os.listdir(tree)}
    passwd = Path("/etc/passwd").read_bytes()
    with pytest.raises(safefs.UnsafeEntry, match=says):
        soon(safefs.write_regular, tree, rel, b"pwned\n")
    assert {p: os.lstat(tree / p) for p in os.listdir(tree)} == before
    assert Path("/etc/passwd").read_bytes() == passwd and not os.path.exists("/etc/new.txt")


def test_scan_dir_lists_entries_without_following_links(tree):
    entries, more = safefs.scan_dir(tree)
    assert [(e.name, e.kind) for e in entries] == [
        ("a.txt", "file"),
        ("etc", "link"),
        ("inner", "link"),
        ("passwd", "link"),
        ("pipe", "other"),
        ("sub", "dir"),
        ("zero", "other"),
    ]
    assert not more
    entries, more = safefs.scan_dir(tree, max_entries=3)
    assert len(entries) == 3 and more
    with pytest.raises(safefs.UnsafeEntry, match="etc is a symbolic link"):
        safefs.scan_dir(tree, "etc")


@pytest.mark.parametrize(
    ("pattern", "matches"),
    [
        ("*.txt", ["a.txt"]),
        ("**/*.txt", [".hidden/h.txt", "a.txt", "sub/b.txt"]),
        ("sub/*", ["sub/b.txt"]),
        ("**/b.txt", ["sub/b.txt"]),
        ("s?b/[ab].txt", ["sub/b.txt"]),
        ("etc/*", []),
        ("inner/*", []),
        ("**/passwd", ["passwd"]),
        ("./sub/b.txt", ["sub/b.txt"]),
        ("*", [".hidden", "a.txt", "etc", "inner", "passwd", "pipe", "sub", "zero"]),
        ("**", [".hidden", ".hidden/h.txt", "a.txt", "etc", "inner", "passwd", "pipe", "sub", "sub/b.txt", "zero"]),
    ],
)
def test_glob_matches_like_pathlib_but_never_enters_a_link(tree, pattern, matches):
    (tree / ".hidden").mkdir()
    (tree / ".hidden" / "h.txt").write_text("h")
    assert soon(safefs.glob, tree, pattern).matches == matches


def test_glob_is_bounded(tmp_path):
    make_deep(tmp_path)
    r = safefs.glob(tmp_path, "**/bottom.txt")
    assert r.matches == [] and r.stopped == "depth"
    r = safefs.glob(tmp_path, "**/bottom.txt", max_depth=DEEP + 2)
    assert r.matches == ["d/" * DEEP + "bottom.txt"] and r.stopped is None
    for i in range(300):
        (tmp_path / f"f{i:03d}").write_text("")
    r = safefs.glob(tmp_path, "*", max_entries=100)
    assert r.stopped == "entries" and len(r.matches) == 100
    r = safefs.glob(tmp_path, "**", deadline=time.monotonic() - 1, max_depth=DEEP + 2)
    assert r.stopped == "time" and r.scanned <= 256


def test_walks_stopped_early_leave_no_descriptor_open(tmp_path):
    src = tmp_path / "src"
    for i in range(20):
        (src / f"d{i}" / "e").mkdir(parents=True)
        (src / f"d{i}" / "e" / "f.txt").write_text("x")

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    walk = safefs.walk_files(src)
    next(walk)
    walk.close()  # a consumer that stops after the first file
    assert list(safefs.walk_files(src, max_entries=7)) and open_fds() == before
    assert safefs.glob(src, "**/f.txt", max_entries=9).stopped == "entries" and open_fds() == before
    report = safefs.copy_out(tmp_path, "src", tmp_path / "out", max_file_bytes=10, max_total_bytes=100, max_entries=9)
    assert report.left_out_count == 1 and open_fds() == before
    report = safefs.copy_out(tmp_path, "src", tmp_path / "out2", max_file_bytes=10, max_total_bytes=100)
    assert report.files == 20 and open_fds() == before
