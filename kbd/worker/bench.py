"""Time a passing kernel against PyTorch eager, in import mode or compile mode.

Both sides run in this worker, on its pinned cores, on the same input buffers. A sample is a
batch of back-to-back calls sized to take about `SAMPLE_TARGET_S`, so that timer resolution and
per-sample costs vanish even for kernels of a few nanoseconds. Eager samples are timed with
`time.perf_counter_ns` around a Python loop of `model(*args)`, which is what eager costs its
users. The compiled side:

- import mode (`measure`): timed inside the JIT code (`mlir.add_bench_wrappers`: clock_gettime
  around a loop of direct calls of the one compiled function);
- compile mode (`measure_forward`): the whole compiled forward as users call it, `compiled(*args)`
  (Dynamo's guards, the compiled subgraphs through ctypes, and what Dynamo left to eager), timed
  with exactly the Python loop eager is timed with. Timing code cannot go into the JIT code here:
  a forward is several subgraphs glued by Python.

The calling path's own cost is measured on an empty function and reported (`overhead_ns`): the
JIT loop's in import mode, the Python loop's in compile mode, where it is part of both sides.
Samples alternate, compiled then eager, so drift (frequency, other load) hits both sides alike,
and go on until each side has `min_time_s` of measurements and `min_samples` samples, or until
`budget_s` has passed (a slow kernel then reports fewer samples).

With `BenchOptions.inductor`, a third side joins the alternation: `torch.compile(model)` with
its default backend, Inductor, timed with eager's Python loop, as its users call it. It is
compiled by its first call before any sample (`inductor`), with its caches in the worker's
scratch folder; that call's time is reported apart. When Inductor cannot compile the kernel (no
C++ compiler, an op it rejects), the reason is reported in one line and eager's figures still
come out.

Before the first sample, glibc's allocator is told to keep freed memory (`steady_allocator`),
for every side alike: otherwise a buffer freed at the end of a call can go back to the system
and be faulted in again, page by page, on the next call, and whether it does depends on what
else the process allocated and on its size (glibc maps every block of 32 MiB or more on its own).
Each side makes its first call before that, with the default allocator: what a first call keeps
for good (caches, plans) is then allocated below the blocks the timed calls reuse. Allocated
after, it would sit right past a freed output and pin it: glibc before 2.38 does not reuse a
freed block for an aligned request of the same size (torch aligns), so each pinned output is
lost, and large outputs then grew the heap by several GiB (level1/91's bench at 8.9 GiB).
Even so, a side whose temporaries are large grows the heap for its first few calls after the
switch (eager's softsign over 384 MiB: five calls, each faulting its new blocks in at up to 5x
its steady time), so the sides are called in turn until a whole round faults (almost) no page
in (`_settle`) before anything is calibrated or timed.

Statistics are the supervisor's job (kbd/results/stats.py); this module only measures.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import os
import resource
import signal
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import psutil
import torch

from kbd.shared.protocol import BenchLoop, BenchOptions, BenchSamples
from kbd.worker.mlir import BenchTimer

SAMPLE_TARGET_S = 0.01  # one sample's duration: ~100 samples per side in the default 1 s
OVERHEAD_BATCH = 10_000  # calls per sample when timing the empty function
OVERHEAD_SAMPLES = 5

Sample = Callable[[int], float]  # batch size -> nanoseconds for that many calls


@dataclass
class Baseline:
    """A second baseline ready to sample (`sample`), or why it is not (`error`)."""

    sample: Sample | None
    compile_s: float | None = None
    cached: bool = False  # every graph came from Inductor's caches
    error: str | None = None


class _OutOfTime(Exception):
    """Inductor's compile ran past its limit (raised by the SIGALRM handler)."""


