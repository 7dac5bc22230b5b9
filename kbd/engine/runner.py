"""Run one kernel in a fresh worker, with a deadline and a memory watch, and classify its end.

Supervisor side: no torch. Whatever the worker does (crash, hang, flood its output, send garbage,
exit early), this returns a Record; only cancellation of the whole command propagates, and even
then the worker's process group is killed and reaped first.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import msgspec
from anyio.streams.buffered import BufferedByteReceiveStream

from kbd.bench import processes as bench_processes
from kbd.bench import quiet as quiet_bench
from kbd.caches import compile_cache, import_cache, inductor_cache
from kbd.engine import bundles, dumps
from kbd.engine.scratch import scratch_folder
from kbd.engine.spawner import Spawner, Worker
from kbd.plan.catalog import Entry
from kbd.plan.limits import WORKER_BASE_BYTES, format_size
from kbd.results import stats
from kbd.results.record import LLVM_ERROR, Death, Record, classify, expect, inputs_of, label
from kbd.shared import proctree, protocol
from kbd.shared.protocol import (
    Generated,
    Imported,
    Job,
    Library,
    Phase,
    PipelineChosen,
    Result,
    Size,
    Sized,
    Task,
    WorkerMessage,
)

LOG_CAP_BYTES = 32 << 20
MEMORY_POLL_S = 0.1
KILL_GRACE_S = 1.0
DRAIN_GRACE_S = 2.0


@dataclass
class WorkerEnd:
    """What the supervisor saw of one worker, from spawn to reaping."""

    phase: str = protocol.START_PHASE
    result: Result | Sized | Generated | None = None  # the worker's answer to its task
    timed_out: bool = False
    memory_killed: bool = False
    peak_rss: int = 0
    llvm_error: str | None = None
    protocol_error: str | None = None
    exit_code: int | None = None
    exit_peak: int = 0
    imported: Imported | None = None  # a fresh module for the import cache
    library: Library | None = None  # a fresh library for the compile cache
    pipeline: str | None = None  # the pipeline the worker chose (Job.families)
    log_bytes: int = 0
    drained: anyio.Event = field(default_factory=anyio.Event)
    wall_s: float = 0.0
    paused_s: float = 0.0  # of wall_s, paused while other kernels were timed alone

    def death(self, mem_limit: int | None, timeout: float) -> Death:
        """The facts `outcome.classify` needs."""
        return Death(
            returncode=self.exit_code,
            last_phase=self.phase,
            timed_out=self.timed_out,
            timeout_s=timeout,
            memory_killed=self.memory_killed,
            mem_limit=mem_limit,
            peak_rss_bytes=max(self.peak_rss, self.exit_peak) or None,
            llvm_error=self.llvm_error,
            protocol_error=self.protocol_error,
        )


async def run_kernel(
    spawner: Spawner,
    entry: Entry,
    job: Job,
    *,
    timeout: float,
    log_path: Path,
    on_phase: Callable[[str, str], None] = lambda kernel, phase: None,
    on_memory: Callable[[str, int], None] = lambda kernel, rss: None,
) -> Record:
    """Run `job` in a new worker, with its own scratch folder, and return its classified record;
    a benchmark timed in several processes runs in that many workers, one after another.
    With `--baseline inductor`, the kernel's processes share a folder for Inductor's caches
    (kbd.caches.inductor_cache): the kernel's own in the cache, made here (on the node that runs
    it), or a temporary one removed when the kernel ends."""
    run = functools.partial(
        _run_processes,
        spawner,
        entry,
        timeout=timeout,
        log_path=log_path,
        on_phase=on_phase,
        on_memory=on_memory,
    )
    if job.bench is None or not job.bench.inductor:
        return await run(job)
    kept = job.bench.inductor_cache
    if kept and await anyio.to_thread.run_sync(inductor_cache.ready, Path(kept)):
        record = await run(job)
        with contextlib.suppress(OSError):
            await anyio.to_thread.run_sync(
                inductor_cache.evict,
                Path(kept).parent,
                inductor_cache.DEFAULT_MAX_BYTES,
                frozenset({Path(kept)}),
            )
        return record
    with scratch_folder(f"{label(entry.name, job.mode)}-inductor") as folder:
        bench = msgspec.structs.replace(job.bench, inductor_cache=str(folder))
        return await run(msgspec.structs.replace(job, bench=bench))


async def _run_processes(
    spawner, entry, job: Job, *, timeout, log_path, on_phase, on_memory
) -> Record:
    if job.bench is None or job.bench.processes <= 1:
        return await _run_in_scratch(spawner, entry, job, timeout, log_path, on_phase, on_memory)
    count = job.bench.processes

    async def run_once(process_job: Job, index: int) -> Record:
        def shown(kernel: str, phase: str) -> None:
            on_phase(kernel, f"{phase} [{index + 1}/{count}]" if index else phase)

        path = bench_processes.log_path(log_path, index)
        return await _run_in_scratch(spawner, entry, process_job, timeout, path, shown, on_memory)

    return await bench_processes.run(job, entry.gflops, run_once)


async def size_kernel(
    spawner: Spawner,
    entry: Entry,
    job: Job,
    *,
    timeout: float,
    log_path: Path,
    on_phase: Callable[[str, str], None] = lambda kernel, phase: None,
    on_memory: Callable[[str, int], None] = lambda kernel, rss: None,
) -> Sized | Record:
    """Measure a job's problem at its own shapes in a new worker (a `Size` task: the meta
    device, nothing of the inputs' size allocated; kbd.worker.sizing), with the job's limits,
    cores and containment, in a scratch folder of its own: the measure, or the classified
    record of a sizing that failed (the problem raised, crashed, hung or ran out of memory)."""
    name = label(entry.name, job.mode)
    with scratch_folder(name) as scratch:
        task = Size(
            kernel=job.kernel,
            source=job.source,
            source_text=job.source_text,
            dtype=job.dtype,
            seed=job.seed,
            limits=msgspec.structs.replace(job.limits, scratch=str(scratch)),
        )
        state = await run_in_worker(
            spawner,
            task,
            name=name,
            mem_limit=job.limits.mem_limit,
            timeout=timeout,
            log_path=log_path,
            on_phase=on_phase,
            on_memory=on_memory,
        )
    if isinstance(state.result, Sized) and not (state.timed_out or state.memory_killed):
        return state.result
    # nothing was imported or compiled: the record names no cache
    job = msgspec.structs.replace(job, import_cache=None, compile_cache=None)
    return _record(entry, job, state, timeout, log_path)


async def _run_in_scratch(spawner, entry, job, timeout, log_path, on_phase, on_memory) -> Record:
    with scratch_folder(label(entry.name, job.mode)) as scratch:
        writable = job.limits.writable
        if job.bench is not None and job.bench.inductor_cache:
            writable = (*writable, job.bench.inductor_cache)
        limits = msgspec.structs.replace(job.limits, scratch=str(scratch), writable=writable)
        job = msgspec.structs.replace(job, limits=limits)
        return await _run_kernel(spawner, entry, job, timeout, log_path, on_phase, on_memory)


async def _run_kernel(spawner, entry, job, timeout, log_path, on_phase, on_memory) -> Record:
    job = await _with_cached_library(job)
    if job.compile_cache is None or job.compile_cache.library is None:
        job = await _with_cached_import(job)
    else:  # nothing is imported: the import cache is not used
        job = msgspec.structs.replace(job, import_cache=None)
    state = await run_in_worker(
        spawner,
        job,
        name=label(entry.name, job.mode),
        mem_limit=job.limits.mem_limit,
        timeout=timeout,
        log_path=log_path,
        on_phase=on_phase,
        on_memory=on_memory,
    )
    imported = state.imported
    if imported is not None and job.import_cache and imported.key == job.import_cache.key:
        with contextlib.suppress(OSError):  # a full disk costs the cache entry, not the result
            await anyio.to_thread.run_sync(import_cache.store, job.import_cache, imported.module)
    library = state.library
    if library is not None and job.compile_cache and library.key == job.compile_cache.key:
        with contextlib.suppress(OSError):
            await anyio.to_thread.run_sync(compile_cache.store, job.compile_cache, library)
    record = _record(entry, job, state, timeout, log_path)
    failure = classify(state.result, state.death(job.limits.mem_limit, timeout))
    return await anyio.to_thread.run_sync(_with_artifacts, record, failure, job, log_path)


def _with_artifacts(record: Record, failure, job: Job, log_path: Path) -> Record:
    """The record naming what the worker left in its scratch folder, once moved out of it:
    printed IR and object files (kbd.engine.dumps) and, for a kernel that did not pass a pipeline
    stage, a reproducer bundle (`failure`: how the stage ended, before any xfail applies)."""
    try:
        record.dumps = dumps.collect(job, log_path)
        record.bundle = bundles.write(record, failure, job, log_path)
    except OSError as exc:  # a full disk costs the artifacts, not the result
        record.message += f" (kbd could not write its files: {exc})"
    return record


async def run_in_worker(
    spawner: Spawner,
    task: Task,
    *,
    name: str,
    mem_limit: int | None,
    timeout: float,
    log_path: Path,
    on_phase: Callable[[str, str], None] = lambda name, phase: None,
    on_memory: Callable[[str, int], None] = lambda name, rss: None,
) -> WorkerEnd:
    """Run any task (a Job, or a Generate) in a new worker under a deadline and the memory
    watch; never raises for the worker's own failure (only cancellation propagates, after the
    worker is reaped)."""
    started = time.monotonic()
    state = WorkerEnd()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    worker = await spawner.spawn()
    try:
        with open(log_path, "wb") as log:
            async with anyio.create_task_group() as drain_group:
                drain_group.start_soon(_drain, worker.output_fd, log, state)
                try:
                    await _supervise(
                        spawner, worker, task, name, mem_limit, timeout, state, on_phase, on_memory
                    )
                finally:
                    with anyio.CancelScope(shield=True):
                        await _kill_and_reap(spawner, worker, state)
                        with anyio.move_on_after(DRAIN_GRACE_S):
                            await state.drained.wait()
                        drain_group.cancel_scope.cancel()
    finally:
        os.close(worker.output_fd)
        with contextlib.suppress(OSError):
            await worker.channel.aclose()
    state.wall_s = time.monotonic() - started
    return state


async def _with_cached_import(job: Job) -> Job:
    """The job with its import cache entry's text, when there is a valid one."""
    if job.import_cache is None:
        return job
    module = await anyio.to_thread.run_sync(import_cache.lookup, job.import_cache)
    if module is None:
        return job
    return msgspec.structs.replace(
        job, import_cache=msgspec.structs.replace(job.import_cache, module=module)
    )


