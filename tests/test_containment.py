"""Workers contain the kernel: kernels that write into the home folder, talk TCP to themselves
or open the results store are stopped, the rest of the sweep is unaffected, and where a
mechanism is missing (an older kernel, emulated with a seccomp wrapper) kbd says so loudly."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest

from kbd.results.record import Record
from kbd.views import reports
from kbd.worker import landlock
from tests.conftest import FIXTURE_KB, FIXTURE_LEVELS, ROOT, json_records, kbd

ESCAPES = ROOT / "tests" / "fixtures" / "escapes.yaml"
OLD_KERNEL = [sys.executable, str(ROOT / "tests" / "old_kernel.py")]
ESCAPE_FILE = "kbd-escaped-from-worker.txt"
KERNELS = ["level9/11_", "level9/12_", "level9/13_", "level1/1_", "level1/2_"]
STORE_SCHEMA = {
    ("table", "sweeps"),
    ("table", "sqlite_sequence"),
    ("table", "attempts"),
    ("index", "attempts_by_sweep"),
    ("index", "attempts_by_kernel"),
}


def _landlock_abi() -> int:
    try:
        return landlock.abi_version()
    except OSError:
        return 0


needs_landlock = pytest.mark.skipif(_landlock_abi() < 1, reason="the kernel has no Landlock")


def _sweep(tmp_path, *extra: str, wrapper=(), kernels=KERNELS):
    """A sweep of the escape fixtures and two correct kernels, with its own home and TMPDIR."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(tmp)}
    args = ["--kernelbench", str(FIXTURE_KB), "--levels", str(ESCAPES)]
    args += ["--levels", str(FIXTURE_LEVELS), "-j", "2", "--timeout", "60", *extra, *kernels]
    if wrapper:
        command = [*wrapper, sys.executable, "-m", "kbd", "sweep", *args]
        result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env)
    else:
        result = kbd("sweep", *args, cwd=tmp_path, env=env)
    records = json_records(kbd("results", "--json", cwd=tmp_path).stdout)
    return result, records, home, tmp


def _schema(db) -> set[tuple[str, str]]:
    with sqlite3.connect(db) as conn:
        return set(conn.execute("SELECT type, name FROM sqlite_master"))


@pytest.fixture(scope="module")
def contained(tmp_path_factory):
    return _sweep(tmp_path_factory.mktemp("contained"))


@needs_landlock
def test_escapes_are_stopped_and_the_rest_passes(contained):
    result, records, _, _ = contained
    assert result.returncode == 1, result.stderr
    outcomes = {k: (r["outcome"], r["phase"]) for k, r in records.items()}
    assert outcomes == {
        "level9/11_home_write": ("error", "reference"),
        "level9/12_tcp_loopback": ("error", "reference"),
        "level9/13_store_write": ("error", "reference"),
        "level1/1_matmul": ("pass", "check"),
        "level1/2_relu_scale": ("pass", "check"),
    }
    assert records["level9/11_home_write"]["message"].startswith("PermissionError")
    assert records["level9/12_tcp_loopback"]["message"].startswith("PermissionError")
    # the store is not even readable: sqlite cannot open it
    assert "unable to open database file" in records["level9/13_store_write"]["message"]


@needs_landlock
def test_nothing_escaped(contained):
    _, _, home, tmp = contained
    assert list(home.iterdir()) == []  # nothing written into the home folder
    assert not [p for p in tmp.iterdir() if p.name.startswith("kbd-")]  # scratch folders gone
    db = home.parent / ".kbd" / "results.db"
    assert _schema(db) == STORE_SCHEMA
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM attempts").fetchone() == (len(KERNELS),)


@needs_landlock
def test_records_say_what_was_enforced(contained):
    result, records, _, tmp = contained
    limits = records["level1/1_matmul"]["limits"]
    assert limits["filesystem"].startswith("landlock ABI")
    assert f"read-only except {tmp}/kbd-level1-1_matmul-" in limits["filesystem"]
    assert "seccomp socket() denied" in limits["network"]
    assert "containment:" not in result.stdout  # nothing to warn about


def test_without_sandbox_the_escapes_succeed(tmp_path):
    """The fixtures really do what they try when nothing stops them (and the summary says so)."""
    result, records, home, _ = _sweep(tmp_path, "--no-sandbox", kernels=KERNELS[:3])
    assert {r["outcome"] for r in records.values()} == {"pass"}, result.stdout
    assert (home / ESCAPE_FILE).exists()
    assert ("table", "kernel_was_here") in _schema(tmp_path / ".kbd" / "results.db")
    assert "containment: filesystem not enforced for 3 kernels: turned off" in result.stdout
    assert "containment: network not enforced for 3 kernels: turned off" in result.stdout


