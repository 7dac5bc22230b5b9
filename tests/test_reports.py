"""Human lines, JSON Lines, the summary table and JUnit XML."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET

import pytest

from kbd.plan.invocation import Invocation
from kbd.results.record import Record
from kbd.views.progress import Progress
from kbd.views.reports import counts, json_line, line, show, shown, summary, write_junit


def record(kernel: str, outcome: str, **fields) -> Record:
    fields.setdefault("phase", "check")
    return Record(kernel=kernel, outcome=outcome, **fields)


RECORDS = [
    record("level1/1_A.py", "pass", wall_s=1.0, passing_tolerance=1e-4),
    record("level1/2_B.py", "mismatch", message="max abs error 0.5", wall_s=2.0),
    record("level2/3_C.py", "crash", phase="jit", signal="SIGSEGV", message="worker killed"),
    record("level1/4_D.py", "xfail", phase="run", message="expected"),
    record("level3/5_E.py", "skipped", phase="load", message="no shapes"),
    record("level1/6_F.py", "xpass", message="expected to fail but passed"),
    record("level1/7_G.py", "pass", wall_s=0.5),
    record("level2/8_H.py", "timeout", phase="bench", message="no result after 30 s"),
]


# --- line ------------------------------------------------------------------------------------


def test_line_pass():
    r = record(
        "level1/1_A.py",
        "pass",
        wall_s=1.234,
        peak_rss_bytes=3 << 20,
        passing_tolerance=1e-4,
        message="ignored",
    )
    assert line(r) == "PASS     level1/1_A.py  [check]  1.23s  3.0 MiB  tol 0.0001"


def test_line_crash_has_signal_and_message():
    r = record(
        "level2/3_C.py", "crash", phase="jit", signal="SIGSEGV", message="worker killed by SIGSEGV"
    )
    text = line(r)
    assert text.startswith("CRASH    level2/3_C.py  [jit]  0.00s  -  ")
    assert text.endswith("SIGSEGV  worker killed by SIGSEGV")


def test_line_mismatch_tolerance_then_message():
    r = record("level1/2_B.py", "mismatch", passing_tolerance=0.1, message="max abs error 0.05")
    assert line(r).endswith("  tol 0.1  max abs error 0.05")


def test_line_tolerance_not_shown_for_errors():
    r = record("level1/2_B.py", "error", passing_tolerance=0.1, message="boom")
    assert "tol" not in line(r)
    assert line(r).endswith("  boom")


def test_line_without_detail():
    assert line(record("level1/1_A.py", "pass")) == "PASS     level1/1_A.py  [check]  0.00s  -"


def test_warning_is_shown_before_the_line_as_lighthouse_prints_it():
    r = record("level1/95_CE.py", "error", message="boom", warning="RuntimeError: gather()")
    assert shown(r) == f"WARNING: RuntimeError: gather()\n{line(r)}"
    assert "WARNING" not in line(r)
    assert shown(record("level1/1_A.py", "pass")) == line(record("level1/1_A.py", "pass"))


@pytest.mark.parametrize("live", [False, True])
def test_show_prints_the_warning_right_above_the_kernels_line(live):
    """Plain output and the live display alike: the warning, then the line, then the status
    block redrawn below both."""
    stream = io.StringIO()
    progress = Progress(total=2, live=live, stream=stream)
    progress.started("level1/95_CE.py")
    r = record("level1/95_CE.py", "error", message="boom", warning="RuntimeError: gather()")
    show(Invocation(command="run"), progress, r)
    shown_text = f"WARNING: RuntimeError: gather()\n{line(r)}\n"
    text = stream.getvalue()
    if live:  # the block drawn at the start is cleared, then the two lines, then the block
        assert text.startswith("[0/2]") and "\x1b[1A\x1b[2K" + shown_text + "[1/2]" in text
    else:
        assert text == shown_text


# --- json_line -------------------------------------------------------------------------------


def test_json_line_fields():
    r = record(
        "level2/3_C.py",
        "crash",
        phase="jit",
        signal="SIGSEGV",
        message="worker killed",
        wall_s=1.5,
        peak_rss_bytes=1234,
    )
    text = json_line(r)
    assert "\n" not in text
    data = json.loads(text)
    assert {
        key: data[key]
        for key in ("kernel", "outcome", "phase", "signal", "message", "wall_s", "peak_rss_bytes")
    } == {
        "kernel": "level2/3_C.py",
        "outcome": "crash",
        "phase": "jit",
        "signal": "SIGSEGV",
        "message": "worker killed",
        "wall_s": 1.5,
        "peak_rss_bytes": 1234,
    }


def test_json_line_nulls():
    data = json.loads(json_line(record("level1/1_A.py", "pass")))
    assert data["signal"] is None
    assert data["peak_rss_bytes"] is None
    assert data["message"] == ""
    assert data["warning"] is None


def test_json_line_carries_the_warning():
    r = record("level1/95_CE.py", "error", warning="error: 'torch.constant.bool'")
    assert json.loads(json_line(r))["warning"] == "error: 'torch.constant.bool'"


# --- summary ---------------------------------------------------------------------------------


def test_counts_in_outcome_order():
    assert counts(RECORDS) == "2 pass, 1 xfail, 1 mismatch, 1 crash, 1 timeout, 1 xpass, 1 skipped"
    assert counts([]) == ""


def test_summary_all_pass():
    records = [record("level1/1_A.py", "pass"), record("level1/7_G.py", "pass")]
    assert summary(records) == "2 kernels: 2 pass"
    assert summary(records, wall_s=12.345) == "2 kernels: 2 pass in 12.3s"


def test_summary_nothing_run():
    assert summary([]) == "0 kernels: none run"


def test_summary_failure_table():
    lines = summary(RECORDS, wall_s=3.0).splitlines()
    assert lines[0] == (
        "8 kernels: 2 pass, 1 xfail, 1 mismatch, 1 crash, 1 timeout, 1 xpass, 1 skipped in 3.0s"
    )
    assert lines[1] == ""
    assert lines[2].split() == ["outcome", "kernel", "phase", "message"]
    rows = [row.split()[:3] for row in lines[3:]]
    assert rows == [
        ["xfail", "level1/4_D.py", "run"],
        ["mismatch", "level1/2_B.py", "check"],
        ["crash", "level2/3_C.py", "jit"],
        ["timeout", "level2/8_H.py", "bench"],
        ["xpass", "level1/6_F.py", "check"],
        ["skipped", "level3/5_E.py", "load"],
    ]
    assert lines[5].endswith("SIGSEGV: worker killed")
    assert lines[4].endswith("max abs error 0.5")
    assert not any("level1/1_A.py" in row or "level1/7_G.py" in row for row in lines)


def test_summary_sorts_same_outcome_by_kernel_and_truncates_message():
    records = [
        record("level1/9_Z.py", "error", message="x" * 500),
        record("level1/1_A.py", "error", message="short"),
    ]
    rows = summary(records).splitlines()[3:]
    assert rows[0].split()[1] == "level1/1_A.py"
    assert rows[1].split()[1] == "level1/9_Z.py"
    assert rows[1].endswith("x" * 160)
    assert "x" * 161 not in rows[1]


# --- JUnit -----------------------------------------------------------------------------------


def test_write_junit(tmp_path):
    timeout = record(
        "level2/8_H.py", "timeout", phase="bench", message="no result after 30 s", log="/logs/h"
    )
    records = [*RECORDS[:7], timeout]
    path = tmp_path / "out" / "junit.xml"
    write_junit(records, path, suite="ci")
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    (suite,) = root
    assert suite.get("name") == "ci"
    assert suite.get("tests") == "8"
    assert suite.get("failures") == "4"  # mismatch, crash, xpass, timeout
    assert suite.get("skipped") == "2"  # xfail, skipped
    assert suite.get("errors") == "0"
    assert suite.get("time") == "3.500"
    cases = suite.findall("testcase")
    assert [c.get("classname") for c in cases[:3]] == ["kbd.level1", "kbd.level1", "kbd.level2"]
    assert cases[0].get("name") == "1_A.py"
    assert cases[0].get("time") == "1.000"
    assert len(suite.findall("testcase/failure")) == 4
    assert len(suite.findall("testcase/skipped")) == 2
    assert list(cases[0]) == []
    assert list(cases[6]) == []
    crash = cases[2].find("failure")
    assert crash.get("type") == "crash"
    assert crash.get("message") == "crash in jit (SIGSEGV): worker killed"
    timeout = cases[7].find("failure")
    assert timeout.text == "timeout in bench\nno result after 30 s\nlog: /logs/h"
    skipped = cases[3].find("skipped")
    assert skipped.get("message") == "xfail in run: expected"


def test_write_junit_empty(tmp_path):
    path = tmp_path / "junit.xml"
    write_junit([], path)
    (suite,) = ET.parse(path).getroot()
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("0", "0", "0")
