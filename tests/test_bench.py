"""Benchmarking: statistics on synthetic samples, fast_p, storage, compare, the HTML page, and
`--benchmark` end to end on fixture kernels (no timing is asserted)."""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import anyio
import msgspec
import pytest

from kbd.bench import compare, report, summary
from kbd.bench import processes as bench_processes
from kbd.results import stats
from kbd.results.record import Record
from kbd.results.store import Store
from kbd.shared.protocol import BenchOptions, BenchSamples, Job, Limits
from kbd.views import reports
from tests.conftest import fixture_args, json_records, kbd


def _samples(compiled: float, eager: float, n: int = 60, noise: float = 0.02, seed: int = 1):
    """Paired samples around the given per-call times with a shared drift and own noise."""
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        drift = 1 + 0.05 * math.sin(i / 5)  # hits both sides of a pair alike
        pairs.append(
            (
                compiled * drift * (1 + rng.gauss(0, noise)),
                eager * drift * (1 + rng.gauss(0, noise)),
            )
        )
    return BenchSamples(
        compiled_ns=[c for c, _ in pairs],
        eager_ns=[e for _, e in pairs],
        compiled_batch=100,
        eager_batch=10,
        overhead_ns=1.5,
        threads=1,
        budget_hit=False,
    )


def _record(
    kernel: str, outcome: str = "pass", speedup: float | None = None, mode: str = "import", **kw
) -> Record:
    bench = None
    if speedup is not None:
        bench = stats.summarize(_samples(1000.0, 1000.0 * speedup, **kw), gflop=2e-3)
    return Record(kernel=kernel, mode=mode, outcome=outcome, phase="bench", bench=bench)


# --- statistics ---------------------------------------------------------------------------


def test_order_statistics_match_their_definitions():
    values = [5.0, 1.0, 4.0, 2.0, 3.0, 100.0]
    assert stats.median(values) == 3.5
    assert stats.quantile(values, 0.0) == 1.0 and stats.quantile(values, 1.0) == 100.0
    assert stats.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.25) == 2.0
    assert stats.mad([1.0, 2.0, 3.0, 4.0, 100.0]) == 1.0  # the outlier does not move it
    side = stats.side([10.0, 12.0, 11.0, 13.0, 9.0], batch=7, gflop=1e-6)
    assert (side.median_ns, side.min_ns, side.mad_ns, side.iqr_ns) == (11.0, 9.0, 1.0, 2.0)
    assert (side.n, side.batch) == (5, 7)
    assert side.gflops == pytest.approx(1e-6 / 11e-9)


def test_speedup_interval_holds_the_true_ratio_and_is_reproducible():
    samples = _samples(compiled=200.0, eager=500.0)
    figures = stats.summarize(samples, gflop=None)
    assert figures.speedup == pytest.approx(2.5, rel=0.02)
    assert figures.speedup_low < 2.5 < figures.speedup_high
    assert figures.speedup_high / figures.speedup_low < 1.05  # 2% noise, 60 pairs
    assert stats.summarize(samples, gflop=None) == figures  # fixed seed: same interval
    assert not figures.unstable
    assert figures.compiled.gflops is None


def test_pairing_cancels_drift_that_hits_both_sides():
    """A large common drift widens each side's spread but not the paired speedup interval."""
    rng = random.Random(3)
    drift = [1 + 0.5 * rng.random() for _ in range(80)]
    samples = BenchSamples(
        compiled_ns=[100.0 * d for d in drift],
        eager_ns=[300.0 * d for d in drift],
        compiled_batch=1,
        eager_batch=1,
        overhead_ns=1.0,
        threads=1,
        budget_hit=False,
    )
    figures = stats.summarize(samples, gflop=None)
    assert figures.speedup_low == pytest.approx(3.0) and figures.speedup_high == pytest.approx(3.0)
    assert figures.unstable  # the sides themselves spread by far more than 10%


def test_noisy_samples_are_flagged_unstable():
    assert stats.summarize(_samples(100.0, 100.0, noise=0.3), gflop=None).unstable
    assert not stats.summarize(_samples(100.0, 100.0, noise=0.01), gflop=None).unstable


def test_a_single_sample_gives_a_point_interval():
    samples = BenchSamples([50.0], [100.0], 1, 1, 1.0, 1, True)
    figures = stats.summarize(samples, gflop=1e-3)
    assert (figures.speedup, figures.speedup_low, figures.speedup_high) == (2.0, 2.0, 2.0)
    assert figures.budget_hit


def test_processes_that_differ_widen_the_interval_to_their_spread():
    """Three processes whose own intervals are tight but whose speedups differ (1.8, 2.0, 2.2):
    the speedup is their geometric mean and its t interval (2 degrees of freedom) covers them,
    far wider than any one process's paired bootstrap."""
    runs = [
        _samples(100.0, 100.0 * s, n=30, noise=0.01, seed=i) for i, s in enumerate((1.8, 2, 2.2))
    ]
    figures = stats.combine(runs, gflop=None)
    logs = [math.log(s) for s in (1.8, 2.0, 2.2)]
    assert figures.speedup == pytest.approx(math.exp(sum(logs) / 3), rel=0.01)
    assert figures.speedup_low < 1.8 and figures.speedup_high > 2.2
    alone = stats.summarize(runs[1], gflop=None)
    assert alone.speedup_high / alone.speedup_low < 1.05
    assert figures.processes == [30, 30, 30] and figures.compiled.n == 90
    assert figures.samples.compiled_ns == [x for run in runs for x in run.compiled_ns]