async def _with_cached_library(job: Job) -> Job:
    """The job with its compile cache entry's library in the worker's scratch folder, when
    there is a valid one."""
    if job.compile_cache is None or job.limits.scratch is None:
        return job
    library = await anyio.to_thread.run_sync(compile_cache.lookup, job.compile_cache)
    if library is None:
        return job
    scratch = Path(job.limits.scratch)
    return await anyio.to_thread.run_sync(compile_cache.install, job, library, scratch)


async def _supervise(
    spawner, worker, task, name, mem_limit, timeout, state, on_phase, on_memory
) -> None:
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        await worker.channel.send(protocol.encode(task))  # a worker dead already is classified
    quiet = quiet_bench.current()

    def shown(paused: bool) -> None:
        on_phase(name, f"{state.phase} (paused)" if paused else state.phase)

    with (
        anyio.move_on_after(timeout) as deadline,
        quiet.running(worker.pid, deadline, shown) as pausable,
    ):
        async with anyio.create_task_group() as group:
            group.start_soon(
                _watch_memory,
                worker.pid,
                mem_limit,
                state,
                on_memory,
                name,
                group.cancel_scope,
            )
            alone = None
            if isinstance(task, Job) and task.timed_alone:
                alone = quiet_bench.TimedAlone(quiet, pausable, worker.channel, group)
            await _receive(worker, state, name, on_phase, alone)
            if alone is not None:
                alone.done()  # the timing is over once the result is in
            if state.protocol_error is None:
                exited = await spawner.wait(worker.pid)
                state.exit_code = exited.returncode
                state.exit_peak = exited.peak_rss_bytes
            group.cancel_scope.cancel()
    state.timed_out = deadline.cancelled_caught
    state.paused_s = pausable.paused_s


