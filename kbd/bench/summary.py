"""Benchmark summary of a set of records: fast_p per level, geometric-mean speedup, extremes.

fast_p is KernelBench's: the fraction of *all* selected kernels of a level that are correct and
have a speedup greater than p (src/kernelbench/score.py: `sum(speedup > p) / n`); a kernel that
failed, or passed without being benchmarked, counts in the denominator only. fast_0 is the
fraction that passed and was timed. The geometric mean is over the benchmarked kernels only.
With `--mode both`, each mode has its own figures (its records are its denominator).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import msgspec

from kbd.plan.spec import DTYPES
from kbd.results.record import Record
from kbd.results.stats import format_ns
from kbd.shared.outcomes import CORRECT

P_VALUES = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)


class LevelFigures(msgspec.Struct, frozen=True):
    level: str  # "level1", or "all"
    mode: str  # import or compile: each mode's figures are its own
    kernels: int  # selected kernels (the fast_p denominator)
    timed: int  # correct and benchmarked
    fast_p: dict[str, float]  # "0", "0.5", ... -> fraction
    geomean_speedup: float | None
    slowest: str | None  # kernel with the smallest speedup
    fastest: str | None
    # `--baseline inductor`: the same over Inductor, for the kernels timed against it; and on
    # those kernels, Inductor's own geomean over eager (what kbd's geomean is judged against)
    inductor_timed: int = 0
    fast_p_inductor: dict[str, float] = {}
    geomean_over_inductor: float | None = None
    geomean_inductor_over_eager: float | None = None


def benchmarked(records: Sequence[Record]) -> list[Record]:
    """Records that passed and carry benchmark figures."""
    return [r for r in records if r.outcome in CORRECT and r.bench is not None]


def level_of(kernel: str) -> str:
    return kernel.split("/", 1)[0]


def modes(records: Sequence[Record]) -> list[str]:
    """The modes present, import first."""
    return sorted({r.mode for r in records}, key=lambda m: (m != "import", m))


def figures(records: Sequence[Record], level: str, mode: str = "import") -> LevelFigures:
    timed = benchmarked(records)
    speedups = [r.bench.speedup for r in timed]
    ranked = sorted(timed, key=lambda r: r.bench.speedup)
    against = [r.bench for r in timed if r.bench.speedup_inductor is not None]
    n = len(records)
    return LevelFigures(
        level=level,
        mode=mode,
        kernels=n,
        timed=len(timed),
        fast_p=fast_p(speedups, n),
        geomean_speedup=geomean(speedups),
        slowest=ranked[0].kernel if ranked else None,
        fastest=ranked[-1].kernel if ranked else None,
        inductor_timed=len(against),
        fast_p_inductor=fast_p([b.speedup_inductor for b in against], n) if against else {},
        geomean_over_inductor=geomean([b.speedup_inductor for b in against]),
        geomean_inductor_over_eager=geomean([b.inductor_over_eager for b in against]),
    )


def fast_p(speedups: Sequence[float], kernels: int) -> dict[str, float]:
    """KernelBench's fast_p: the fraction of all `kernels` correct and faster than p times the
    baseline, for each p of P_VALUES."""
    return {
        f"{p:g}": (sum(s > p for s in speedups) / kernels if kernels else 0.0) for p in P_VALUES
    }


def by_level(records: Sequence[Record]) -> list[LevelFigures]:
    """Per mode: one LevelFigures per level present, then 'all' when there is more than one
    level. A mode's fast_p counts that mode's records only."""
    rows = []
    for mode in modes(records):
        mine = [r for r in records if r.mode == mode]
        levels = sorted({level_of(r.kernel) for r in mine})
        rows += [figures([r for r in mine if level_of(r.kernel) == lv], lv, mode) for lv in levels]
        if len(levels) > 1:
            rows.append(figures(mine, "all", mode))
    return rows


class FamilyFigures(msgspec.Struct, frozen=True):
    """One schedule family's geometric means over the kernels of it that were timed."""

    family: str  # the family of the kernel's pipeline, e.g. "conv2d"; "scalar" for the default
    timed: int
    geomean_speedup: float | None
    inductor_timed: int = 0
    geomean_over_inductor: float | None = None
    geomean_inductor_over_eager: float | None = None


# A family schedule's path ends <family>/<dtype>.yaml (kbd.plan.descriptor.find_pipeline),
# before any {vars}, "(tuned)" or reason.
_FAMILY_SCHEDULE = re.compile(rf"(?:^|/)([A-Za-z0-9_]+)/(?:{'|'.join(DTYPES)})\.yaml")


def family_of(pipeline: str) -> str:
    """The schedule family a record's `pipeline` names: "conv2d" for
    "x86_64/avx512f/conv2d/f32.yaml (tuned)", "scalar" for the default pipeline (with or without
    why it fell back to it), else the pipeline's first word (a `--pipeline` of the user's)."""
    if pipeline.startswith("scalar-lowering.yaml"):
        return "scalar"
    first = pipeline.split(" ", 1)[0]
    found = _FAMILY_SCHEDULE.search(first)
    return found.group(1) if found else (first or "none")