def test_processes_that_agree_keep_the_interval_of_the_pooled_samples():
    runs = [_samples(100.0, 250.0, n=40, seed=i) for i in range(3)]
    figures = stats.combine(runs, gflop=2e-3)
    pooled = stats.summarize(figures.samples, gflop=2e-3)
    assert figures.speedup_low <= pooled.speedup_low and figures.speedup_high >= pooled.speedup_high
    assert figures.speedup == pytest.approx(2.5, rel=0.02)
    assert stats.combine(runs[:1], gflop=2e-3) == stats.summarize(runs[0], gflop=2e-3)


def test_each_process_is_asked_for_its_share_of_the_time_samples_and_budget():
    options = BenchOptions(min_time_s=1.0, min_samples=10, budget_s=20.0, processes=3)
    share = dict(min_time_s=pytest.approx(1 / 3), min_samples=4, budget_s=pytest.approx(20 / 3))
    assert options.per_process(0) == BenchOptions(**share, processes=1, check_first=True)
    # further processes are not run and checked before timing, only after
    assert options.per_process(2) == BenchOptions(**share, processes=1, check_first=False)


def test_a_further_process_that_fails_ends_the_kernel_with_its_record():
    """The first process passes and is timed; the second does not pass: that is the kernel's
    record, saying which process it was. All three pass: one record with the work of all."""
    job = Job("k", "k", "", None, None, None, "f32", [], 0, 0.01, 1.0, 3, Limits(),
              bench=BenchOptions(processes=3))  # fmt: skip
    timed = _record("k", speedup=2.0)
    failed = Record(kernel="k", outcome="crash", phase="bench", message="SIGSEGV")
    outcomes = {0: timed, 1: failed}

    async def run_once(each: Job, index: int) -> Record:
        assert each.bench == job.bench.per_process(index)
        return msgspec.structs.replace(outcomes.get(index, timed), wall_s=1.0, times={"run": 1.0})

    record = anyio.run(bench_processes.run, job, None, run_once)
    assert record.outcome == "crash" and record.message == "benchmark process 2 of 3: SIGSEGV"
    outcomes[1] = timed
    record = anyio.run(bench_processes.run, job, None, run_once)
    assert record.outcome == "pass" and record.bench.processes == [60, 60, 60]
    assert record.wall_s == 3.0 and record.times == {"run": 3.0}


def _with_inductor(samples: BenchSamples, inductor: float, seed: int = 7) -> BenchSamples:
    """`samples` with an Inductor side around `inductor` ns per call, noisy like the others."""
    rng = random.Random(seed)
    values = [inductor * (1 + rng.gauss(0, 0.02)) for _ in samples.compiled_ns]
    return msgspec.structs.replace(
        samples, inductor_ns=values, inductor_batch=20, inductor_compile_s=4.0
    )


def _timed(
    kernel: str, eager: float, inductor: float | None = None, error: str = "", seed: int = 1
) -> Record:
    """A passing record, compiled at 100ns per call, eager and Inductor as given (or Inductor
    failed with `error`)."""
    samples = _samples(100.0, eager, seed=seed)
    if inductor is not None:
        samples = _with_inductor(samples, inductor, seed=seed + 7)
    samples = msgspec.structs.replace(samples, inductor_error=error or None)
    bench = stats.summarize(samples, gflop=2e-3)
    return Record(kernel=kernel, outcome="pass", phase="bench", bench=bench)


def test_further_processes_do_not_try_inductor_again_once_it_failed():
    """Inductor failed (or ran out of time) in the first process: the others are timed against
    eager alone, and the kernel's record keeps the first's reason."""
    job = Job("k", "k", "", None, None, None, "f32", [], 0, 0.01, 1.0, 3, Limits(),
              bench=BenchOptions(processes=3, inductor=True))  # fmt: skip
    asked: list[bool] = []

    async def run_once(each: Job, index: int) -> Record:
        asked.append(each.bench.inductor)
        return _timed("k", 200.0, error="Inductor did not compile within 1 s" if index == 0 else "")

    record = anyio.run(bench_processes.run, job, None, run_once)
    assert asked == [True, False, False]
    assert record.outcome == "pass" and record.bench.inductor is None
    assert record.bench.inductor_error == "Inductor did not compile within 1 s"


def test_inductor_is_a_second_baseline_with_its_own_speedup_and_interval():
    samples = _with_inductor(_samples(100.0, 300.0, n=40), inductor=150.0)
    figures = stats.summarize(samples, gflop=2e-3)
    assert figures.speedup == pytest.approx(3.0, rel=0.03)
    assert figures.speedup_inductor == pytest.approx(1.5, rel=0.03)
    assert figures.speedup_inductor_low < figures.speedup_inductor < figures.speedup_inductor_high
    assert figures.inductor_over_eager == pytest.approx(2.0, rel=0.03)
    assert figures.inductor.batch == 20 and figures.inductor_compile_s == 4.0
    assert stats.summarize(_samples(100.0, 300.0), gflop=None).speedup_inductor is None


def test_inductor_over_processes_is_the_geometric_mean_of_theirs():
    runs = [
        _with_inductor(_samples(100.0, 300.0, n=30, seed=i), inductor=100.0 * s, seed=i)
        for i, s in enumerate((1.2, 1.5, 1.8))
    ]
    figures = stats.combine(runs, gflop=None)
    assert figures.speedup_inductor == pytest.approx((1.2 * 1.5 * 1.8) ** (1 / 3), rel=0.02)
    assert figures.speedup_inductor_low < 1.2 and figures.speedup_inductor_high > 1.8
    assert figures.speedup == pytest.approx(3.0, rel=0.03)  # eager's figure is unchanged
    # a process where Inductor failed: no Inductor figure for the kernel, and the reason kept
    failed = msgspec.structs.replace(runs[1], inductor_ns=[], inductor_error="CppCompileError: x")
    figures = stats.combine([runs[0], failed, runs[2]], gflop=None)
    assert figures.speedup_inductor is None and figures.inductor_error == "CppCompileError: x"
    assert figures.speedup == pytest.approx(3.0, rel=0.03)


