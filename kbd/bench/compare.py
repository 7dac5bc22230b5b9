"""`kbd compare A B`: two stored sweeps side by side, kernel by kernel.

For a kernel benchmarked in both, the figure compared is the speedup over eager (eager median /
compiled median), not raw compiled time: eager was measured alternately in the same worker, so
drift of the machine between the two sweeps largely cancels. The ratio B/A gets a 95% interval
from the two sweeps' own bootstrap intervals (combined on the log scale as independent normal
errors). Each sweep's interval includes how much the processes a kernel was timed in differed
(`--bench-processes`, kbd/results/stats.py). A difference is significant when the combined interval
excludes 1 *and* the ratio is at least `threshold` away from 1: the host itself drifts between
sweeps taken minutes apart (frequency, other tenants), which no interval from inside one sweep
captures.

When both sweeps were timed against Inductor (`--baseline inductor`) for a kernel, the row also
gives the ratio of the speedups over Inductor (B/A), its interval combined the same way, and the
report the geometric mean of those ratios. They are shown, not judged: the verdict, significance
and `--fail-on-regression` stay defined on the speedup over eager alone. Eager is the yardstick
that only kbd's side moves against; Inductor's time changes with torch, its own caches and
the C++ compiler between sweeps, so a ratio over it mixes kbd's change with Inductor's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import msgspec

from kbd.plan.invocation import COMPARE_THRESHOLD
from kbd.results.record import Record
from kbd.results.store import Store
from kbd.shared.errors import InputError
from kbd.shared.outcomes import CORRECT

Z95 = 1.959964


class KernelComparison(msgspec.Struct, frozen=True):
    kernel: str  # with its mode when not import mode ("level1/2_x [compile]")
    outcome_a: str | None  # None: not in that sweep
    outcome_b: str | None
    speedup_a: float | None = None
    speedup_b: float | None = None
    ratio: float | None = None  # speedup_b / speedup_a: above 1 means B is faster
    ratio_low: float | None = None
    ratio_high: float | None = None
    # faster | slower | same (timed in both); outcome (changed, not both passing);
    # failing (the same failure in both); untimed (passed in both, not timed in both); missing
    verdict: str = ""
    # Both timed against Inductor: the speedups over it and their ratio B/A with its interval
    # (not part of the verdict; see the module docstring)
    speedup_inductor_a: float | None = None
    speedup_inductor_b: float | None = None
    ratio_inductor: float | None = None
    ratio_inductor_low: float | None = None
    ratio_inductor_high: float | None = None

    @property
    def regression(self) -> bool:
        """Slower significantly, or correct in A and not in B."""
        return self.verdict == "slower" or (
            self.outcome_a in CORRECT and self.outcome_b not in CORRECT
        )


def compare(
    a: Sequence[Record], b: Sequence[Record], threshold: float = COMPARE_THRESHOLD
) -> list[KernelComparison]:
    """One row per kernel in either sweep, in A's order then B's new kernels.

    Records pair up by kernel and mode (`--mode both` sweeps give two rows per kernel), or by
    kernel alone when each sweep ran in one mode, so that an import-mode sweep and a
    compile-mode sweep compare too."""
    single = len({r.mode for r in a}) <= 1 and len({r.mode for r in b}) <= 1
    by_a = {_name(r, single): r for r in a}
    by_b = {_name(r, single): r for r in b}
    names = list(by_a) + [k for k in by_b if k not in by_a]
    return [_compare_one(k, by_a.get(k), by_b.get(k), threshold) for k in names]


def _name(record: Record, single_mode: bool) -> str:
    return record.kernel if single_mode else record.label


def _compare_one(kernel: str, ra: Record | None, rb: Record | None, threshold: float):
    outcome_a = ra.outcome if ra else None
    outcome_b = rb.outcome if rb else None
    row = KernelComparison(kernel, outcome_a, outcome_b)
    if ra is None or rb is None:
        return msgspec.structs.replace(row, verdict="missing")
    if outcome_a not in CORRECT or outcome_b not in CORRECT:
        return msgspec.structs.replace(
            row, verdict="outcome" if outcome_a != outcome_b else "failing"
        )
    if ra.bench is None or rb.bench is None:
        return msgspec.structs.replace(row, verdict="untimed")
    sa, sb = ra.bench, rb.bench
    ratio, low, high = _ratio(
        (sa.speedup, sa.speedup_low, sa.speedup_high), (sb.speedup, sb.speedup_low, sb.speedup_high)
    )
    verdict = "same"
    if low > 1 and ratio >= 1 + threshold:
        verdict = "faster"
    elif high < 1 and ratio <= 1 / (1 + threshold):
        verdict = "slower"
    row = msgspec.structs.replace(
        row,
        speedup_a=sa.speedup,
        speedup_b=sb.speedup,
        ratio=ratio,
        ratio_low=low,
        ratio_high=high,
        verdict=verdict,
    )
    over_a = (sa.speedup_inductor, sa.speedup_inductor_low, sa.speedup_inductor_high)
    over_b = (sb.speedup_inductor, sb.speedup_inductor_low, sb.speedup_inductor_high)
    if None in over_a or None in over_b:
        return row
    ratio, low, high = _ratio(over_a, over_b)
    return msgspec.structs.replace(
        row,
        speedup_inductor_a=over_a[0],
        speedup_inductor_b=over_b[0],
        ratio_inductor=ratio,
        ratio_inductor_low=low,
        ratio_inductor_high=high,
    )


def _ratio(
    a: tuple[float, float, float], b: tuple[float, float, float]
) -> tuple[float, float, float]:
    """B/A of two speedups given as (speedup, low, high), with a 95% interval from their own
    intervals, combined on the log scale as independent normal errors."""
    ratio = b[0] / a[0]
    error = math.hypot(_log_error(a[1], a[2]), _log_error(b[1], b[2]))
    return ratio, ratio * math.exp(-Z95 * error), ratio * math.exp(Z95 * error)


def _log_error(low: float, high: float) -> float:
    """Standard error on the log scale implied by a 95% interval."""
    if low <= 0 or high <= 0:
        return math.inf
    return (math.log(high) - math.log(low)) / (2 * Z95)


def median_abs_log_ratio(rows: Sequence[KernelComparison]) -> float | None:
    """Median |log(B/A)| over kernels timed in both: the typical size of a change (or of noise)."""
    values = sorted(abs(math.log(r.ratio)) for r in rows if r.ratio)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def report(rows: Sequence[KernelComparison], label_a: str, label_b: str, threshold: float) -> str:
    """The table: every kernel whose verdict is not 'same', then the totals."""
    shown = [r for r in rows if r.verdict not in ("same", "failing")]
    lines = []
    if shown:
        width = max(len(r.kernel) for r in shown)
        lines.append(
            f"{'kernel':<{width + 2}}{'A':>10}{'B':>10}{'B/A':>8}  {'95% interval':<17}verdict"
        )
        for r in shown:
            if r.ratio is not None:
                interval = f"[{r.ratio_low:.3f}, {r.ratio_high:.3f}]"
                text = (
                    f"{r.kernel:<{width + 2}}{r.speedup_a:>9.3g}x{r.speedup_b:>9.3g}x"
                    f"{r.ratio:>8.3f}  {interval:<17}{r.verdict}"
                )
                if r.ratio_inductor is not None:
                    text += (
                        f"{'':<{8 - len(r.verdict)}}over Inductor {r.ratio_inductor:.3f} "
                        f"[{r.ratio_inductor_low:.3f}, {r.ratio_inductor_high:.3f}]"
                    )
                lines.append(text)
            else:
                lines.append(
                    f"{r.kernel:<{width + 2}}{r.outcome_a or '-':>10}{r.outcome_b or '-':>10}"
                    f"{'':>8}  {'':<17}{r.verdict}"
                )
        lines.append("")
    timed = [r for r in rows if r.ratio is not None]
    tally = {v: sum(r.verdict == v for r in rows) for v in ("faster", "slower", "same")}
    lines.append(
        f"A = {label_a}, B = {label_b}: {len(rows)} kernels, {len(timed)} timed in both; "
        f"{tally['faster']} faster, {tally['slower']} slower, {tally['same']} no significant "
        f"difference (threshold {threshold:.0%})"
    )
    changed = sum(r.verdict == "outcome" for r in rows)
    if changed:
        lines.append(f"{changed} kernels changed outcome")
    spread = median_abs_log_ratio(rows)
    if spread is not None:
        ratios = [r.ratio for r in timed]
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        lines.append(
            f"geometric mean of B/A speedup ratios {geo:.3f}; "
            f"median |log ratio| {spread:.3f} ({math.expm1(spread):.1%})"
        )
    against = [r.ratio_inductor for r in rows if r.ratio_inductor is not None]
    if against:
        geo = math.exp(sum(math.log(x) for x in against) / len(against))
        lines.append(
            f"over Inductor: geometric mean of B/A speedup ratios {geo:.3f}, on the "
            f"{len(against)} kernels timed against Inductor in both (verdicts are over eager)"
        )
    return "\n".join(lines)


INDUCTOR_FIELDS = (
    "speedup_inductor_a",
    "speedup_inductor_b",
    "ratio_inductor",
    "ratio_inductor_low",
    "ratio_inductor_high",
)


def json_row(row: KernelComparison) -> str:
    """One `--json` line: every field, but those over Inductor only when set, so that a row
    without them reads exactly as before they existed."""
    fields = msgspec.to_builtins(row)
    for name in INDUCTOR_FIELDS:
        if fields[name] is None:
            del fields[name]
    return msgspec.json.encode(fields).decode()


def main(args) -> int:
    """`kbd compare A B`: exit 0, or 1 with --fail-on-regression and a regression."""
    if not args.threshold >= 0:  # also NaN
        raise InputError(f"--threshold must not be negative, got {args.threshold:g}")
    store = Store.existing(Path(args.db))
    sweeps = [store.sweep(args.a), store.sweep(args.b)]
    records = [store.records(s.id) for s in sweeps]
    rows = compare(records[0], records[1], args.threshold)
    if args.json:
        for row in rows:
            print(json_row(row))
    else:
        labels = [f"sweep {s.id}{_modes(r)}" for s, r in zip(sweeps, records, strict=True)]
        print(report(rows, labels[0], labels[1], args.threshold))
    regressions = [r for r in rows if r.regression]
    if args.fail_on_regression and regressions:
        if not args.json:
            print(f"{len(regressions)} regressions (--fail-on-regression)")
        return 1
    return 0


def _modes(records: list[Record]) -> str:
    """' (compile mode)' or ' (import and compile mode)'; nothing for import mode alone."""
    modes = sorted({r.mode for r in records}, key=lambda m: m != "import")
    return "" if modes in ([], ["import"]) else f" ({' and '.join(modes)} mode)"