async def _receive(
    worker: Worker, state: WorkerEnd, kernel: str, on_phase, alone: quiet_bench.TimedAlone | None
) -> None:
    stream = BufferedByteReceiveStream(worker.channel)
    try:
        while state.result is None:
            message = await protocol.receive(stream, WorkerMessage)
            if isinstance(message, Phase):
                state.phase = message.name
                on_phase(kernel, message.name)
                if alone is not None:
                    alone.phase(message.name)
            elif isinstance(message, Imported):
                state.imported = message  # run_kernel checks it is the job's key
            elif isinstance(message, Library):
                state.library = message  # run_kernel checks it is the job's key
            elif isinstance(message, PipelineChosen):
                state.pipeline = message.name
            else:
                state.result = message
    except (
        anyio.EndOfStream,
        anyio.IncompleteRead,
        anyio.BrokenResourceError,
        anyio.ClosedResourceError,
    ):
        pass  # died or closed the channel: the exit status tells why
    except protocol.ProtocolError as exc:
        state.protocol_error = str(exc)


async def _watch_memory(pid, mem_limit, state, on_memory, kernel, scope) -> None:
    """Sample the RSS of the worker's whole process tree; kill it past its limit.

    RLIMIT_DATA inside the worker is the first line; this catches what it cannot see (child
    processes, file-backed growth). RSS includes the template's shared pages, hence the slack.
    """
    threshold = None if mem_limit is None else mem_limit + WORKER_BASE_BYTES
    while True:
        rss = proctree.tree_rss(pid)
        state.peak_rss = max(state.peak_rss, rss)
        on_memory(kernel, rss)
        if threshold is not None and rss > threshold:
            state.memory_killed = True
            _killpg(pid, signal.SIGKILL)
            scope.cancel()
            return
        await anyio.sleep(MEMORY_POLL_S)