def test_fast_p_and_geomeans_over_inductor_count_the_kernels_timed_against_it():
    def timed(kernel: str, eager: float, inductor: float | None) -> Record:
        samples = _samples(100.0, eager)
        if inductor is not None:
            samples = _with_inductor(samples, inductor)
        bench = stats.summarize(samples, gflop=None)
        return Record(kernel=kernel, outcome="pass", phase="bench", bench=bench)

    records = [
        timed("level1/a", 200.0, 50.0),  # 2x eager, 0.5x Inductor (Inductor 4x eager)
        timed("level1/b", 300.0, 300.0),  # 3x both
        timed("level1/c", 100.0, None),  # no Inductor figure: not in its counts
        Record(kernel="level1/d", outcome="mismatch", phase="check"),
    ]
    [level] = summary.by_level(records)
    assert (level.kernels, level.timed, level.inductor_timed) == (4, 3, 2)
    assert level.fast_p_inductor["1"] == 0.25 and level.fast_p_inductor["0"] == 0.5
    assert level.geomean_over_inductor == pytest.approx(math.sqrt(0.5 * 3), rel=0.03)
    assert level.geomean_inductor_over_eager == pytest.approx(math.sqrt(4 * 1), rel=0.03)
    table = summary.table(records)
    assert "over Inductor" in table and "Inductor/eager" in table
    assert "over Inductor 0.5" in reports.line(records[0])
    assert ", Inductor 50" in summary.describe(records[0])
    failed = msgspec.structs.replace(
        records[2].bench, inductor_error="InvalidCxxCompiler: no C++ compiler"
    )
    line = reports.line(msgspec.structs.replace(records[2], bench=failed))
    assert "Inductor failed: InvalidCxxCompiler" in line and "speedup 1" in line
    text = reports.summary([*records[:2], msgspec.structs.replace(records[2], bench=failed)])
    assert "Inductor not timed for 1 kernel (level1/c): InvalidCxxCompiler" in text


def test_durations_read_in_their_unit():
    assert [stats.format_ns(x) for x in (85.3, 12_400, 3.21e6, 1.5e9)] == [
        "85.3ns",
        "12.4us",
        "3.21ms",
        "1.5s",
    ]


# --- fast_p ---------------------------------------------------------------------------------


def test_fast_p_counts_correct_kernels_over_all_selected_ones():
    records = [
        _record("level1/a", speedup=0.4),
        _record("level1/b", speedup=1.2),
        _record("level1/c", speedup=3.0),
        _record("level1/d", outcome="mismatch"),
        _record("level1/e", outcome="pass"),  # passed, not timed: denominator only
        _record("level2/f", speedup=0.9),
    ]
    level1, level2, total = summary.by_level(records)
    assert (level1.kernels, level1.timed) == (5, 3)
    assert level1.fast_p == {
        "0": 0.6,
        "0.5": 0.4,
        "0.8": 0.4,
        "1": 0.4,
        "1.5": 0.2,
        "2": 0.2,
    }
    assert level1.slowest == "level1/a" and level1.fastest == "level1/c"
    assert level1.geomean_speedup == pytest.approx((0.4 * 1.2 * 3.0) ** (1 / 3), rel=0.02)
    assert level2.fast_p["0.8"] == 1.0 and level2.fast_p["1"] == 0.0
    assert total.level == "all" and total.kernels == 6 and total.fast_p["1"] == pytest.approx(2 / 6)
    table = reports.summary(records)
    assert "fast_1.5" in table and "level1/c" in table


def test_each_mode_has_its_own_fast_p():
    records = [
        _record("level1/a", speedup=2.0),
        _record("level1/b", outcome="error"),
        _record("level1/a", speedup=0.5, mode="compile"),
        _record("level1/b", speedup=0.7, mode="compile"),
    ]
    imported, compiled = summary.by_level(records)
    assert (imported.mode, imported.kernels, imported.timed) == ("import", 2, 1)
    assert (compiled.mode, compiled.kernels, compiled.timed) == ("compile", 2, 2)
    assert imported.fast_p["1"] == 0.5 and compiled.fast_p["1"] == 0.0
    table = summary.table(records)
    assert "mode" in table.splitlines()[0]
    assert "level1/b [compile]" in table


def test_compile_mode_figures_say_what_was_timed():
    samples = msgspec.structs.replace(_samples(5000.0, 1000.0), loop="python", overhead_ns=80.0)
    record = Record(
        kernel="level1/a",
        mode="compile",
        outcome="pass",
        phase="bench",
        bench=stats.summarize(samples, gflop=None),
    )
    assert record.bench.loop == "python"
    text = summary.describe(record)
    assert text.startswith("compiled forward ") and "call overhead 80ns" in text
    assert "compiled forward" not in summary.describe(_record("level1/a", speedup=2.0))


# --- storage and JUnit ----------------------------------------------------------------------


def test_benchmark_figures_survive_the_store(tmp_path):
    store = Store(tmp_path / "r.db")
    sweep = store.create_sweep("kbd sweep", "{}", ["level1/a", "level1/b"], "h")
    stored = _record("level1/a", speedup=2.0)
    store.add_attempt(sweep, "h", stored)
    store.add_attempt(
        sweep,
        "h",
        Record(kernel="level1/b", outcome="mismatch", phase="check", not_benchmarked="x"),
    )
    back = {r.kernel: r for r in store.records(sweep)}
    assert back["level1/a"].bench == stored.bench
    assert back["level1/a"].bench.samples.compiled_ns == stored.bench.samples.compiled_ns
    assert back["level1/b"].bench is None and back["level1/b"].not_benchmarked == "x"