def by_family(records: Sequence[Record]) -> list[FamilyFigures]:
    """Per schedule family of the timed records (most kernels first): its geometric means over
    eager, over Inductor and Inductor's own over eager on the kernels timed against it."""
    families: dict[str, list[Record]] = {}
    for record in benchmarked(records):
        families.setdefault(family_of(record.pipeline), []).append(record)
    rows = []
    for family, mine in sorted(families.items(), key=lambda item: (-len(item[1]), item[0])):
        against = [r.bench for r in mine if r.bench.speedup_inductor is not None]
        rows.append(
            FamilyFigures(
                family=family,
                timed=len(mine),
                geomean_speedup=geomean([r.bench.speedup for r in mine]),
                inductor_timed=len(against),
                geomean_over_inductor=geomean([b.speedup_inductor for b in against]),
                geomean_inductor_over_eager=geomean([b.inductor_over_eager for b in against]),
            )
        )
    return rows


def family_table(records: Sequence[Record]) -> list[str]:
    """Lines of the per-family block (none when the timed kernels share one family)."""
    rows = by_family(records)
    if len(rows) < 2:
        return []
    inductor = any(row.inductor_timed for row in rows)
    width = max(len("family"), *(len(row.family) for row in rows)) + 2
    head = f"{'family':<{width}}{'timed':>7}{'over eager':>12}"
    if inductor:
        head += f"{'over Inductor':>15}{'Inductor/eager':>16}"
    lines = ["by schedule family (geomeans of the timed kernels; all modes together):", head]
    for row in rows:
        text = f"{row.family:<{width}}{row.timed:>7}{_speedup(row.geomean_speedup):>12}"
        if inductor:
            text += f"{_speedup(row.geomean_over_inductor):>15}"
            text += f"{_speedup(row.geomean_inductor_over_eager):>16}"
        lines.append(text)
    return lines


def geomean(values: Sequence[float]) -> float | None:
    positive = [v for v in values if v > 0]
    if not positive:
        return None
    return math.exp(sum(math.log(v) for v in positive) / len(positive))


def table(records: Sequence[Record]) -> str:
    """The fast_p table, one row per level, then the slowest and fastest kernels."""
    rows = by_level(records)
    several = len(modes(records)) > 1
    head = f"{'level':<8}" + (f"{'mode':<9}" if several else "") + f"{'kernels':>8}{'timed':>7}"
    head += "".join(f"{'fast_' + f'{p:g}':>10}" for p in P_VALUES) + f"{'geomean':>10}"
    lines = [head]
    for row in rows:
        text = f"{row.level:<8}" + (f"{row.mode:<9}" if several else "")
        text += f"{row.kernels:>8}{row.timed:>7}"
        text += "".join(f"{row.fast_p[f'{p:g}']:>10.3f}" for p in P_VALUES)
        text += f"{_speedup(row.geomean_speedup):>10}"
        lines.append(text)
    if any(row.inductor_timed for row in rows):
        lines += ["", "over Inductor (torch.compile), on the kernels timed against it:"]
        lines.append(head + f"{'Inductor/eager':>16}")
        for row in rows:
            text = f"{row.level:<8}" + (f"{row.mode:<9}" if several else "")
            text += f"{row.kernels:>8}{row.inductor_timed:>7}"
            text += "".join(f"{row.fast_p_inductor.get(f'{p:g}', 0.0):>10.3f}" for p in P_VALUES)
            text += f"{_speedup(row.geomean_over_inductor):>10}"
            text += f"{_speedup(row.geomean_inductor_over_eager):>16}"
            lines.append(text)
    families = family_table(records)
    if families:
        lines += ["", *families]
    timed = sorted(benchmarked(records), key=lambda r: r.bench.speedup)
    if timed:
        lines.append("")
        shown = timed if len(timed) <= 6 else [*timed[:3], *timed[-3:]]
        lines.append("slowest and fastest:" if len(timed) > 6 else "speedups:")
        for r in shown:
            lines.append(f"  {_speedup(r.bench.speedup):>9}  {r.label}  ({describe(r)})")
    unstable = sum(r.bench.unstable for r in timed)
    if unstable:
        lines.append(f"{unstable} of {len(timed)} measurements unstable (spread above 10%)")
    return "\n".join(lines)


def describe(record: Record) -> str:
    """'compiled 85.3ns, eager 45.7us, n=67 in 3 processes' plus GFLOPS and flags; in compile mode
    'compiled forward ...' and the Python loop's own cost per call, part of both sides."""
    b = record.bench
    compiled = "compiled forward" if b.loop == "python" else "compiled"
    text = f"{compiled} {format_ns(b.compiled.median_ns)}, eager {format_ns(b.eager.median_ns)}"
    if b.inductor is not None:
        text += f", Inductor {format_ns(b.inductor.median_ns)}"
    if b.compiled.gflops is not None and b.eager.gflops is not None:
        text += f", {b.compiled.gflops:.3g} vs {b.eager.gflops:.3g} GFLOPS"
        if b.inductor is not None and b.inductor.gflops is not None:
            text += f" (Inductor {b.inductor.gflops:.3g})"
    if b.inductor_compile_s is not None:
        done = "loaded from its cache" if b.inductor_cached else "compiled"
        text += f", Inductor {done} in {b.inductor_compile_s:.1f}s"
    if b.loop == "python":
        text += f", call overhead {format_ns(b.overhead_ns)}"
    text += f", n={b.compiled.n}"
    if b.process_count > 1:
        text += f" in {b.process_count} processes"
    if b.unstable:
        text += ", unstable"
    if b.budget_hit:
        text += ", budget hit"
    return text


def _speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}x"
