"""`kbd sweep`: the results store, resume after SIGKILL and Ctrl-C, JUnit, sharding."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import psutil

from kbd.plan.spec import Shard
from kbd.results.store import Store
from tests.conftest import fixture_args, json_records, kbd

QUICK = ["level1/1_", "level1/2_", "level1/3_", "level9/2_", "level9/3_"]
QUICK_OUTCOMES = {
    "level1/1_matmul": "pass",
    "level1/2_relu_scale": "pass",
    "level1/3_sum_reduction": "pass",
    "level9/2_raise": "error",
    "level9/3_segfault": "crash",
}


def _outcomes(db_cwd, sweep_id=None) -> dict[str, str]:
    args = ["results", "--json"] + ([str(sweep_id)] if sweep_id else [])
    result = kbd(*args, cwd=db_cwd)
    assert result.returncode == 0, result.stderr
    return {k: r["outcome"] for k, r in json_records(result.stdout).items()}


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _attempts(cwd) -> int:
    db = cwd / ".kbd" / "results.db"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM attempts").fetchone()[0]


def test_sweep_stores_results_and_writes_junit(tmp_path):
    junit = tmp_path / "out.xml"
    result = kbd("sweep", *fixture_args(*QUICK, "-j", "2", "--junit", str(junit)), cwd=tmp_path)
    assert result.returncode == 1  # raise and segfault fail
    assert "5 kernels: 3 pass, 1 error, 1 crash" in result.stdout
    assert _outcomes(tmp_path) == QUICK_OUTCOMES
    suite = ET.parse(junit).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("5", "2")
    listing = kbd("sweeps", cwd=tmp_path).stdout
    assert "done" in listing and "5/5" in listing


def test_kill_9_leaves_no_worker_and_resume_completes(tmp_path):
    # -O0 and an 8 s limit: a loaded machine must not turn a quick kernel into a timeout in one
    # of the two runs compared below.
    args = fixture_args(*QUICK, "level9/6_", "-j", "1", "-O", "0", "--timeout", "8")
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "kbd", "sweep", *args],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    # Kill the supervisor while a worker runs (the hang keeps one busy for 8 s).
    assert _wait_for(lambda: len(_template_processes(supervisor.pid)) >= 2, 60)
    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait()
    assert _wait_for(lambda: not _template_processes(supervisor.pid), 5), "workers survived"
    recorded = _attempts(tmp_path)
    assert recorded < 6

    resumed = kbd("sweep", "--resume", cwd=tmp_path)
    assert f"resuming sweep 1: {6 - recorded} of 6 kernels left" in resumed.stderr
    assert _attempts(tmp_path) == 6  # nothing finished was run again
    # The outcomes of an uninterrupted sweep (test_sweep_stores_results_and_writes_junit).
    assert _outcomes(tmp_path, 1) == {**QUICK_OUTCOMES, "level9/6_hang": "timeout"}


def test_ctrl_c_finishes_running_kernels_then_resume(tmp_path):
    args = fixture_args(
        "level9/6_", "level1/1_", "level1/2_", "-j", "1", "-O", "0", "--timeout", "6"
    )
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "kbd", "sweep", *args],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert _wait_for(lambda: len(_template_processes(supervisor.pid)) >= 2, 60)
    supervisor.send_signal(signal.SIGINT)
    _, err = supervisor.communicate(timeout=60)
    assert supervisor.returncode == 130
    assert "waiting for running kernels" in err
    assert "kbd sweep --resume 1" in err
    assert _outcomes(tmp_path) == {"level9/6_hang": "timeout"}  # finished, not killed
    assert "interrupted" in kbd("sweeps", cwd=tmp_path).stdout

    resumed = kbd("sweep", "--resume", "1", cwd=tmp_path)
    assert resumed.returncode == 1  # the hang's timeout is a failure
    assert set(_outcomes(tmp_path).values()) == {"timeout", "pass"}
    assert len(_outcomes(tmp_path)) == 3


def test_results_without_database(tmp_path):
    result = kbd("results", cwd=tmp_path)
    assert result.returncode == 2
    assert "no results database" in result.stderr


def test_resume_unknown_sweep(tmp_path):
    # A store holding sweep 1 only; no kernel needs to run for this (a sweep would start the
    # template, seconds of torch import).
    store = Store(tmp_path / ".kbd" / "results.db")
    store.create_sweep("sweep", "{}", ["level1/1_matmul"], "0")
    store.close()
    result = kbd("sweep", "--resume", "42", cwd=tmp_path)
    assert result.returncode == 2
    assert "no sweep with id 42" in result.stderr


def test_shards_partition_and_are_stable():
    kernels = [f"level1/{i}_kernel" for i in range(200)]
    shards = [{k for k in kernels if Shard(i, 4).contains(k)} for i in range(1, 5)]
    assert set().union(*shards) == set(kernels)
    assert sum(len(s) for s in shards) == len(kernels)
    assert all(20 < len(s) < 80 for s in shards)
    # A kernel's shard depends only on its name, never on the other kernels.
    assert {k for k in kernels[:50] if Shard(2, 4).contains(k)} == shards[1] & set(kernels[:50])


def _template_processes(supervisor_pid: int) -> list[int]:
    """The template and the workers it forked (they share its command line)."""
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    found = []
    for line in ps.splitlines():
        pid, _, args = line.strip().partition(" ")
        if "kbd.worker.template" in args and args.endswith(f" {supervisor_pid}"):
            found.append(int(pid))
    return [p for p in found if p != os.getpid()]


def test_template_death_ends_the_sweep_cleanly_and_resume_completes(tmp_path):
    # -O0 and 8 s, as above: the resume below waits out the hang's timeout once more.
    args = fixture_args("level9/6_", "level1/1_", "-j", "1", "-O", "0", "--timeout", "8")
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "kbd", "sweep", *args],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert _wait_for(lambda: len(_template_processes(supervisor.pid)) >= 2, 60)
    # the supervisor's child, not the smallest pid: pids wrap (pid_max is 32768 on some hosts)
    children = psutil.Process(supervisor.pid).children()
    [template] = [p.pid for p in children if "kbd.worker.template" in p.cmdline()]
    os.kill(template, signal.SIGKILL)
    _, err = supervisor.communicate(timeout=60)
    assert supervisor.returncode == 1
    assert "kbd: error: worker template exited" in err
    assert "Traceback" not in err
    assert _wait_for(lambda: not _template_processes(supervisor.pid), 5), "workers survived"
    assert "interrupted" in kbd("sweeps", cwd=tmp_path).stdout
    kbd("sweep", "--resume", cwd=tmp_path)
    assert _outcomes(tmp_path) == {"level9/6_hang": "timeout", "level1/1_matmul": "pass"}