def test_junit_carries_benchmark_properties(tmp_path):
    path = tmp_path / "j.xml"
    reports.write_junit([_record("level1/a", speedup=2.0), _record("level1/b", "error")], path)
    cases = {c.get("name"): c for c in ET.parse(path).getroot().iter("testcase")}
    properties = {p.get("name"): p.get("value") for p in cases["a"].iter("property")}
    assert float(properties["speedup"]) == pytest.approx(2.0, rel=0.05)
    assert {"compiled_median_ns", "eager_gflops", "samples", "overhead_ns"} <= set(properties)
    assert cases["b"].find("properties") is None


def test_junit_carries_the_figures_over_inductor(tmp_path):
    path = tmp_path / "j.xml"
    records = [
        _timed("level1/a", 300.0, 150.0),
        _timed("level1/b", 200.0, error="InvalidCxxCompiler: no C++ compiler"),
        _record("level1/c", speedup=2.0),
    ]
    reports.write_junit(records, path)
    cases = {c.get("name"): c for c in ET.parse(path).getroot().iter("testcase")}
    a, b, c = (
        {p.get("name"): p.get("value") for p in cases[name].iter("property")} for name in "abc"
    )
    bench = records[0].bench
    assert float(a["speedup_inductor"]) == pytest.approx(1.5, rel=0.03)
    assert a["speedup_inductor"] == f"{bench.speedup_inductor:.6g}"
    assert a["speedup_inductor_low"] == f"{bench.speedup_inductor_low:.6g}"
    assert a["speedup_inductor_high"] == f"{bench.speedup_inductor_high:.6g}"
    assert float(a["inductor_median_ns"]) == pytest.approx(150.0, rel=0.03)
    assert float(a["inductor_gflops"]) == pytest.approx(2e-3 / 150e-9, rel=0.03)
    assert a["inductor_compile_s"] == "4" and "inductor_error" not in a
    assert float(a["speedup"]) == pytest.approx(3.0, rel=0.03)
    assert b["inductor_error"] == "InvalidCxxCompiler: no C++ compiler"
    assert not [key for key in b if key.startswith(("speedup_inductor", "inductor_m"))]
    assert not [key for key in c if "inductor" in key]  # without the baseline: as before


def test_side_by_side_modes_show_the_speedup_over_inductor():
    imported = _timed("level1/a", 300.0, 150.0)
    compiled = msgspec.structs.replace(_record("level1/a", speedup=0.5), mode="compile")
    rows = reports.side_by_side([imported, compiled], ["import", "compile"])
    b = imported.bench
    cell = f"pass {b.speedup:.3g}x [{b.speedup_low:.3g}, {b.speedup_high:.3g}], over Inductor "
    assert cell + f"{b.speedup_inductor:.3g}x" in rows[1]
    assert rows[1].count("Inductor") == 1  # the compile-mode cell has no Inductor figure


# --- compare --------------------------------------------------------------------------------


def test_compare_finds_real_changes_and_ignores_noise():
    before = [
        _record("level1/same", speedup=2.0, seed=1),
        _record("level1/faster", speedup=1.0, seed=2),
        _record("level1/slower", speedup=4.0, seed=3),
        _record("level1/broke", speedup=1.0),
        _record("level1/gone", speedup=1.0),
    ]
    after = [
        _record("level1/same", speedup=2.0, seed=9),
        _record("level1/faster", speedup=1.5, seed=4),
        _record("level1/slower", speedup=3.0, seed=5),
        _record("level1/broke", outcome="crash"),
        _record("level1/new", speedup=1.0),
    ]
    rows = {r.kernel: r for r in compare.compare(before, after, threshold=0.05)}
    assert rows["level1/same"].verdict == "same"
    assert rows["level1/same"].ratio_low < 1 < rows["level1/same"].ratio_high
    assert rows["level1/faster"].verdict == "faster"
    assert rows["level1/faster"].ratio == pytest.approx(1.5, rel=0.03)
    assert rows["level1/slower"].verdict == "slower" and rows["level1/slower"].regression
    assert rows["level1/broke"].verdict == "outcome" and rows["level1/broke"].regression
    assert rows["level1/gone"].verdict == "missing" and rows["level1/new"].verdict == "missing"
    assert not rows["level1/faster"].regression
    text = compare.report(list(rows.values()), "sweep 1", "sweep 2", 0.05)
    assert "level1/slower" in text and "level1/same" not in text.split("\n\n")[0]


def test_compare_pairs_records_by_mode():
    both = [_record("level1/k", speedup=2.0), _record("level1/k", speedup=0.5, mode="compile")]
    rows = {r.kernel: r for r in compare.compare(both, both, threshold=0.05)}
    assert set(rows) == {"level1/k", "level1/k [compile]"}
    assert rows["level1/k [compile]"].speedup_a == pytest.approx(0.5, rel=0.05)
    # one mode per sweep: an import-mode sweep compares with a compile-mode one, kernel by kernel
    (row,) = compare.compare(both[:1], both[1:], threshold=0.05)
    assert (row.kernel, row.verdict) == ("level1/k", "slower")


