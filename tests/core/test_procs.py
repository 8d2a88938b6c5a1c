import os
import subprocess
import time

from harness_env.core.procs import (
    is_running,
    kill_process,
    kill_process_group,
    pids_with_env,
    process_starttime,
    stat_fields,
    stat_starttime,
)


def test_stat_parsing_survives_a_command_name_with_spaces_and_parens():
    line = "42 (a b) c) S " + " ".join(str(i) for i in range(4, 30))
    assert stat_fields(line)[0] == "S"
    assert stat_starttime(line) == "22"
    assert stat_starttime("42 (x) S 1 2") is None


def test_kill_process_group_takes_the_children_and_ignores_what_is_gone():
    marker = f"procs-test-{os.getpid()}-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        ["bash", "-c", "sleep 60 & sleep 60 & wait"],
        start_new_session=True,
        env={**os.environ, "HARNESS_ENV_PROCS_TEST": marker},
    )
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
