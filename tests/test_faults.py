"""Every fixture kernel, correct or faulty, gets its right outcome in one `-j 2` sweep."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import psutil
import pytest

from kbd.results.record import Record
from tests.conftest import fixture_args, json_records, kbd

EXPECTED = {
    "level1/1_matmul": ("pass", "check", None),
    "level1/2_relu_scale": ("pass", "check", None),
    "level1/3_sum_reduction": ("pass", "check", None),
    "level1/4_conv2d": ("pass", "check", None),
    "level1/5_cross_entropy": ("pass", "check", None),
    "level1/6_cumsum": ("pass", "check", None),
    "level9/1_mismatch": ("mismatch", "check", None),
    "level9/2_raise": ("error", "reference", None),
    "level9/3_segfault": ("crash", "reference", "SIGSEGV"),
    "level9/4_llvm_abort": ("crash", "reference", "SIGABRT"),
    "level9/5_early_exit": ("error", "reference", None),
    "level9/6_hang": ("timeout", "reference", None),
    "level9/7_stdout_flood": ("pass", "check", None),
    "level9/8_memory_hog": ("memory", "reference", None),
    "level9/9_orphan": ("pass", "check", None),
    "level9/10_protocol_garbage": ("error", "reference", None),
}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("zoo")
    # The sweep's own TMPDIR: each worker's scratch folder is made in it and becomes the worker's
    # TMPDIR, which the orphan fixture's children inherit; that is how test_no_orphans_survive
    # tells them from those of another sweep running the fixture at the same time (test_cluster).
    tmp = cwd / "tmp"
    tmp.mkdir()
    args = fixture_args("--json", "-j", "2", "--timeout", "10", "--mem-limit", "2GiB")
    process = subprocess.Popen(
        [sys.executable, "-m", "kbd", "sweep", *args],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )  # fmt: skip
    stdout, stderr = process.communicate(timeout=300)
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    result.pid = process.pid
    result.tmp = tmp
    return result, json_records(stdout), cwd


def test_every_kernel_is_reported(zoo):
    result, records, _ = zoo
    assert set(records) == set(EXPECTED), result.stderr
    assert result.returncode == 1  # some kernels failed unexpectedly


@pytest.mark.parametrize("kernel", sorted(EXPECTED))
def test_outcome(zoo, kernel):
    _, records, _ = zoo
    outcome, phase, signal = EXPECTED[kernel]
    record = records[kernel]
    assert (record["outcome"], record["phase"], record["signal"]) == (outcome, phase, signal), (
        record
    )


def test_json_records_are_complete(zoo):
    _, records, cwd = zoo
    for record in records.values():
        decoded = msgspec.convert(record, Record)  # every field with its type
        assert decoded.wall_s > 0 and decoded.peak_rss_bytes > 0
        assert (cwd / decoded.log).is_file()
        assert decoded.outcome == "pass" or decoded.message


def test_sweeps_without_benchmark_carry_no_bench_fields(zoo):
    _, records, _ = zoo
    for record in records.values():
        assert record["bench"] is None and record["not_benchmarked"] is None
        assert record["phase"] != "bench" and "bench" not in record["times"]
    assert records["level1/2_relu_scale"]["phase"] == "check"


def test_messages_explain_failures(zoo):
    _, records, _ = zoo
    assert records["level9/4_llvm_abort"]["message"].startswith("LLVM ERROR: SmallVector")
    assert "fixture kernel refuses to run" in records["level9/2_raise"]["message"]
    assert "status 0" in records["level9/5_early_exit"]["message"]
    assert "passes at" in records["level9/1_mismatch"]["message"]
    assert records["level9/1_mismatch"]["passing_tolerance"] == 1.0
    assert "2.0 GiB" in records["level9/8_memory_hog"]["message"]
    assert "10 s" in records["level9/6_hang"]["message"]


def test_limits_are_recorded(zoo):
    _, records, _ = zoo
    limits = records["level1/1_matmul"]["limits"]
    assert limits["memory"] == f"RLIMIT_DATA={2 << 30}"
    assert limits["threads"] == "1"
    assert limits["timeout"] == "10s"


def test_flood_log_is_capped(zoo):
    _, records, cwd = zoo
    log = cwd / records["level9/7_stdout_flood"]["log"]
    size = log.stat().st_size
    assert 30 << 20 < size < 33 << 20
    assert log.read_bytes().endswith(b"[kbd] output truncated: log cap reached\n")


def test_no_orphans_survive(zoo):
    """Neither the orphan fixture's children nor any kbd process outlive the sweep."""
    result, records, _ = zoo
    limits = records["level9/9_orphan"]["limits"]["filesystem"]
    if "read-only except" in limits:  # the worker's scratch folder (its TMPDIR) was in ours
        assert f"read-only except {result.tmp}/kbd-level9-9_orphan-" in limits
    assert _sleeps_started_under(result.tmp) == []
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not [line for line in ps.splitlines() if line.endswith(f" {result.pid}")]


def _sleeps_started_under(tmp: Path) -> list[int]:
    """Live `sleep 86400.123` processes (the orphan fixture's children) whose TMPDIR is in `tmp`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        if proc.info["cmdline"] == ["sleep", "86400.123"]:
            environ = proc.info["environ"]  # None if unreadable: then it may be ours
            if environ is None or environ.get("TMPDIR", "").startswith(f"{tmp}/"):
                found.append(proc.pid)
    return found


def test_sweep_is_stored(zoo):
    _, records, cwd = zoo
    stored = json_records(kbd("results", "--json", cwd=cwd).stdout)
    assert {k: r["outcome"] for k, r in stored.items()} == {
        k: r["outcome"] for k, r in records.items()
    }