def test_a_small_change_within_the_threshold_is_not_significant():
    before = [_record("level1/k", speedup=1.0, noise=0.001, seed=1)]
    after = [_record("level1/k", speedup=1.03, noise=0.001, seed=2)]
    (row,) = compare.compare(before, after, threshold=0.05)
    assert row.ratio_low > 1  # outside the measured noise...
    assert row.verdict == "same"  # ...but smaller than the threshold
    (row,) = compare.compare(before, after, threshold=0.01)
    assert row.verdict == "faster"


def test_compare_gives_the_ratio_over_inductor_without_judging_it():
    before = [
        _timed("level1/a", 200.0, 100.0, seed=1),  # over Inductor 1.0
        _timed("level1/b", 300.0, 150.0, seed=2),  # 1.5
        _timed("level1/c", 400.0, 200.0, seed=3),  # 4x eager, 2x Inductor
        _timed("level1/d", 200.0, error="CppCompileError: x", seed=4),
    ]
    after = [
        _timed("level1/a", 200.0, 150.0, seed=5),  # over Inductor 1.5: eager's unchanged
        _timed("level1/b", 300.0, 300.0, seed=6),  # 3.0
        _timed("level1/c", 200.0, 100.0, seed=7),  # 2x eager (slower), 1x Inductor
        _timed("level1/d", 200.0, 100.0, seed=8),  # Inductor ran in B only: no ratio
    ]
    rows = {r.kernel: r for r in compare.compare(before, after, threshold=0.05)}
    a, b, c, d = (rows[f"level1/{k}"] for k in "abcd")
    assert a.ratio_inductor == pytest.approx(1.5, rel=0.03)
    assert b.ratio_inductor == pytest.approx(2.0, rel=0.03)
    assert c.ratio_inductor == pytest.approx(0.5, rel=0.03)
    assert d.ratio_inductor is None and d.speedup_inductor_b is None and d.verdict == "same"
    # the interval: both sweeps' own intervals over Inductor, combined on the log scale
    first, second = before[1].bench, after[1].bench
    assert (b.speedup_inductor_a, b.speedup_inductor_b) == (
        first.speedup_inductor,
        second.speedup_inductor,
    )
    error = math.hypot(
        math.log(first.speedup_inductor_high / first.speedup_inductor_low),
        math.log(second.speedup_inductor_high / second.speedup_inductor_low),
    ) / (2 * compare.Z95)
    assert b.ratio_inductor_low == pytest.approx(b.ratio_inductor * math.exp(-compare.Z95 * error))
    assert b.ratio_inductor_high == pytest.approx(b.ratio_inductor * math.exp(compare.Z95 * error))
    assert b.ratio_inductor_low < 2.0 < b.ratio_inductor_high
    # verdicts and regressions stay on the speedup over eager
    assert (a.verdict, b.verdict, c.verdict) == ("same", "same", "slower")
    assert [r.kernel for r in rows.values() if r.regression] == ["level1/c"]
    text = compare.report(list(rows.values()), "sweep 1", "sweep 2", 0.05)
    [c_line] = [line for line in text.splitlines() if line.startswith("level1/c")]
    over = f"{c.ratio_inductor:.3f} [{c.ratio_inductor_low:.3f}, {c.ratio_inductor_high:.3f}]"
    assert c_line.endswith(f"slower  over Inductor {over}")
    geo = (a.ratio_inductor * b.ratio_inductor * c.ratio_inductor) ** (1 / 3)
    assert geo == pytest.approx((1.5 * 2.0 * 0.5) ** (1 / 3), rel=0.03)
    assert (
        f"over Inductor: geometric mean of B/A speedup ratios {geo:.3f}, on the 3 kernels"
    ) in text
    fields = json.loads(compare.json_row(b))
    assert fields["ratio_inductor"] == pytest.approx(b.ratio_inductor)
    assert fields["ratio_inductor_low"] == pytest.approx(b.ratio_inductor_low)
    assert fields["speedup_inductor_a"] == pytest.approx(1.5, rel=0.03)
    assert "ratio_inductor" not in json.loads(compare.json_row(d))


def test_compare_without_inductor_in_either_sweep_reads_as_before():
    with_inductor = [_timed("level1/a", 200.0, 100.0, seed=1)]
    without = [_record("level1/a", speedup=2.0, seed=2)]
    for a, b in ((with_inductor, without), (without, with_inductor), (without, without)):
        (row,) = compare.compare(a, b, threshold=0.05)
        assert row.ratio == pytest.approx(1.0, rel=0.05)
        assert row.ratio_inductor is None and row.ratio_inductor_low is None
        assert "Inductor" not in compare.report([row], "sweep 1", "sweep 2", 0.05)
        fields = json.loads(compare.json_row(row))
        assert not [key for key in fields if "inductor" in key]
        assert list(fields) == [f.name for f in msgspec.structs.fields(row)][: len(fields)]


# --- HTML -----------------------------------------------------------------------------------


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.data_script = ""
        self._in_data = False
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attributes = dict(attrs)
        self._in_data = attributes.get("id") == "kbd-data"
        for key in ("src", "href"):
            if key in attributes:
                self.external.append(attributes[key])

    def handle_data(self, data):
        if self._in_data:
            self.data_script += data

    def handle_endtag(self, tag):
        self._in_data = False


def test_html_report_parses_holds_the_data_and_needs_no_network():
    records = [
        _record("level1/a", speedup=0.5),
        _record("level1/b", speedup=8.0),
        _record("level2/c", speedup=1.5),
        _record("level2/d", outcome="crash"),
    ]
    page = report.render(records, "kbd sweep 3: kbd sweep --benchmark <x>")
    parser = _Page()
    parser.feed(page)
    assert parser.tags.count("svg") == 2 and "table" in parser.tags
    assert parser.external == []  # nothing to fetch
    data = json.loads(parser.data_script)
    kernels = {k["kernel"]: k for k in data["kernels"]}
    assert kernels["level1/b"]["speedup"] == pytest.approx(8.0, rel=0.05)
    assert kernels["level2/d"] == {"kernel": "level2/d", "mode": "import", "outcome": "crash"}
    assert [lv["level"] for lv in data["levels"]] == ["level1", "level2", "all"]
    assert data["levels"][0]["fast_p"]["1"] == 0.5
    assert "&lt;x&gt;" in page  # the title is escaped