def test_missing_mechanisms_are_reported(tmp_path):
    """Without Landlock and namespaces the kernel still runs, records and summary say what was
    not enforced, and the socket filter still stops the network."""
    kernels = ["level9/11_", "level9/12_", "level1/1_"]
    result, records, home, _ = _sweep(tmp_path, wrapper=OLD_KERNEL, kernels=kernels)
    assert records["level9/11_home_write"]["outcome"] == "pass"  # not contained, but ran
    assert (home / ESCAPE_FILE).exists()
    assert records["level9/12_tcp_loopback"]["outcome"] == "error"
    assert records["level1/1_matmul"]["outcome"] == "pass"
    limits = records["level1/1_matmul"]["limits"]
    assert limits["filesystem"] == (
        "not enforced: Landlock unavailable: the kernel has no Landlock syscalls"
    )
    assert limits["network"].startswith("seccomp socket() denied (unavailable: no network")
    assert (
        "containment: filesystem not enforced for 3 kernels: Landlock unavailable" in result.stdout
    )


def test_require_sandbox_makes_a_missing_mechanism_an_error(tmp_path):
    result, records, home, _ = _sweep(
        tmp_path, "--require-sandbox", wrapper=OLD_KERNEL, kernels=["level9/11_", "level1/1_"]
    )
    assert result.returncode == 1
    for record in records.values():
        assert (record["outcome"], record["phase"]) == ("error", "sandbox")
        assert record["message"].startswith(
            "containment required but not enforced: filesystem: Landlock unavailable"
        )
    assert list(home.iterdir()) == []  # the kernel never ran


def test_require_and_no_sandbox_contradict(tmp_path):
    result = kbd("run", "--require-sandbox", "--no-sandbox", "--kernelbench", str(FIXTURE_KB),
                 "--levels", str(FIXTURE_LEVELS), "level1/1_", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2
    assert "contradict" in result.stderr


@needs_landlock
def test_doctor_reports_every_enforcement(tmp_path):
    result = kbd("doctor", "--strict", cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("memory cap", "core pinning", "timeout", "filesystem", "network",
                 "descriptors", "process cleanup"):  # fmt: skip
        line = next(line for line in result.stdout.splitlines() if line.strip().startswith(name))
        assert "works" in line, line


def test_doctor_strict_fails_when_a_mechanism_is_missing(tmp_path):
    command = [*OLD_KERNEL, sys.executable, "-m", "kbd", "doctor", "--strict"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert result.returncode == 1
    line = next(line for line in result.stdout.splitlines() if "filesystem" in line)
    assert "NOT ENFORCED" in line and "Landlock unavailable" in line
    assert "not enforced here: filesystem" in result.stderr


def test_containment_lines_count_kernels_per_reason():
    off = {"filesystem": "not enforced: no Landlock", "network": "netns"}
    records = [Record(kernel=f"k{i}", outcome="pass", phase="check", limits=off) for i in (1, 2)]
    assert reports.containment_lines(records) == [
        "containment: filesystem not enforced for 2 kernels: no Landlock"
    ]


@needs_landlock
def test_hidden_paths_are_unreadable_even_through_a_symlinked_ancestor(tmp_path):
    """The store stays unreadable although a sibling symlink points at its folder (as pytest's
    `pytest-current` does), while its neighbours stay readable and nothing is writable."""
    store = tmp_path / "run" / ".kbd"
    store.mkdir(parents=True)
    (store / "results.db").write_text("secret")
    (store / "neighbour.log").write_text("fine")
    (tmp_path / "current").symlink_to(tmp_path / "run")
    code = (
        "import sys\n"
        "from kbd.worker import landlock\n"
        "landlock.restrict([], [], [sys.argv[1] + '/run/.kbd/results.db'])\n"
        "def attempt(path, mode='r'):\n"
        "    try:\n"
        "        open(path, mode).close()\n"
        "        return 'ok'\n"
        "    except PermissionError:\n"
        "        return 'denied'\n"
        "print(attempt(sys.argv[1] + '/run/.kbd/results.db'),\n"
        "      attempt(sys.argv[1] + '/current/.kbd/results.db'),\n"
        "      attempt(sys.argv[1] + '/run/.kbd/neighbour.log'),\n"
        "      attempt(sys.argv[1] + '/run/.kbd/new', 'w'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True
    )
    assert result.stdout.split() == ["denied", "denied", "ok", "denied"], result.stderr
