"""Classifying a worker's end into one outcome, and applying expected failures."""

from __future__ import annotations

import pytest

from kbd.plan.catalog import Expectation
from kbd.results.record import Death, Record, classify, expect
from kbd.shared.protocol import Result

PASS = Result(outcome="pass", phase="check", passing_tolerance=1e-4)
MISMATCH = Result(outcome="mismatch", phase="check", message="max abs error 0.05")


def test_result_pass():
    assert classify(PASS, Death(returncode=0, last_phase="check")) == ("pass", "check", None, "")


def test_result_mismatch():
    outcome = classify(MISMATCH, Death(returncode=0, last_phase="bench"))
    assert outcome == ("mismatch", "check", None, "max abs error 0.05")


def test_result_wins_over_exit_status():
    # The worker reported, then died on the way out: its report stands.
    assert classify(PASS, Death(returncode=-11, last_phase="check"))[0] == "pass"


def test_timeout_wins_over_result():
    death = Death(returncode=-9, last_phase="bench", timed_out=True, timeout_s=30)
    assert classify(PASS, death) == ("timeout", "bench", None, "no result after 30 s")


def test_timeout_wins_over_memory_and_signal():
    death = Death(
        returncode=-9, last_phase="jit", timed_out=True, timeout_s=2.5, memory_killed=True
    )
    assert classify(None, death) == ("timeout", "jit", None, "no result after 2.5 s")


def test_memory_killed():
    death = Death(
        returncode=-9,
        last_phase="run",
        memory_killed=True,
        mem_limit=2 << 30,
        peak_rss_bytes=3 << 29,
    )
    assert classify(None, death) == ("memory", "run", None, "limit 2.0 GiB, peak 1.5 GiB")


def test_memory_killed_wins_over_result():
    death = Death(returncode=-9, last_phase="check", memory_killed=True)
    assert classify(MISMATCH, death) == ("memory", "check", None, "out of memory")


def test_sigsegv():
    outcome, phase, signal, message = classify(None, Death(returncode=-11, last_phase="run"))
    assert (outcome, phase, signal) == ("crash", "run", "SIGSEGV")
    assert message == "worker killed by SIGSEGV"


def test_unknown_signal_number():
    _, _, signal, message = classify(None, Death(returncode=-200, last_phase="run"))
    assert signal == "signal 200"
    assert message == "worker killed by signal 200"


def test_sigabrt_with_llvm_error():
    death = Death(returncode=-6, last_phase="pipeline:lower", llvm_error="LLVM ERROR: foo")
    assert classify(None, death) == ("crash", "pipeline:lower", "SIGABRT", "LLVM ERROR: foo")


@pytest.mark.parametrize(
    "llvm_error",
    [
        "LLVM ERROR: out of memory",
        "terminate: std::bad_alloc",
        "LLVM ERROR: Allocation failed",
        "LLVM ERROR: Unable to allocate section memory!",  # the JIT's code under the cap
    ],
)
def test_sigabrt_out_of_memory(llvm_error):
    death = Death(returncode=-6, last_phase="jit", llvm_error=llvm_error, mem_limit=1 << 30)
    outcome, phase, signal, message = classify(None, death)
    assert (outcome, phase, signal) == ("memory", "jit", "SIGABRT")
    assert message == f"{llvm_error} (limit 1.0 GiB)"


def test_exit_zero_without_result():
    outcome, phase, signal, message = classify(None, Death(returncode=0, last_phase="import"))
    assert (outcome, phase, signal) == ("error", "import", None)
    assert "status 0" in message
    assert "before reporting a result" in message


def test_exit_status_one_without_result():
    assert "status 1" in classify(None, Death(returncode=1, last_phase="load"))[3]


def test_never_reaped():
    outcome, _, signal, message = classify(None, Death(returncode=None, last_phase="load"))
    assert (outcome, signal) == ("error", None)
    assert "status None" in message


def test_protocol_error():
    death = Death(returncode=0, last_phase="run", protocol_error="undecodable frame: x")
    assert classify(None, death) == (
        "error",
        "run",
        None,
        "worker protocol error: undecodable frame: x",
    )


def test_protocol_error_wins_over_signal():
    death = Death(returncode=-11, last_phase="run", protocol_error="bad")
    assert classify(None, death)[0] == "error"


# --- expect ----------------------------------------------------------------------------------


def test_expect_without_expectation():
    assert expect("crash", "run", "boom", None) == ("crash", None)
    assert expect("pass", "check", "", None) == ("pass", None)


def test_expect_matching_failure_is_xfail():
    expectation = Expectation("crash", "jit", "LLVM ERROR")
    assert expect("crash", "jit", "LLVM ERROR: foo", expectation) == ("xfail", None)


def test_expect_pass_is_xpass():
    outcome, note = expect("pass", "check", "", Expectation("crash", "jit"))
    assert outcome == "xpass"
    assert note == "expected to fail (crash / jit) but passed"


def test_expect_different_failure_keeps_outcome_with_note():
    expectation = Expectation("crash", "jit", "LLVM ERROR")
    assert expect("mismatch", "check", "max abs", expectation) == (
        "mismatch",
        "expected crash / jit / LLVM ERROR",
    )
    assert expect("crash", "run", "LLVM ERROR: x", expectation) == (
        "crash",
        "expected crash / jit / LLVM ERROR",
    )
    assert expect("crash", "jit", "worker killed", expectation)[0] == "crash"


# --- Record ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "failed"),
    [(o, True) for o in ("mismatch", "error", "crash", "timeout", "memory", "xpass")]
    + [(o, False) for o in ("pass", "xfail", "skipped")],
)
def test_record_failed(outcome, failed):
    assert Record(kernel="level1/1_K.py", outcome=outcome, phase="run").failed is failed
