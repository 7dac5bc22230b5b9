"""Statistics of one kernel's benchmark samples (pure Python: the supervisor has no numpy).

Per side: median, min, MAD, IQR and n of the per-call times. Speedup is eager median over
compiled median (KernelBench's direction: above 1 means compiled is faster), with a 95% interval
from a paired bootstrap: sample i of both sides was taken back to back, so pairs are resampled
together and drift that hit both sides cancels. The bootstrap's seed is fixed, so the same samples
always give the same interval. A side whose robust relative spread (1.4826 MAD / median, an
estimate of the coefficient of variation that ignores outliers) is above `UNSTABLE_SPREAD` makes
the measurement `unstable`: it is shown flagged, not hidden.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import msgspec

from kbd.protocol import BenchLoop, BenchSamples

UNSTABLE_SPREAD = 0.10
CONFIDENCE = 0.95
RESAMPLES = 1000
SEED = 0
MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation


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
    speedup: float  # eager median / compiled median
    speedup_low: float  # 95% paired-bootstrap interval of the speedup
    speedup_high: float
    unstable: bool
    overhead_ns: float  # per call, the calling path (measured on an empty function)
    threads: int
    budget_hit: bool
    samples: BenchSamples
    loop: BenchLoop = "jit"  # "jit" (import mode) or "python" (compile mode): see BenchSamples


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
    return Benchmark(
        compiled=compiled,
        eager=eager,
        speedup=eager.median_ns / compiled.median_ns,
        speedup_low=low,
        speedup_high=high,
        unstable=max(compiled.spread, eager.spread) > UNSTABLE_SPREAD,
        overhead_ns=samples.overhead_ns,
        threads=samples.threads,
        budget_hit=samples.budget_hit,
        samples=samples,
        loop=samples.loop,
    )


def format_ns(ns: float) -> str:
    """A duration in the unit that reads best: 85.3ns, 12.4us, 3.21ms, 1.50s."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g}{unit}"
    return f"{ns:.3g}ns"
