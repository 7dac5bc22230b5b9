"""Statistics of one kernel's benchmark samples (pure Python: the supervisor has no numpy).

Per side: median, min, MAD, IQR and n of the per-call times, over the samples of every process
the kernel was timed in. Speedup is eager time over compiled time (KernelBench's direction: above
1 means compiled is faster).

Timed in one process, the speedup is eager median over compiled median, with a 95% interval from
a paired bootstrap: sample i of both sides was taken back to back, so pairs are resampled together
and drift that hit both sides cancels. The bootstrap's seed is fixed, so the same samples always
give the same interval. Such an interval only knows the noise *within* that process.

Timed in N processes (`--bench-processes`, kbd/bench/processes.py), each process gives its own
speedup (its eager median over its compiled median); the speedup is their geometric mean, and
its 95% interval is Student's t with N-1 degrees of freedom on their logarithms, widened where
needed to the pooled paired-bootstrap interval. Processes differ by more than samples within one
process do (where the buffers land in physical memory, how the code is laid out): measured on a
quiet machine, the log speedups of one matmul in four processes had a standard deviation of 0.22,
while each process's own interval implied 0.035. An interval that ignores that is too narrow to
compare two sweeps by.

A side whose robust relative spread (1.4826 MAD / median, an estimate of the coefficient of
variation that ignores outliers) is above `UNSTABLE_SPREAD` makes the measurement `unstable`: it
is shown flagged, not hidden.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import msgspec

from kbd.shared.protocol import BenchLoop, BenchSamples

UNSTABLE_SPREAD = 0.10
CONFIDENCE = 0.95
RESAMPLES = 1000
SEED = 0
MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation
# Student's t, 0.975 quantile, for 1..30 degrees of freedom; the normal quantile beyond.
T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
Z975 = 1.959964


class SideStats(msgspec.Struct, frozen=True):
    """One side's per-call times in nanoseconds."""

    median_ns: float
    min_ns: float
    mad_ns: float
    iqr_ns: float
    n: int  # samples
    batch: int  # calls per sample
    gflops: float | None  # the levels entry's work / median time

    @property
    def spread(self) -> float:
        """Robust relative spread: 1.4826 MAD / median."""
        return MAD_TO_SIGMA * self.mad_ns / self.median_ns if self.median_ns > 0 else math.inf


class Benchmark(msgspec.Struct, frozen=True):
    """A kernel's benchmark figures (what the store keeps and --json shows) and raw samples."""

    compiled: SideStats
    eager: SideStats
    speedup: float  # eager median / compiled median; over processes, their geometric mean
    speedup_low: float  # its 95% interval (see the module docstring)
    speedup_high: float
    unstable: bool
    overhead_ns: float  # per call, the calling path (measured on an empty function)
    threads: int
    budget_hit: bool
    samples: BenchSamples
    loop: BenchLoop = "jit"  # "jit" (import mode) or "python" (compile mode): see BenchSamples
    # Timed in several processes: how many of the pooled `samples` pairs each took, in order
    # (empty: one process).
    processes: list[int] = []
    # `--baseline inductor`: Inductor's side, and the speedup over it (Inductor median / compiled
    # median, over processes their geometric mean) with its 95% interval, computed as `speedup`'s
    # is; None when not asked, or when Inductor failed (`inductor_error` says why).
    inductor: SideStats | None = None
    speedup_inductor: float | None = None
    speedup_inductor_low: float | None = None
    speedup_inductor_high: float | None = None
    # Its first call, which compiled it: the slowest process's, since the kernel's processes
    # share Inductor's caches and the later ones mostly load (kbd/caches/inductor_cache.py).
    inductor_compile_s: float | None = None
    inductor_cached: bool = False  # every process loaded Inductor's graphs from its caches
    inductor_error: str | None = None

    @property
    def process_count(self) -> int:
        return max(1, len(self.processes))

    @property
    def inductor_over_eager(self) -> float | None:
        """Inductor's own speedup over eager (eager median / Inductor median)."""
        if self.inductor is None or self.inductor.median_ns <= 0:
            return None
        return self.eager.median_ns / self.inductor.median_ns


def median(values: Sequence[float]) -> float:
    return quantile(values, 0.5)


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of a non-empty sequence."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def mad(values: Sequence[float]) -> float:
    """Median absolute deviation from the median (unscaled)."""
    centre = median(values)
    return median([abs(v - centre) for v in values])


def side(values: Sequence[float], batch: int, gflop: float | None) -> SideStats:
    centre = median(values)
    return SideStats(
        median_ns=centre,
        min_ns=min(values),
        mad_ns=mad(values),
        iqr_ns=quantile(values, 0.75) - quantile(values, 0.25),
        n=len(values),
        batch=batch,
        gflops=gflop / (centre * 1e-9) if gflop and centre > 0 else None,
    )


def paired_speedup_interval(
    compiled: Sequence[float], eager: Sequence[float], *, seed: int = SEED
) -> tuple[float, float]:
    """95% percentile-bootstrap interval of median(eager) / median(compiled) over paired samples."""
    n = min(len(compiled), len(eager))
    if n < 2:
        ratio = median(eager) / median(compiled)
        return ratio, ratio
    rng = random.Random(seed)
    indices = range(n)
    ratios = []
    for _ in range(RESAMPLES):
        picks = rng.choices(indices, k=n)
        ratios.append(median([eager[i] for i in picks]) / median([compiled[i] for i in picks]))
    tail = (1 - CONFIDENCE) / 2
    return quantile(ratios, tail), quantile(ratios, 1 - tail)