def test_html_report_names_the_element_type_of_a_low_precision_record():
    bf16 = msgspec.structs.replace(_record("level1/a", speedup=2.0), dtype="bf16")
    page = report.render([bf16, _record("level1/b", speedup=1.0)], "t")
    parser = _Page()
    parser.feed(page)
    kernels = {k["kernel"]: k for k in json.loads(parser.data_script)["kernels"]}
    assert kernels["level1/a"]["dtype"] == "bf16" and "dtype" not in kernels["level1/b"]
    assert ">import bf16<" in page


class _Tables(HTMLParser):
    """Every table's rows as lists of (text, attributes) cells."""

    def __init__(self):
        super().__init__()
        self.tables: list[list[list[tuple[str, dict]]]] = []
        self._in_cell = False

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.tables[-1][-1].append(("", dict(attrs)))
            self._in_cell = True

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self._in_cell = False

    def handle_data(self, data):
        if self._in_cell:
            text, attrs = self.tables[-1][-1][-1]
            self.tables[-1][-1][-1] = (text + data, attrs)


def test_html_report_shows_both_baselines():
    records = [
        _timed("level1/a", 200.0, 50.0),  # 2x eager, 0.5x Inductor (Inductor 4x eager)
        _timed("level1/b", 300.0, 300.0),  # 3x both
        _timed("level1/c", 150.0, error="CppCompileError: <b>g++</b> & friends"),
        Record(kernel="level1/d", outcome="crash", phase="run"),
    ]
    page = report.render(records, "kbd sweep 4")
    parser = _Page()
    parser.feed(page)
    assert parser.external == []
    assert parser.tags.count("svg") == 3  # fast_p, and a histogram over each baseline
    tables = _Tables()
    tables.feed(page)
    levels_table, kernels_table = tables.tables
    # the levels table: a row over eager, then one over Inductor, under the same columns
    head = [text for text, _ in levels_table[0]]
    assert head[:4] == ["level", "kernels", "over", "timed"]
    assert head[-2:] == ["geomean speedup", "Inductor over eager"]
    eager_row = dict(zip(head, [text for text, _ in levels_table[1]], strict=True))
    inductor_row = dict(zip(head[2:], [text for text, _ in levels_table[2]], strict=True))
    assert (eager_row["over"], eager_row["timed"], eager_row["fast_1"]) == ("eager", "3", "0.750")
    assert (inductor_row["over"], inductor_row["timed"]) == ("Inductor", "2")
    assert (inductor_row["fast_0"], inductor_row["fast_1"]) == ("0.500", "0.250")
    geomean = float(inductor_row["geomean speedup"].rstrip("x"))
    assert geomean == pytest.approx(math.sqrt(0.5 * 3), rel=0.03)
    assert float(inductor_row["Inductor over eager"].rstrip("x")) == pytest.approx(2, rel=0.03)
    # the kernel table: the columns over Inductor after eager's
    head = [text for text, _ in kernels_table[0]]
    assert head[-6:] == [
        "stable",
        "over Inductor",
        "95% interval",
        "Inductor",
        "Inductor GFLOPS",
        "Inductor compile",
    ]
    rows = {row[0][0]: row for row in kernels_table[1:]}
    a = dict(zip(head, rows["level1/a"], strict=True))
    over = float(a["over Inductor"][1]["data-v"])
    assert over == pytest.approx(0.5, rel=0.03) and a["over Inductor"][0] == f"{over:.3g}x"
    low, high = (float(x) for x in a["95% interval"][0].split(" - "))
    assert low < 0.5 < high and float(a["Inductor"][1]["data-v"]) == pytest.approx(50, rel=0.03)
    assert float(a["Inductor GFLOPS"][0]) == pytest.approx(2e-3 / 50e-9, rel=0.03)
    assert a["Inductor compile"][0] == "4s" and a["Inductor compile"][1]["data-v"] == "4.0"
    # where Inductor failed, the reason across its columns, escaped; the row keeps every cell
    failed = rows["level1/c"]
    assert len(failed) == len(head) and failed[-5][1]["colspan"] == "5"
    assert failed[-5][0] == "Inductor failed: CppCompileError: <b>g++</b> & friends"
    markup = page.split("<script")[0]  # the data script holds it as JSON, "</" escaped
    assert "<b>g++" not in markup and "&lt;b&gt;g++&lt;/b&gt; &amp; friends" in markup
    assert [text for text, _ in rows["level1/d"][3:]] == [""] * (len(head) - 3)
    # the fast_p chart: a dashed curve over Inductor, in its own colour, named in the legend
    assert f"stroke='{report.INDUCTOR_COLORS[0]}' stroke-width='2' stroke-dasharray" in page
    assert "level1 over eager" in page and "level1 over Inductor" in page
    data = json.loads(parser.data_script)
    kernels = {k["kernel"]: k for k in data["kernels"]}
    assert kernels["level1/a"]["speedup_inductor"] == pytest.approx(0.5, rel=0.03)
    assert kernels["level1/a"]["inductor_compile_s"] == 4.0
    assert kernels["level1/c"]["inductor_error"].startswith("CppCompileError")
    assert "speedup_inductor" not in kernels["level1/c"]
    assert data["levels"][0]["inductor_timed"] == 2
    assert data["levels"][0]["fast_p_inductor"]["1"] == 0.25