async def _kill_and_reap(spawner: Spawner, worker: Worker, state: WorkerEnd) -> None:
    """Make sure the worker's group is dead and the worker reaped (TERM, grace, KILL)."""
    if state.exit_code is not None:
        return
    _killpg(worker.pid, signal.SIGTERM)
    with anyio.move_on_after(KILL_GRACE_S):
        exited = await spawner.wait(worker.pid)
        state.exit_code, state.exit_peak = exited.returncode, exited.peak_rss_bytes
        return
    _killpg(worker.pid, signal.SIGKILL)
    with anyio.move_on_after(10):
        exited = await spawner.wait(worker.pid)
        state.exit_code, state.exit_peak = exited.returncode, exited.peak_rss_bytes


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def _drain(fd: int, log, state: WorkerEnd) -> None:
    """Copy the worker's stdout/stderr into its log (capped) and spot `LLVM ERROR:` lines."""
    pending = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            await anyio.wait_readable(fd)
            continue
        if not chunk:
            break
        if state.log_bytes < LOG_CAP_BYTES:
            kept = chunk[: LOG_CAP_BYTES - state.log_bytes]
            log.write(kept)
            if len(kept) < len(chunk):
                log.write(b"\n[kbd] output truncated: log cap reached\n")
            log.flush()
        state.log_bytes += len(chunk)
        if state.llvm_error is None:
            pending = (pending + chunk)[-8192:]
            text = pending.decode("utf-8", "replace")
            match = LLVM_ERROR.search(text)
            if match and "\n" in text[match.start() :]:  # only a complete line
                state.llvm_error = match.group(0).strip()
    state.drained.set()


