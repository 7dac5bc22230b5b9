"""Expected failures: recorded from a sweep's evidence, then honoured by later runs."""

from __future__ import annotations

from pathlib import Path

from kbd import cli
from kbd.plan import catalog
from kbd.plan.catalog import Expectation
from kbd.results.record import Record
from kbd.results.store import Store
from tests.conftest import FIXTURE_KB, json_records, kbd


def update_xfail(*args: str) -> int:
    return cli.main(["levels", "update-xfail", *args])


LEVELS = """\
# header comment
- kernel: level1/1_matmul.py
  input_shapes: [32x48, 48x16]
  initializations: [rnd, rnd]
# a comment about the next entry
- kernel: level9/2_raise.py
  xfail: {outcome: crash, phase: load}
- kernel: level9/3_segfault.py
  warning: "SIGSEGV, as lighthouse notes it"
- kernel: level9/6_hang.py
  dtype: f64
"""


def _sweep(db: Path, records: list[Record]) -> None:
    store = Store(db)
    sweep = store.create_sweep("kbd sweep", "{}", [r.kernel for r in records], "hash")
    for record in records:
        store.add_attempt(sweep, "hash", record)
    store.close()


def test_records_evidence_and_drops_stale_keys(tmp_path):
    levels = tmp_path / "levels.yaml"
    levels.write_text(LEVELS)
    db = tmp_path / "results.db"
    _sweep(db, [
        Record(kernel="level1/1_matmul", outcome="pass", phase="check"),
        Record(kernel="level9/2_raise", outcome="error", phase="reference",
               message="RuntimeError: no\nsecond line [expected crash / load]"),
        Record(kernel="level9/3_segfault", outcome="crash", phase="reference", signal="SIGSEGV",
               message="worker killed by SIGSEGV"),
        Record(kernel="level9/6_hang", outcome="timeout", phase="run",
               message="no result after 10 s"),
    ])  # fmt: skip
    assert update_xfail("--db", str(db), "--levels", str(levels)) == 0
    text = levels.read_text()
    assert "# a comment about the next entry\n- kernel: level9/2_raise.py" in text
    entries = {e.kernel: e for e in catalog.load_file(levels)}
    assert entries["level1/1_matmul.py"].xfail is None
    assert entries["level9/2_raise.py"].xfail == Expectation(
        "error", "reference", "RuntimeError: no"
    )
    assert entries["level9/3_segfault.py"].xfail == Expectation(
        "crash", "reference", "worker killed by SIGSEGV"
    )
    assert entries["level9/6_hang.py"].xfail == Expectation("timeout", "run")  # no message
    assert entries["level9/6_hang.py"].dtype == "f64"  # other keys stay
    assert entries["level9/3_segfault.py"].warning == "SIGSEGV, as lighthouse notes it"
    assert '  warning: "SIGSEGV, as lighthouse notes it"\n  xfail: {' in text  # xfail stays last
    # Idempotent: the same evidence gives the same file.
    update_xfail("--db", str(db), "--levels", str(levels))
    assert levels.read_text() == text


def test_xfail_xpass_and_different_failure(tmp_path):
    levels = tmp_path / "levels.yaml"
    levels.write_text(
        "- kernel: level1/1_matmul.py\n"
        "  xfail: {outcome: crash}\n"
        "- kernel: level9/2_raise.py\n"
        "  xfail: {outcome: error, phase: reference, message: 'RuntimeError: fixture'}\n"
        "- kernel: level9/3_segfault.py\n"
        "  xfail: {outcome: error, phase: reference}\n"
    )
    result = kbd("run", "--kernelbench", str(FIXTURE_KB), "--levels", str(levels), "--json",
                 cwd=tmp_path)  # fmt: skip
    records = json_records(result.stdout)
    assert records["level1/1_matmul"]["outcome"] == "xpass"
    assert records["level9/2_raise"]["outcome"] == "xfail"
    assert records["level9/3_segfault"]["outcome"] == "crash"
    assert "expected error / reference" in records["level9/3_segfault"]["message"]
    assert result.returncode == 1


def test_only_expected_failures_exit_zero(tmp_path):
    levels = tmp_path / "levels.yaml"
    levels.write_text(
        "- kernel: level9/3_segfault.py\n"
        "  xfail: {outcome: crash, phase: reference, message: worker killed by SIGSEGV}\n"
    )
    result = kbd("run", "--kernelbench", str(FIXTURE_KB), "--levels", str(levels), cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    assert "1 xfail" in result.stdout


def test_a_sweep_in_another_element_type_writes_and_rewrites_only_its_own(tmp_path):
    """A bf16 failure is expected in bf16 only (`dtype: bf16`); a bf16 sweep leaves an xfail
    without dtype (f32's evidence) alone, and an f32 sweep leaves a bf16 one alone."""
    levels = tmp_path / "levels.yaml"
    levels.write_text(LEVELS)
    db = tmp_path / "results.db"
    _sweep(db, [
        Record(kernel="level1/1_matmul", dtype="bf16", outcome="mismatch", phase="check",
               message="max abs error 9"),
        Record(kernel="level9/2_raise", dtype="bf16", outcome="pass", phase="check"),
    ])  # fmt: skip
    assert update_xfail("--db", str(db), "--levels", str(levels)) == 0
    entries = {e.kernel: e for e in catalog.load_file(levels)}
    matmul = entries["level1/1_matmul.py"]
    assert matmul.xfail == Expectation("mismatch", "check", "max abs error 9", dtype="bf16")
    assert matmul.expectation is None  # the entry runs in f32: not expected there
    assert catalog.with_dtype(matmul, "bf16").expectation == matmul.xfail
    assert entries["level9/2_raise.py"].xfail == Expectation("crash", "load")  # f32's: kept
    _sweep(db, [Record(kernel="level1/1_matmul", outcome="pass", phase="check")])
    assert update_xfail("--db", str(db), "--levels", str(levels)) == 0
    assert {e.kernel: e for e in catalog.load_file(levels)}["level1/1_matmul.py"].xfail == (
        matmul.xfail
    )