def test_html_report_without_inductor_figures_is_as_before():
    records = [_record("level1/a", speedup=0.5), _record("level1/b", outcome="crash")]
    page = report.render(records, "kbd sweep 5")
    assert "Inductor" not in page and "inductor" not in page
    tables = _Tables()
    tables.feed(page)
    assert [text for text, _ in tables.tables[0][0]][-2:] == ["fast_2", "geomean speedup"]
    assert [text for text, _ in tables.tables[1][0]][-1] == "stable"
    assert ">level1</text>" in page  # the legend in the chart, named by the level alone


# --- end to end -----------------------------------------------------------------------------


def test_benchmark_sweep_end_to_end(tmp_path: Path):
    junit = tmp_path / "j.xml"
    quick = ["--bench-time", "0.02", "--bench-samples", "3", "--junit", str(junit)]
    selection = ["level1/2_", "level9/1_", "-j", "2", "--benchmark", *quick]
    result = kbd("sweep", *fixture_args(*selection), cwd=tmp_path)
    assert result.returncode == 1, result.stderr  # the mismatch fixture
    assert "fast_0.5" in result.stdout and "level1/2_relu_scale" in result.stdout
    assert "in 3 processes" in result.stdout
    records = json_records(kbd("results", "--json", cwd=tmp_path).stdout)
    timed = records["level1/2_relu_scale"]
    assert timed["outcome"] == "pass" and timed["phase"] == "bench"
    bench = timed["bench"]
    assert bench["compiled"]["n"] >= 3 and bench["speedup"] > 0
    # timed in three processes (the default), each logged, the record holding all their samples
    assert len(bench["processes"]) == 3 and sum(bench["processes"]) == bench["compiled"]["n"]
    log = tmp_path / timed["log"]
    further = [log.with_name(f"{log.stem}.process{i}.log") for i in (2, 3)]
    assert [path.is_file() for path in further] == [True] * 2
    # the first process runs and checks before timing; further ones only time and check after
    assert "phase run" in log.read_text() and "phase check" in log.read_text()
    assert ["phase run" in path.read_text() for path in further] == [False] * 2
    assert ["phase bench" in path.read_text() for path in further] == [True] * 2
    assert bench["compiled"]["gflops"] > 0 and bench["eager"]["gflops"] > 0
    assert bench["overhead_ns"] > 0
    assert records["level9/1_mismatch"]["bench"] is None
    assert records["level9/1_mismatch"]["not_benchmarked"].startswith("did not pass (mismatch")
    assert any(p.get("name") == "speedup" for p in ET.parse(junit).getroot().iter("property"))

    page = tmp_path / "r.html"
    assert kbd("results", "--html", str(page), cwd=tmp_path).returncode == 0
    assert "level1/2_relu_scale" in page.read_text()
    same = kbd("compare", "1", "1", "--fail-on-regression", cwd=tmp_path)
    assert same.returncode == 0 and "0 slower" in same.stdout


def test_inductor_baseline_end_to_end(tmp_path: Path):
    """Real Inductor (torch.compile, the C++ compiler) in contained workers, timed in two
    processes: the record carries the speedup over Inductor. The kernel's Inductor caches are
    kept in its folder under .kbd/inductor-cache: the first sweep compiles, the next loads every
    graph. On a machine with no C++ compiler, the reason, and eager's figures all the same."""
    quick = ["--bench-time", "0.02", "--bench-samples", "4", "--bench-processes", "2"]
    selection = ["level1/2_", "--benchmark", "--baseline", "inductor", *quick]
    records = []
    for _ in range(2):
        result = kbd("run", "--json", "--require-sandbox", *fixture_args(*selection), cwd=tmp_path)
        lines = result.stdout.splitlines()
        [record] = [json.loads(line) for line in lines if line.startswith("{")]
        assert record["outcome"] == "pass", record["message"]
        records.append(record["bench"])
    first, again = records
    assert first["speedup"] > 0 and first["eager"]["n"] >= 4
    if shutil.which("g++") or shutil.which("c++"):
        for bench in records:
            assert bench["inductor_error"] is None
            assert bench["inductor"]["n"] == bench["compiled"]["n"]
            assert bench["speedup_inductor_low"] <= bench["speedup_inductor"]
            assert bench["speedup_inductor"] <= bench["speedup_inductor_high"]
            assert bench["inductor_compile_s"] > 0
        assert not first["inductor_cached"] and again["inductor_cached"]
        [folder] = (tmp_path / ".kbd" / "inductor-cache").iterdir()
        assert folder.name.startswith("2_") and any(folder.rglob("*.so"))
    else:
        assert first["inductor"] is None and first["inductor_error"]


def test_without_a_cxx_compiler_inductor_says_why_and_eager_figures_stay(tmp_path: Path):
    """Also without the compile cache: Inductor's caches then go in a folder for the kernel's
    processes that is removed after it, none under .kbd/."""
    quick = ["--bench-time", "0.02", "--bench-samples", "3", "--bench-processes", "2"]
    selection = ["level1/2_", "--benchmark", "--baseline", "inductor", "--no-compile-cache", *quick]
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler")}
    result = kbd("run", "--json", *fixture_args(*selection), cwd=tmp_path, env=env)
    [record] = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert record["outcome"] == "pass" and result.returncode == 0
    bench = record["bench"]
    assert bench["speedup"] > 0 and bench["inductor"] is None and bench["speedup_inductor"] is None
    assert "C++ compiler" in bench["inductor_error"] and "\n" not in bench["inductor_error"]
    assert not (tmp_path / ".kbd" / "inductor-cache").exists()


