import os
import subprocess
import time

from harness_env.core.procs import is_running, kill_process, kill_process_group, pids_with_env, process_starttime, stat_fields, stat_starttime


def test_stat_parsing_survives_a_command_name_with_spaces_and_parens():
    line = "42 (a b) c) S " + " ".join(str(i) for i in range(4, 30))
    assert stat_fields(line)[0] == "S"
    assert stat_starttime(line) == "22"
    assert stat_starttime("42 (x) S 1 2") is None


def test_kill_process_group_takes_the_children_and_ignores_what_is_gone():
    marker = f"procs-test-{os.getpid()}-{time.monotonic_ns()}"
    proc = subprocess.Popen(["bash", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True, env={**os.environ, "HARNESS_ENV_PROCS_TEST": marker})
    try:
        deadline = time.monotonic() + 10
        while len(pids_with_env("HARNESS_ENV_PROCS_TEST", marker)) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        pids = pids_with_env("HARNESS_ENV_PROCS_TEST", marker)
        assert proc.pid in pids and len(pids) == 3
        assert process_starttime(proc.pid) is not None and is_running(proc.pid)
        kill_process_group(proc.pid)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while any(is_running(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not any(is_running(p) for p in pids)
    finally:
        kill_process_group(proc.pid)
        proc.wait(10)
    kill_process_group(proc.pid)  # gone: no error
    kill_process(proc.pid)
    assert process_starttime(proc.pid) is None


def test_a_zombie_is_not_running():
    proc = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while is_running(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not is_running(proc.pid) and process_starttime(proc.pid) is not None  # exited, not reaped
    proc.wait()


def test_an_undumpable_process_hides_its_environment_from_its_own_uid():
    """In the plain sandbox an agent runs as the server's user; /proc/<server>/environ would hand it
    the server's token and keys. Both processes run as `nobody` here, under the system Python
    (the project's venv lives under /root); procs.py needs only the standard library."""
    import shutil
    import tempfile
    from pathlib import Path

    import harness_env.core.procs as procs

    python = "/usr/bin/python3"
    assert os.geteuid() == 0 and shutil.which("setpriv") and os.path.exists(python), "needs root, setpriv and the system python3"
    tmp_path = Path(tempfile.mkdtemp())  # pytest's tmp_path is under a directory only root may enter
    os.chmod(tmp_path, 0o755)
    module = tmp_path / "procs.py"
    module.write_text(Path(procs.__file__).read_text())
    holder = tmp_path / "holder.py"
    holder.write_text(
        "import importlib.util, os, sys, time\n"
        "spec = importlib.util.spec_from_file_location('procs', sys.argv[2]); procs = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(procs)\n"
        "assert sys.argv[1] == '0' or procs.make_undumpable()\n"
        "print(os.getpid(), flush=True); time.sleep(60)\n"
    )
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    seen = {}
    for undumpable in ("0", "1"):
        p = subprocess.Popen(
            [*as_nobody, python, str(holder), undumpable, str(module)],
            stdout=subprocess.PIPE,
            text=True,
            env={"PATH": "/usr/bin:/bin", "SERVER_SECRET": "s3cret"},
        )
        try:
            pid = int(p.stdout.readline())
            spy = subprocess.run([*as_nobody, "cat", f"/proc/{pid}/environ"], capture_output=True)
            seen[undumpable] = (b"SERVER_SECRET=s3cret" in spy.stdout, spy.returncode)
        finally:
            p.kill()
            p.wait()
    shutil.rmtree(tmp_path)
    assert seen["0"] == (True, 0)  # the control: the same uid reads it
    assert seen["1"][0] is False and seen["1"][1] != 0


def test_serve_and_run_make_the_process_undumpable(monkeypatch):
    from harness_env.server import main

    calls = []
    monkeypatch.setattr(main, "make_undumpable", lambda: calls.append("undumpable") or True)
    monkeypatch.setattr(main.uvicorn, "run", lambda *a, **k: calls.append("run"))
    assert main.serve(port=0) == 0
    assert calls == ["undumpable", "run"]
