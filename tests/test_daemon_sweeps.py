"""Runs and sweeps through a real daemon: the same results, detach/attach/cancel, two clients
sharing one budget, and kill -9 of the daemon mid-sweep."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import psutil
import pytest

from kbd.daemon.client import connect
from kbd.daemon.state import StatePaths
from kbd.daemon.wire import StatusRequest
from kbd.results.store import Store
from tests.conftest import (
    FIXTURE_KB,
    LIGHTHOUSE_FORM,
    LIGHTHOUSE_WARNING,
    fixture_args,
    json_records,
    kbd,
)
from tests.test_kernelbench_shapes import OWN_TWO, OWN_TWO_ENDS, ends

QUICK = ("level1/2_", "level1/3_")


def _paths(cwd: Path) -> StatePaths:
    return StatePaths.for_store(cwd / ".kbd" / "results.db")


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """One warm daemon shared by the tests of this module. Their sweeps leave `-j` at its
    default, one worker per core, which the template the daemon warms at start serves (`-j 1`
    would make the daemon start a second one, for workers of all cores: seconds of CPU)."""
    cwd = tmp_path_factory.mktemp("daemon")
    started = kbd("daemon", "start", "--idle-timeout", "600", cwd=cwd, timeout=180)
    assert started.returncode == 0, started.stderr
    yield cwd
    kbd("daemon", "stop", "--now", cwd=cwd, timeout=60)


def _status(cwd: Path) -> dict:
    """The daemon's status, asked on its socket from here: the loops below poll it, and a
    `kbd daemon status` process each time would cost a Python start (~0.3 s of CPU)."""
    connection = connect(_paths(cwd))
    assert connection is not None, "no daemon running"
    try:
        return msgspec.to_builtins(connection.request(StatusRequest()))
    finally:
        connection.close()


def _sweep_rows(cwd: Path) -> list[tuple]:
    return [(s.id, s.status) for s in Store(cwd / ".kbd" / "results.db").sweeps()]


def _attempts(cwd: Path, sweep_id: int) -> dict[str, str]:
    with sqlite3.connect(cwd / ".kbd" / "results.db") as db:
        rows = db.execute(
            "SELECT kernel, outcome FROM attempts WHERE sweep_id = ?", (sweep_id,)
        ).fetchall()
    return dict(rows)


def test_run_in_the_daemon_matches_run_without_it(warm):
    args = fixture_args(*QUICK, "level9/1_", "--json")
    inside = kbd("run", *args, cwd=warm)
    outside = kbd("run", *args, "--no-daemon", cwd=warm)
    assert "starting a daemon" not in inside.stderr
    got, expected = json_records(inside.stdout), json_records(outside.stdout)
    assert {k: r["outcome"] for k, r in got.items()} == {
        k: r["outcome"] for k, r in expected.items()
    }
    assert inside.returncode == outside.returncode == 1  # level9/1_ is a mismatch
    assert "run 1: 3 kernels" in _paths(warm).log.read_text()


def test_a_levels_warning_is_shown_through_the_daemon(warm):
    """The daemon's records carry the entry's `warning`; the client prints it above the line."""
    result = kbd(
        "run", "--kernelbench", str(FIXTURE_KB), "--levels", str(LIGHTHOUSE_FORM), "level1/7_",
        cwd=warm,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "starting a daemon" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines[lines.index(LIGHTHOUSE_WARNING) + 1].startswith("PASS     level1/7_mse_loss ")


def test_kernelbench_shapes_in_the_daemon_match_a_run_without_it(warm):
    """--shapes kernelbench travels in the spec: the daemon sizes each kernel first and skips
    the one whose inputs would not fit, as a run in this process does."""
    inside = kbd("run", *OWN_TWO, "--json", cwd=warm)
    outside = kbd("run", *OWN_TWO, "--json", "--no-daemon", cwd=warm)
    assert "starting a daemon" not in inside.stderr
    assert inside.returncode == outside.returncode == 0, inside.stderr
    assert ends(json_records(inside.stdout)) == ends(json_records(outside.stdout)) == OWN_TWO_ENDS


def test_bad_input_is_refused_with_status_2(warm):
    result = kbd("run", *fixture_args("level7/"), "--daemon", cwd=warm)
    assert result.returncode == 2
    assert "level7/" in result.stderr


def test_two_clients_share_the_daemon_and_its_budget(warm):
    before = {row[0] for row in _sweep_rows(warm)}
    clients = [
        subprocess.Popen(
            [sys.executable, "-m", "kbd", "sweep", *fixture_args(prefix)],
            cwd=warm,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for prefix in ("level1/2_", "level1/3_")
    ]
    for client in clients:
        _, err = client.communicate(timeout=300)
        assert client.returncode == 0, err
    new = [row for row in _sweep_rows(warm) if row[0] not in before]
    assert [status for _, status in new] == ["done", "done"]
    for sweep_id, _ in new:
        assert list(_attempts(warm, sweep_id).values()) == ["pass"]
    status = _status(warm)
    assert 0 < status["peak_rss_total"] <= status["budget"]


def test_detach_attach_and_cancel(warm):
    args = fixture_args("level9/6_", *QUICK, "--timeout", "60")
    detached = kbd("sweep", *args, "--detach", cwd=warm)
    assert detached.returncode == 0, detached.stderr
    sweep_id = int(detached.stdout.strip())
    # two followers at once, from other terminals
    followers = [
        subprocess.Popen(
            [sys.executable, "-m", "kbd", "attach", str(sweep_id)],
            cwd=warm,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sweeps = {s["sweep_id"]: s for s in _status(warm)["sweeps"]}
        if sweeps.get(sweep_id, {}).get("followers") == 2:
            break
        time.sleep(0.2)
    cancel = kbd("cancel", str(sweep_id), "--kill", cwd=warm)
    assert cancel.returncode == 0, cancel.stderr
    for follower in followers:
        _, err = follower.communicate(timeout=120)
        assert f"sweep {sweep_id} interrupted" in err
    assert dict(_sweep_rows(warm))[sweep_id] == "interrupted"


def _kbd_processes_of(pid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "kbd.worker.template" in cmdline and str(pid) in cmdline:
            found.append(proc)
    return found


def test_kill_9_of_the_daemon_loses_only_kernels_in_flight(tmp_path):
    assert kbd("daemon", "start", cwd=tmp_path, timeout=180).returncode == 0
    daemon_pid = _paths(tmp_path).read_info()["pid"]
    # -O0 and 8 s: quick kernels stay far from the limit; the resume waits out the hang once.
    args = fixture_args(*QUICK, "level9/6_", "-O", "0", "--timeout", "8")
    sweep_id = int(kbd("sweep", *args, "--detach", cwd=tmp_path).stdout.strip())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until the hang runs (it is ordered first or last)
        running = {s["sweep_id"]: s["running"] for s in _status(tmp_path)["sweeps"]}
        if "level9/6_hang" in running.get(sweep_id, []):
            break
        time.sleep(0.2)
    os.kill(daemon_pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while _kbd_processes_of(daemon_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _kbd_processes_of(daemon_pid) == []  # template and workers died with it
    recorded = _attempts(tmp_path, sweep_id)
    assert "level9/6_hang" not in recorded
    resumed = kbd("sweep", "--resume", str(sweep_id), "--no-daemon", cwd=tmp_path)
    assert f"resuming sweep {sweep_id}: {3 - len(recorded)} of 3" in resumed.stderr
    final = _attempts(tmp_path, sweep_id)
    assert set(final) == {"level1/2_relu_scale", "level1/3_sum_reduction", "level9/6_hang"}
    assert {k: v for k, v in final.items() if k in recorded} == recorded  # nothing lost
