"""`kbd tune` through a real daemon on its real socket: the same trials, summary and exit status
as in this process, bad input refused with status 2, detach/attach/cancel and resume, and
kill -9 of the daemon mid-tune, after which `--resume` measures no finished configuration
twice."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import fixture_args, kbd
from tests.test_daemon_sweeps import _kbd_processes_of, _paths, _status
from tests.test_tune import QUICK, TUNABLE, trials_of, tunable

# The fixture space with its faults: a hang of --timeout seconds keeps a tune busy meanwhile.
FAULTY = ("--pipeline", str(TUNABLE), "--mem-limit", "1GiB", "--timeout", "8", *QUICK)
TRIAL = re.compile(r"^  (\S+) \{(.*)\}: (\S+) .*\[\d+ measured", re.MULTILINE)


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """One warm daemon shared by the tests of this module (tunes leave -j at its default, whose
    template the daemon warms at start)."""
    cwd = tmp_path_factory.mktemp("tune-daemon")
    started = kbd("daemon", "start", "--idle-timeout", "600", cwd=cwd, timeout=180)
    assert started.returncode == 0, started.stderr
    yield cwd
    kbd("daemon", "stop", "--now", cwd=cwd, timeout=60)


def _searched(stderr: str) -> set[tuple[str, str, str]]:
    """(kernel, configuration, timed or outcome) of every search trial line."""
    return {
        (kernel, config, "timed" if result.endswith("x") else result)
        for kernel, config, result in TRIAL.findall(stderr)
    }


def _sessions(db: Path) -> dict[int, str]:
    with sqlite3.connect(db) as connection:
        return dict(connection.execute("SELECT id, status FROM tunes").fetchall())


def test_a_tune_in_the_daemon_shows_and_ends_as_in_this_process(warm):
    quick = tunable(warm, ["ok", "wrong"])
    args = fixture_args("level1/1_", "--pipeline", str(quick), *QUICK)
    inside = kbd("tune", *args, cwd=warm)
    assert inside.returncode == 0, inside.stderr
    assert "starting a daemon" not in inside.stderr
    outside = kbd("tune", *args, "--no-daemon", cwd=warm)
    assert outside.returncode == 0, outside.stderr
    expected = {
        ("level1/1_matmul", "rounds=1 variant=ok", "timed"),
        ("level1/1_matmul", "rounds=2 variant=ok", "timed"),
        ("level1/1_matmul", "rounds=1 variant=wrong", "mismatch"),
    }
    assert _searched(inside.stderr) == expected
    # the second session measures the passing ones again, never the failing one
    assert _searched(outside.stderr) == expected - {
        ("level1/1_matmul", "rounds=1 variant=wrong", "mismatch")
    }
    for result in (inside, outside):
        assert re.search(r"^level1/1_matmul +3 +\d +1 mismatch", result.stdout, re.M), result.stdout
        assert "3 valid configurations" in result.stderr
    assert _sessions(warm / ".kbd" / "results.db") == {1: "done", 2: "done"}
    assert "tune 1: 1 kernels" in _paths(warm).log.read_text()


def test_failures_and_bad_input_end_a_tune_in_the_daemon_as_here(warm):
    failing = tunable(warm, ["wrong"], default="wrong")
    args = fixture_args("level1/1_", "--pipeline", str(failing), *QUICK)
    inside = kbd("tune", *args, cwd=warm)
    assert inside.returncode == 1
    assert "level1/1_matmul: no configuration passed and was timed" in inside.stderr
    assert "every configuration failed" in inside.stdout
    bad = kbd("tune", *fixture_args("level1/2_"), cwd=warm)
    assert bad.returncode == 2
    assert bad.stderr.startswith("kbd: error: nothing to tune: level1/2_relu_scale")
    assert len(bad.stderr.splitlines()) == 1 and bad.stdout == ""


def test_detach_attach_cancel_and_resume_a_tune_in_the_daemon(warm):
    detached = kbd("tune", *fixture_args("level1/1_", *FAULTY), "--detach", cwd=warm)
    assert detached.returncode == 0, detached.stderr
    tune_id = int(detached.stdout.strip())
    assert f"`kbd attach --tune {tune_id}` follows it" in detached.stderr
    follower = subprocess.Popen(
        [sys.executable, "-m", "kbd", "attach", "--tune", str(tune_id)],
        cwd=warm,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    running = set()  # the candidates `kbd daemon status` showed running
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = {s["tune_id"]: s for s in _status(warm)["sweeps"]}.get(tune_id, {})
        running.update(state.get("running", ()))
        if state.get("followers") == 1 and running:
            break
        time.sleep(0.2)
    assert running and all(name.startswith("level1/1_matmul@") for name in running), running
    cancel = kbd("cancel", "--tune", str(tune_id), "--kill", cwd=warm)
    assert cancel.returncode == 0, cancel.stderr
    assert f"cancelling tune {tune_id}" in cancel.stderr
    _, err = follower.communicate(timeout=120)
    assert follower.returncode == 1, err
    assert f"following tune {tune_id}" in err
    assert f"interrupted; `kbd tune --resume {tune_id}` continues" in err
    db = warm / ".kbd" / "results.db"
    assert _sessions(db)[tune_id] == "interrupted"
    resumed = kbd("tune", "--resume", str(tune_id), cwd=warm)  # in the daemon, which runs
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming session {tune_id}" in resumed.stderr
    assert "starting a daemon" not in resumed.stderr
    search = [t[1] for t in trials_of(db) if t[0] == tune_id and t[2] == "search"]
    assert len(search) == len(set(search)) == 6
    assert _sessions(db)[tune_id] == "done"


def test_kill_9_of_the_daemon_mid_tune_then_resume_measures_nothing_twice(tmp_path):
    assert kbd("daemon", "start", cwd=tmp_path, timeout=180).returncode == 0
    daemon_pid = _paths(tmp_path).read_info()["pid"]
    detached = kbd("tune", *fixture_args("level1/1_", *FAULTY), "--detach", cwd=tmp_path)
    assert detached.returncode == 0, detached.stderr
    db = tmp_path / ".kbd" / "results.db"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(trials_of(db)) < 2:
        time.sleep(0.2)
    os.kill(daemon_pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while _kbd_processes_of(daemon_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _kbd_processes_of(daemon_pid) == []  # template and workers died with it
    before = trials_of(db)
    assert 2 <= len(before) < 6
    assert _sessions(db) == {1: "running"}  # left as it was: resumable
    resumed = kbd("tune", "--resume", cwd=tmp_path)  # no daemon runs now: in this process
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming session 1" in resumed.stderr
    search = [t[1] for t in trials_of(db) if t[2] == "search"]
    assert len(search) == len(set(search)) == 6
    assert trials_of(db)[: len(before)] == before
    assert _sessions(db) == {1: "done"}