def _record(entry, job, state: WorkerEnd, timeout: float, log_path: Path) -> Record:
    if state.result is not None and not isinstance(state.result, Result):  # not an answer
        state.protocol_error = f"answered a {type(job).__name__} with {type(state.result).__name__}"
        state.result = None
    death = state.death(job.limits.mem_limit, timeout)
    peak = death.peak_rss_bytes
    outcome, phase, sig, message = classify(state.result, death)
    if outcome == "memory" and state.result is not None and job.limits.mem_limit:
        message = f"{message} (limit {format_size(job.limits.mem_limit)})"
    final, note = expect(outcome, phase, message, entry.expectation)
    result = state.result
    limits = _limits(job, timeout)
    if result is not None:
        limits.update(result.limits_enforced)  # what the worker confirmed it applied
    bench = stats.summarize(result.bench, entry.gflops) if result and result.bench else None
    not_benchmarked = None
    if job.bench is not None and bench is None:
        not_benchmarked = f"did not pass ({final} in {phase})"
    return Record(
        kernel=entry.name,
        mode=job.mode,
        dtype=job.dtype,
        shapes=job.shapes,
        inputs=inputs_of(job),
        outcome=final,
        phase=phase,
        signal=sig,
        message=f"{message} [{note}]" if note else message,
        wall_s=round(state.wall_s, 3),
        paused_s=round(state.paused_s, 3),
        peak_rss_bytes=peak,
        passing_tolerance=result.passing_tolerance if result else None,
        max_abs_error=result.max_abs_error if result else None,
        max_rel_error=result.max_rel_error if result else None,
        times=dict(result.times) if result else {},
        limits=limits,
        expected=str(entry.expectation) if entry.expectation else None,
        warning=entry.warning,
        log=str(log_path),
        import_cache=_cache_use(job, state),
        compile_cache=_compile_cache_use(job, result),
        pipeline=state.pipeline or job.pipeline,
        bench=bench,
        not_benchmarked=not_benchmarked,
        coverage=result.coverage if result else None,
        random_inputs=result.random_inputs if result else 0,
        state_writes=list(result.state_writes) if result else [],
    )


def _cache_use(job: Job, state: WorkerEnd) -> str | None:
    """'hit' when a cached module was given to the worker, 'miss' when it imported afresh."""
    if job.import_cache is None:
        return None
    if state.imported is not None or job.import_cache.module is None:
        return "miss"
    return "hit"


def _compile_cache_use(job: Job, result: Result | None) -> str | None:
    """What the worker said of the compile cache; for a kernel that ended without saying
    (an error, a crash), 'hit' when it was given a cached library."""
    if job.compile_cache is None:
        return None
    if result is not None and result.compile_cache is not None:
        return result.compile_cache
    return "hit" if job.compile_cache.library is not None else None


def _limits(job: Job, timeout: float) -> dict[str, str]:
    """The limits this kernel ran under, as set up for it (the worker confirms its part)."""
    mem = job.limits.mem_limit
    return {
        "memory": f"RLIMIT_DATA={mem}" if mem is not None else "none",
        "rss_watch": f"{mem + WORKER_BASE_BYTES}" if mem is not None else "none",
        "cores": ",".join(map(str, job.limits.cores)) or "all",
        "timeout": f"{timeout:g}s",
    }
