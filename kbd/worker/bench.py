"""Time a passing kernel: compiled (the JIT's own timing loop) against PyTorch eager.

Both sides run in this worker, on its pinned cores, on the same input buffers. A sample is a
batch of back-to-back calls sized to take about `SAMPLE_TARGET_S`, so that timer resolution and
per-sample costs vanish even for kernels of a few nanoseconds. Compiled samples are timed inside
the JIT code (`mlir.add_bench_wrappers`: clock_gettime around a loop of direct calls); eager
samples with `time.perf_counter_ns` around a Python loop of `model(*args)`, which is what eager
costs its users. Samples alternate, compiled then eager, so drift (frequency, other load) hits
both sides alike, and go on until each side has `min_time_s` of measurements and `min_samples`
samples, or until `budget_s` has passed (a slow kernel then reports fewer samples).

Statistics are the supervisor's job (kbd/bench/stats.py); this module only measures.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable

import torch

from kbd.protocol import BenchOptions, BenchSamples
from kbd.worker.mlir import BenchTimer

SAMPLE_TARGET_S = 0.01  # one sample's duration: ~100 samples per side in the default 1 s
OVERHEAD_BATCH = 10_000  # calls per sample when timing the empty function
OVERHEAD_SAMPLES = 5


def measure(
    compiled: BenchTimer,
    noop: BenchTimer,
    model: torch.nn.Module,
    args: list,
    options: BenchOptions,
) -> BenchSamples:
    """Warm up, calibrate the batch sizes, then take alternating samples of both sides."""
    started = time.perf_counter()

    def compiled_sample(batch: int) -> float:
        return float(compiled(1, batch)[0])

    def eager_sample(batch: int) -> float:
        with torch.no_grad():
            t0 = time.perf_counter_ns()
            for _ in range(batch):
                model(*args)
            return float(time.perf_counter_ns() - t0)

    overhead = sorted(noop(OVERHEAD_SAMPLES, OVERHEAD_BATCH) / OVERHEAD_BATCH)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection inside an eager sample is noise, not the kernel's cost
    try:
        compiled_batch = _calibrate(compiled_sample)
        eager_batch = _calibrate(eager_sample)
        compiled_ns: list[float] = []
        eager_ns: list[float] = []
        while True:
            compiled_ns.append(compiled_sample(compiled_batch) / compiled_batch)
            eager_ns.append(eager_sample(eager_batch) / eager_batch)
            enough = (
                len(compiled_ns) >= options.min_samples
                and sum(compiled_ns) * compiled_batch >= options.min_time_s * 1e9
                and sum(eager_ns) * eager_batch >= options.min_time_s * 1e9
            )
            over_budget = time.perf_counter() - started >= options.budget_s
            if enough or over_budget:
                break
    finally:
        if gc_was_enabled:
            gc.enable()
    return BenchSamples(
        compiled_ns=compiled_ns,
        eager_ns=eager_ns,
        compiled_batch=compiled_batch,
        eager_batch=eager_batch,
        overhead_ns=float(overhead[len(overhead) // 2]),
        threads=torch.get_num_threads(),
        budget_hit=not enough,
    )


def _calibrate(sample: Callable[[int], float]) -> int:
    """Calls per sample so that one sample takes about SAMPLE_TARGET_S.

    One call (which also warms up), then one batch sized from it; the second estimate, taken
    warm and over more calls, sets the batch.
    """
    single = max(sample(1), 1.0)
    batch = _batch_for(single)
    if batch == 1:
        return 1
    return _batch_for(max(sample(batch), 1.0) / batch)


def _batch_for(per_call_ns: float) -> int:
    return max(1, math.ceil(SAMPLE_TARGET_S * 1e9 / per_call_ns))
