"""Time a kernel in several worker processes (`--bench-processes N`, default 3), as pyperf does.

Within one process, a kernel's samples agree closely; between processes they do not: where its
buffers land in physical memory (and so which cache sets they share), how the JIT's code is laid
out and what state the host is in all stay fixed for a process's life and change with the next.
Measured on a quiet machine, one matmul's speedup in four processes back to back spread several
times wider than any one process's interval (kbd/results/stats.py). A kernel timed in one process
can therefore not say how far its figure would move in the next sweep; timed in N, its interval
includes that spread.

The first process runs the whole job: load, reference, import, pipeline, JIT, run, check, and
its share of the timing, checked again after. Each further process runs the same job afresh
(with the import and compile caches it skips the import, pipeline and JIT), but not the run and
check before timing: the kernel passed in the first process, and the check after timing still
compares each process's outputs with its own reference. At bench shapes that run and check cost
more than the timing for many kernels: in a level-1 sweep with three processes that all ran
them, they took 35% of the workers' time. Each further process times its share:
each is asked for 1/N of the kernel's minimum time, samples and budget, so timing costs what it
did in one process. Processes run one after another on the kernel's cores; with timing alone
(kbd/bench/quiet.py) each takes the token for its own share, so the kernel's timing is spread
over time as well. A further process that does not pass ends the kernel with its record.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec

from kbd.results import stats
from kbd.results.record import Record
from kbd.shared.protocol import Job

RunOnce = Callable[[Job, int], Awaitable[Record]]  # (the job, the process index) -> its record


async def run(job: Job, gflops: float | None, run_once: RunOnce) -> Record:
    """The kernel's record over `job.bench.processes` processes, each run by `run_once`."""
    assert job.bench is not None
    count = job.bench.processes
    records: list[Record] = []
    for index in range(count):
        options = job.bench.per_process(index)
        if records and records[0].bench.inductor_error:  # records holds timed ones only
            # Inductor failed or ran out of time in the first: the others do not try again
            options = msgspec.structs.replace(options, inductor=False)
        each = msgspec.structs.replace(job, bench=options)
        record = await run_once(each, index)
        if record.bench is None:  # did not pass (or was not timed): that is the kernel's end
            if index:
                record.message = f"benchmark process {index + 1} of {count}: {record.message}"
            return record
        records.append(record)
    return _merged(records, gflops)


def log_path(first: Path, index: int) -> Path:
    """Where process `index` (from 0) writes its log: the kernel's own for the first."""
    if index == 0:
        return first
    return first.with_name(f"{first.stem}.process{index + 1}{first.suffix}")


def _merged(records: list[Record], gflops: float | None) -> Record:
    """The first process's record, with the figures of all and the work of all."""
    times: dict[str, float] = {}
    for record in records:
        for phase, seconds in record.times.items():
            times[phase] = times.get(phase, 0.0) + seconds
    peaks = [r.peak_rss_bytes for r in records if r.peak_rss_bytes is not None]
    return msgspec.structs.replace(
        records[0],
        wall_s=round(sum(r.wall_s for r in records), 3),
        paused_s=round(sum(r.paused_s for r in records), 3),
        peak_rss_bytes=max(peaks) if peaks else None,
        times=times,
        bench=stats.combine([r.bench.samples for r in records], gflops),
    )
