"""The tuning section of `kbd results --html`: a stored session's tasks with the figures and
verdict of kbd tune's summary table (one computation, kbd.results.tune_summary), the adopted
configuration and a chart of the trials; how the session is chosen."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kbd.bench import report, tune_report
from kbd.results import tune_summary
from kbd.results.store import Store
from kbd.results.tuning import Trial, TuningStore
from tests.conftest import kbd

DEFAULT = {"tile": 8, "unroll": 1}


def _trial(config, stage="search", outcome="pass", speedup=None, low=None, high=None, **more):
    return Trial(
        config=config,
        stage=stage,
        outcome=outcome,
        phase=more.pop("phase", "bench" if outcome == "pass" else "run"),
        message=more.pop("message", ""),
        speedup=speedup,
        low=low,
        high=high,
    )


def _store(path: Path) -> Store:
    """Two sessions. 1: `level1/1_mm` adopts {tile 32} (confirmed 1.9x, interval above 1.71x)
    after a crash and an out-of-memory configuration; `level1/2_conv`'s every configuration
    fails. 2: `level1/1_mm` again, its best not confirmed yet (the session was killed)."""
    store = Store(path)
    tuning = TuningStore(store)
    first = tuning.create("kbd tune level1/", "{}")
    tuning.add_task(first, "mm", "level1/1_mm", "x86_64/avx2/matmul/f32.yaml", 12, DEFAULT)
    tuning.add_task(first, "conv", "level1/2_conv", "x86_64/avx2/conv2d/f32.yaml", 4, DEFAULT)
    for trial in [
        _trial(DEFAULT, speedup=1.0, low=0.9, high=1.1),
        _trial({"tile": 16, "unroll": 1}, outcome="crash", message="worker killed by SIGSEGV"),
        _trial({"tile": 32, "unroll": 1}, speedup=2.0, low=1.8, high=2.2),
        _trial({"tile": 64, "unroll": 1}, outcome="memory", message="MemoryError: 4.0 GiB"),
        _trial({"tile": 8, "unroll": 2}, speedup=1.2, low=1.1, high=1.3),
        _trial(DEFAULT, stage="confirm", speedup=1.0, low=0.95, high=1.05),
        _trial({"tile": 32, "unroll": 1}, stage="confirm", speedup=1.9, low=1.8, high=2.0),
    ]:
        tuning.add_trial(first, "mm", "level1/1_mm", trial, None)
    for trial in [_trial(DEFAULT, outcome="mismatch"), _trial({"tile": 4}, outcome="timeout")]:
        tuning.add_trial(first, "conv", "level1/2_conv", trial, None)
    tuning.set_status(first, "done")
    second = tuning.create("kbd tune level1/1_ --budget 3", "{}")
    tuning.add_task(second, "mm", "level1/1_mm", "x86_64/avx2/matmul/f32.yaml", 12, DEFAULT)
    for trial in [
        _trial(DEFAULT, speedup=1.1, low=1.0, high=1.2),
        _trial({"tile": 32, "unroll": 2}, speedup=2.5, low=2.3, high=2.7),
    ]:
        tuning.add_trial(second, "mm", "level1/1_mm", trial, None)
    tuning.set_status(second, "interrupted")
    return store


def _section_data(page: str) -> dict:
    found = re.search(r"<script type='application/json' id='kbd-tuning'>(.*?)</script>", page)
    assert found, "no tuning data in the page"
    return json.loads(found.group(1))


def _row(page: str, kernel: str) -> list[str]:
    """The cells of a kernel's row in the tuning table, as text."""
    table = page[page.index("<table class='tuning'>") :]
    row = re.search(rf"<tr><td>{re.escape(kernel)}</td>(.*?)</tr>", table)
    assert row, f"no row for {kernel}"
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))
    return [re.sub(r"<[^>]+>", "", c) for c in cells]