def test_an_inductor_compile_past_its_limit_is_stopped_and_the_kernel_still_passes(tmp_path):
    """--inductor-timeout: real Inductor, stopped by its limit (no cache to load from): the
    kernel passes, timed against eager alone, and its record says why."""
    quick = ["--bench-time", "0.02", "--bench-samples", "3", "--bench-processes", "2"]
    selection = ["level1/2_", "--benchmark", "--baseline", "inductor", "--no-compile-cache"]
    selection += ["--inductor-timeout", "0.05", *quick]
    result = kbd("run", "--json", *fixture_args(*selection), cwd=tmp_path)
    [record] = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert record["outcome"] == "pass" and result.returncode == 0, record["message"]
    bench = record["bench"]
    assert bench["speedup"] > 0 and bench["inductor"] is None
    assert bench["inductor_error"] == "Inductor did not compile within 0.05 s (stopped)"


def test_bad_benchmark_options_are_usage_errors(tmp_path: Path):
    result = kbd(
        "run", *fixture_args("level1/2_", "--benchmark", "--bench-budget", "0"), cwd=tmp_path
    )
    assert result.returncode == 2 and "--bench-budget" in result.stderr
    result = kbd(
        "run",
        *fixture_args(
            "level1/2_", "--benchmark", "--baseline", "inductor", "--inductor-timeout", "0"
        ),
        cwd=tmp_path,
    )
    assert result.returncode == 2 and "--inductor-timeout must be positive" in result.stderr
    for without in ([], ["--benchmark"]):  # no Inductor baseline to limit
        args = fixture_args("level1/2_", *without, "--inductor-timeout", "60")
        result = kbd("run", *args, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert "--inductor-timeout needs --baseline inductor" in result.stderr


def test_schedules_never_see_the_timing_loops(tmp_path: Path):
    """The x86_64 matmul schedule applies a pass to `func.func`, which needs exactly one function:
    the timing loops are added after the pipeline, so it works with --benchmark too; in compile
    mode the schedule's OpenMP loops run in each subgraph. One run, both modes."""
    schedule = Path(__file__).resolve().parent.parent / "schedules/x86_64/matmul/f32.yaml"
    quick = ["--bench-time", "0.01", "--bench-samples", "2", "--bench-processes", "1"]
    quick += ["--pipeline", str(schedule)]
    selection = fixture_args("level1/1_", "--benchmark", "--mode", "both", *quick)
    result = kbd("run", "--json", *selection, cwd=tmp_path)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    records = {r["mode"]: r for r in lines}
    assert set(records) == {"import", "compile"}, result.stderr
    for mode, loop in (("import", "jit"), ("compile", "python")):
        record = records[mode]
        assert record["outcome"] == "pass", record["message"]
        assert record["bench"]["compiled"]["n"] >= 2
        assert record["bench"]["loop"] == loop


def test_speedups_are_also_summarized_per_schedule_family_of_the_kernels_pipeline():
    """The summary's family block groups the timed kernels by the family of the pipeline they
    ran (tuned or not, found at run time or as a fallback to the scalar pipeline) with their
    geomeans over eager, over Inductor and Inductor's own; failed kernels are in no row."""

    def timed(kernel: str, pipeline: str, eager: float, inductor: float) -> Record:
        bench = stats.summarize(_with_inductor(_samples(100.0, eager), inductor), gflop=None)
        return Record(kernel=kernel, outcome="pass", phase="bench", bench=bench, pipeline=pipeline)

    records = [
        timed("level3/a", "x86_64/avx512f/conv2d/f32.yaml", 200.0, 100.0),  # 2x, Inductor 1x
        timed("level3/b", "x86_64/conv2d/f32.yaml {block_oh=8} (tuned)", 50.0, 100.0),
        timed(
            "level3/c", "x86_64/avx512f/matmul/f32.yaml (matmul, found at run time)", 300.0, 100.0
        ),
        timed("level3/d", "scalar-lowering.yaml (no scan f32 schedule for x86_64)", 10.0, 10.0),
        Record(
            kernel="level3/e", outcome="mismatch", phase="check", pipeline="x86_64/norm/f32.yaml"
        ),
    ]
    assert summary.family_of(records[3].pipeline) == "scalar"
    assert summary.family_of("my/pipeline.yaml --x") == "my/pipeline.yaml"
    assert summary.family_of("kbd-fold-transpose-into-matmul") == "kbd-fold-transpose-into-matmul"
    rows = {row.family: row for row in summary.by_family(records)}
    assert list(rows) == ["conv2d", "matmul", "scalar"]  # most kernels first; no "norm" row
    conv = rows["conv2d"]
    assert conv.timed == 2 and conv.geomean_speedup == pytest.approx(1.0, rel=0.03)
    assert conv.geomean_inductor_over_eager == pytest.approx(math.sqrt(2 * 0.5), rel=0.03)
    assert rows["matmul"].geomean_over_inductor == pytest.approx(1.0, rel=0.03)
    assert rows["scalar"].geomean_speedup == pytest.approx(0.1, rel=0.03)
    table = summary.table(records)
    assert "by schedule family" in table and re.search(r"\nconv2d\s+2\s+1(\.0\d*)?x", table)
    assert "by schedule family" not in summary.table(records[:2])  # one family: no block
    page = report.render(records, "kbd sweep 1")
    assert "<table class='families'>" in page and "<td>conv2d</td><td>2</td>" in page
    assert "<table class='families'>" not in report.render(records[:2], "kbd sweep 1")