def inductor(
    model: torch.nn.Module,
    args: list,
    cache: str | None = None,
    limit_s: float | None = None,
) -> Baseline:
    """`torch.compile(model)` with Inductor, compiled by one call (timed apart), or why not.

    A compile that runs past `limit_s` is stopped (an alarm interrupts it, and the C++
    compiles it started are killed): the kernel is then timed against eager alone, the record
    saying why. A baseline must not make a kernel time out whose own code compiled and passed
    (an RNN unrolled over many steps: README, Benchmarking).

    Its caches are in `cache`, the kernel's folder shared by its processes
    (kbd/caches/inductor_cache.py), or else in the worker's scratch folder
    (`sandbox.use_scratch`): the only places a contained worker may write. In a warm folder the
    compile is mostly a load. Precompiled headers are off: Inductor keeps them under the
    template's temporary folder, fixed when it was imported, and in a fresh cache they would
    only add a compile. It compiles in this process: a pool of compile workers would be
    processes outside the worker's accounting."""
    from torch._inductor import config

    if cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache

    config.compile_threads = 1
    config.cpp_cache_precompile_headers = False
    from torch._dynamo.utils import counters

    start = time.perf_counter()
    limit = _TimeLimit(limit_s)
    try:
        with limit:
            compiled = torch.compile(model)
            with torch.no_grad():
                compiled(*args)
    except Exception as exc:  # any failure of Inductor's is the baseline's result
        if limit.expired:  # raised as _OutOfTime, maybe wrapped by Inductor (InductorError)
            _kill_children()
            return Baseline(None, error=f"Inductor did not compile within {limit_s:g} s (stopped)")
        return Baseline(None, error=f"{type(exc).__name__}: {first_line(exc)}"[:300])
    graphs = counters["inductor"]
    cached = graphs["fxgraph_cache_hit"] > 0 and graphs["fxgraph_cache_miss"] == 0
    return Baseline(
        python_loop(compiled, args), compile_s=time.perf_counter() - start, cached=cached
    )