def test_a_session_shows_figures_verdicts_and_the_adopted_configuration(tmp_path):
    store = _store(tmp_path / "r.db")
    tuning = TuningStore(store, create=False)
    session = tuning.sessions()[0]
    tasks = tune_summary.session(tuning, session.id)
    page = tune_report.render(tune_report.TuningSession(session, tasks))
    mm = _row(page, "level1/1_mm")
    assert mm == [
        "x86_64/avx2/matmul/f32.yaml",
        "12",
        "5",
        "1 crash, 1 memory",
        "1x",
        "0.9 - 1.1",
        "2x",
        "1.8 - 2.2",
        "adopted: 1.90x the default, interval above 1.71x",
        "tile=32 unroll=1",
    ]
    assert "<b>tile=32</b> unroll=1" in page  # what differs from the default stands out
    conv = _row(page, "level1/2_conv")
    assert conv[2:4] == ["2", "1 mismatch, 1 timeout"]
    assert conv[4] == conv[6] == "-"
    assert conv[8:] == ["every configuration failed", "default"]
    data = _section_data(page)
    assert data["session"] == 1
    first = data["tasks"][0]
    assert first["failures"] == {"crash": 1, "memory": 1}
    assert (first["adopted"], first["config"]) == (True, {"tile": 32, "unroll": 1})
    assert first["gain_low"] == pytest.approx(1.8 / 1.05)
    assert [t["outcome"] for t in first["trials"]] == ["pass", "crash", "pass", "memory", "pass"]
    # the chart: three timed points (default, best, other), two failures marked
    chart = page[page.index("<figcaption>level1/1_mm</figcaption>") :].split("</figure>")[0]
    assert chart.count("<circle") == 3 and chart.count("class='cross'") == 2
    assert "class='point best'" in chart and "class='point default'" in chart
    assert "#2 {tile=16 unroll=1}: crash in run: worker killed by SIGSEGV" in chart


def test_the_terminal_table_and_the_page_say_the_same(tmp_path):
    """kbd tune's summary table comes from the same summaries as the section."""
    store = _store(tmp_path / "r.db")
    tuning = TuningStore(store, create=False)
    tasks = tune_summary.session(tuning, 1)
    lines = tune_summary.table([tune_summary.row(t) for t in tasks]).splitlines()
    expected = (
        "level1/1_mm 12 5 1 crash, 1 memory 1x 2x adopted: 1.90x the default, interval above 1.71x"
    )
    assert " ".join(lines[1].split()) == expected
    assert lines[2].split()[-3:] == ["every", "configuration", "failed"]
    page = tune_report.render(tune_report.TuningSession(tuning.sessions()[0], tasks))
    for task in tasks:
        assert f">{task.verdict.text}<" in page


def test_a_session_with_earlier_failures_and_no_confirmation_yet(tmp_path):
    """Session 2 did not run the configurations that failed in session 1, and counts them;
    killed before confirming, its best is not adopted."""
    store = _store(tmp_path / "r.db")
    tuning = TuningStore(store, create=False)
    (mm,) = tune_summary.session(tuning, 2)
    assert mm.measured == 4 and mm.failed() == "1 crash, 1 memory"
    assert mm.best.config == {"tile": 32, "unroll": 2}
    assert not mm.verdict.adopted and mm.verdict.text == tune_summary.NOT_CONFIRMED


def test_kbd_results_shows_the_latest_session_or_the_one_asked_for(tmp_path):
    _store(tmp_path / ".kbd" / "results.db").close()
    page = tmp_path / "page.html"
    latest = kbd("results", "--html", str(page), cwd=tmp_path)
    assert latest.returncode == 0, latest.stderr
    assert "tuning session 2 (interrupted)" in latest.stdout
    text = page.read_text()
    assert (
        "<h2 id='tuning-2'>Tuning session 2</h2>" in text
        and "kbd tune level1/1_ --budget 3" in text
    )
    assert _section_data(text)["session"] == 2
    chosen = kbd("results", "--html", str(page), "--tune", "1", cwd=tmp_path)
    assert chosen.returncode == 0, chosen.stderr
    assert _section_data(page.read_text())["session"] == 1


def test_a_sweep_page_has_no_tuning_section_without_sessions():
    page = report.render([], "kbd sweep 1")
    assert "Tuning session" not in page and "kbd-tuning" not in page