def summarize(samples: BenchSamples, gflop: float | None) -> Benchmark:
    """Figures of one kernel from its raw samples and its levels entry's GFLOP per forward."""
    compiled = side(samples.compiled_ns, samples.compiled_batch, gflop)
    eager = side(samples.eager_ns, samples.eager_batch, gflop)
    low, high = paired_speedup_interval(samples.compiled_ns, samples.eager_ns)
    inductor = speedup_inductor = inductor_low = inductor_high = None
    if samples.inductor_ns:
        inductor = side(samples.inductor_ns, samples.inductor_batch, gflop)
        speedup_inductor = inductor.median_ns / compiled.median_ns
        inductor_low, inductor_high = paired_speedup_interval(
            samples.compiled_ns, samples.inductor_ns
        )
    spreads = [compiled.spread, eager.spread, *([inductor.spread] if inductor else [])]
    return Benchmark(
        compiled=compiled,
        eager=eager,
        speedup=eager.median_ns / compiled.median_ns,
        speedup_low=low,
        speedup_high=high,
        unstable=max(spreads) > UNSTABLE_SPREAD,
        overhead_ns=samples.overhead_ns,
        threads=samples.threads,
        budget_hit=samples.budget_hit,
        samples=samples,
        loop=samples.loop,
        inductor=inductor,
        speedup_inductor=speedup_inductor,
        speedup_inductor_low=inductor_low,
        speedup_inductor_high=inductor_high,
        inductor_compile_s=samples.inductor_compile_s,
        inductor_cached=samples.inductor_cached,
        inductor_error=samples.inductor_error,
    )


def combine(runs: Sequence[BenchSamples], gflop: float | None) -> Benchmark:
    """Figures of one kernel timed in several processes, one BenchSamples each."""
    if len(runs) == 1:
        return summarize(runs[0], gflop)
    first = runs[0]
    # Inductor's side counts only when every process timed it (else it failed somewhere).
    with_inductor = all(run.inductor_ns for run in runs)
    errors = [run.inductor_error for run in runs if run.inductor_error]
    compile_times = [run.inductor_compile_s for run in runs if run.inductor_compile_s is not None]
    pooled = BenchSamples(
        compiled_ns=[ns for run in runs for ns in run.compiled_ns],
        eager_ns=[ns for run in runs for ns in run.eager_ns],
        compiled_batch=first.compiled_batch,
        eager_batch=first.eager_batch,
        overhead_ns=median([run.overhead_ns for run in runs]),
        threads=first.threads,
        budget_hit=any(run.budget_hit for run in runs),
        loop=first.loop,
        inductor_ns=[ns for run in runs for ns in run.inductor_ns] if with_inductor else [],
        inductor_batch=first.inductor_batch if with_inductor else 0,
        inductor_compile_s=max(compile_times) if compile_times else None,
        inductor_cached=bool(compile_times) and all(run.inductor_cached for run in runs),
        inductor_error=errors[0] if errors else None,
    )
    figures = summarize(pooled, gflop)  # per-side figures and the pooled bootstrap intervals
    speedup, low, high = _across_processes(
        runs, [run.eager_ns for run in runs], figures.speedup_low, figures.speedup_high
    )
    figures = msgspec.structs.replace(
        figures,
        speedup=speedup,
        speedup_low=low,
        speedup_high=high,
        processes=[min(len(run.compiled_ns), len(run.eager_ns)) for run in runs],
    )
    if figures.inductor is None:
        return figures
    speedup, low, high = _across_processes(
        runs,
        [run.inductor_ns for run in runs],
        figures.speedup_inductor_low,
        figures.speedup_inductor_high,
    )
    return msgspec.structs.replace(
        figures, speedup_inductor=speedup, speedup_inductor_low=low, speedup_inductor_high=high
    )


def _across_processes(
    runs: Sequence[BenchSamples], baseline_ns: Sequence[Sequence[float]], low: float, high: float
) -> tuple[float, float, float]:
    """The speedup over a baseline of a kernel timed in several processes: the geometric mean
    of each process's (baseline median / compiled median), with Student's t interval on their
    logarithms, widened where needed to the pooled bootstrap interval [low, high]."""
    logs = [
        math.log(median(base) / median(run.compiled_ns))
        for run, base in zip(runs, baseline_ns, strict=True)
    ]
    centre = math.fsum(logs) / len(logs)
    half = t975(len(logs) - 1) * _stdev(logs, centre) / math.sqrt(len(logs))
    return math.exp(centre), min(math.exp(centre - half), low), max(math.exp(centre + half), high)


def t975(degrees: int) -> float:
    """Student's t 0.975 quantile (two-sided 95%)."""
    return T975[degrees - 1] if degrees <= len(T975) else Z975


def _stdev(values: Sequence[float], mean: float) -> float:
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def format_ns(ns: float) -> str:
    """A duration in the unit that reads best: 85.3ns, 12.4us, 3.21ms, 1.50s."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g}{unit}"
    return f"{ns:.3g}ns"