class _TimeLimit:
    """Raise `_OutOfTime` in the main thread once `seconds` have passed (None: no limit), and
    remember that it did: the code interrupted may wrap the exception in one of its own."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.expired = False
        self._previous = None

    def _out_of_time(self, signum, frame):
        self.expired = True
        raise _OutOfTime

    def __enter__(self) -> _TimeLimit:
        if self.seconds is not None:
            self._previous = signal.signal(signal.SIGALRM, self._out_of_time)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc) -> None:
        if self.seconds is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)


def _kill_children() -> None:
    """Kill what an interrupted compile left running (Inductor's C++ compiler processes), so
    that they do not share the cores with the timing."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()


def first_line(error: BaseException | str) -> str:
    """The first non-empty line of an error's text ("" when it has none): records keep one line."""
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def measure(
    compiled: BenchTimer,
    noop: BenchTimer,
    model: torch.nn.Module,
    args: list,
    options: BenchOptions,
    baseline: Baseline | None = None,
) -> BenchSamples:
    """Import mode: the JIT's timing loop against a Python loop of eager calls (and of
    Inductor's, with `baseline`)."""
    started = time.perf_counter()
    overhead = sorted(noop(OVERHEAD_SAMPLES, OVERHEAD_BATCH) / OVERHEAD_BATCH)
    return _alternate(
        lambda batch: float(compiled(1, batch)[0]),
        python_loop(model, args),
        overhead_ns=float(overhead[len(overhead) // 2]),
        options=options,
        started=started,
        loop="jit",
        baseline=baseline,
    )


def measure_forward(
    compiled: Callable,
    model: torch.nn.Module,
    args: list,
    options: BenchOptions,
    eager_settings: Callable[[], AbstractContextManager] = contextlib.nullcontext,
    baseline: Baseline | None = None,
) -> BenchSamples:
    """Compile mode: the compiled forward and eager, each in the same Python loop; eager's
    batches run inside `eager_settings()`."""
    started = time.perf_counter()
    empty = python_loop(_empty, args)
    overhead = sorted(empty(OVERHEAD_BATCH) / OVERHEAD_BATCH for _ in range(OVERHEAD_SAMPLES))
    return _alternate(
        python_loop(compiled, args),
        python_loop(model, args, eager_settings),
        overhead_ns=overhead[len(overhead) // 2],
        options=options,
        started=started,
        loop="python",
        baseline=baseline,
    )


def python_loop(
    function: Callable,
    args: list,
    settings: Callable[[], AbstractContextManager] = contextlib.nullcontext,
) -> Sample:
    """A sample function: `batch` calls of `function(*args)` without autograd, timed."""

    def sample(batch: int) -> float:
        with torch.no_grad(), settings():
            t0 = time.perf_counter_ns()
            for _ in range(batch):
                function(*args)
            return float(time.perf_counter_ns() - t0)

    return sample


def _empty(*args) -> None:
    """What the Python loop calls to measure its own cost."""


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters


def steady_allocator() -> bool:
    """Keep freed heap memory in the process (no trimming) and serve every block from the
    heap, not from fresh mappings (glibc maps blocks of 32 MiB and more on its own, whatever
    its threshold): calls that free and allocate the same buffers then reuse pages already
    faulted in. Returns whether the C library took it (glibc's mallopt)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    trimmed = mallopt(M_TRIM_THRESHOLD, 1 << 30)
    unmapped = mallopt(M_MMAP_MAX, 0)
    return bool(trimmed and unmapped)


SETTLE_ROUNDS = 10  # at most, for a heap that keeps growing
SETTLED_FAULTS = 256  # page faults a round may take and count as settled (1 MiB of pages)


def _settle(sides: list[Sample]) -> None:
    """Call each side in turn until a round faults (almost) no page in (or SETTLE_ROUNDS):
    the allocator has then found room for every block the sides ask for."""
    for _ in range(SETTLE_ROUNDS):
        before = _minor_faults()
        for sample in sides:
            sample(1)
        if _minor_faults() - before <= SETTLED_FAULTS:
            return


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _alternate(
    compiled_sample: Sample,
    eager_sample: Sample,
    *,
    overhead_ns: float,
    options: BenchOptions,
    started: float,
    loop: BenchLoop,
    baseline: Baseline | None = None,
) -> BenchSamples:
    """Calibrate each side's batch size, then take alternating samples: compiled, eager, and
    the second baseline when there is one."""
    second = baseline.sample if baseline is not None else None
    sides = (compiled_sample, eager_sample, second)
    first_calls = [sample(1) for sample in sides if sample is not None]
    steady_allocator()  # after the first calls: see the module's docstring
    _settle([sample for sample in sides if sample is not None])
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection inside a sample is noise, not the kernel's cost
    try:
        compiled_batch = _calibrate(compiled_sample, first_calls[0])
        eager_batch = _calibrate(eager_sample, first_calls[1])
        second_batch = _calibrate(second, first_calls[2]) if second is not None else 0
        compiled_ns: list[float] = []
        eager_ns: list[float] = []
        second_ns: list[float] = []
        while True:
            compiled_ns.append(compiled_sample(compiled_batch) / compiled_batch)
            eager_ns.append(eager_sample(eager_batch) / eager_batch)
            if second is not None:
                second_ns.append(second(second_batch) / second_batch)
            enough = (
                len(compiled_ns) >= options.min_samples
                and sum(compiled_ns) * compiled_batch >= options.min_time_s * 1e9
                and sum(eager_ns) * eager_batch >= options.min_time_s * 1e9
                and sum(second_ns) * second_batch >= (second is not None) * options.min_time_s * 1e9
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
        overhead_ns=overhead_ns,
        threads=torch.get_num_threads(),
        budget_hit=not enough,
        loop=loop,
        inductor_ns=second_ns,
        inductor_batch=second_batch,
        inductor_compile_s=baseline.compile_s if baseline is not None else None,
        inductor_cached=baseline is not None and baseline.cached,
        inductor_error=baseline.error if baseline is not None else None,
    )


def _calibrate(sample: Sample, first_call_ns: float) -> int:
    """Calls per sample so that one sample takes about SAMPLE_TARGET_S.

    The time of a first call (which also warmed up) sizes one batch; the second estimate,
    taken warm and over more calls, sets the batch.
    """
    batch = _batch_for(max(first_call_ns, 1.0))
    if batch == 1:
        return 1
    return _batch_for(max(sample(batch), 1.0) / batch)


def _batch_for(per_call_ns: float) -> int:
    return max(1, math.ceil(SAMPLE_TARGET_S * 1e9 / per_call_ns))
