"""Run many kernels on all cores: core slots, memory admission, ordering, Ctrl-C.

One task group per sweep; each kernel runs in its own task with its own worker. A kernel run at
its problem's own shapes (`--shapes kernelbench`) is sized first, in a worker of its own on the
meta device (`size_plan`), so that its estimate, and so `too_big` and admission, know the shapes
before anything of their size exists. Supervisor side: no torch.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import msgspec

from kbd.caches import compile_cache, import_cache
from kbd.engine import dumps
from kbd.engine.runner import run_kernel, size_kernel
from kbd.engine.spawner import Spawner
from kbd.plan import limits, spec
from kbd.plan.catalog import Entry
from kbd.plan.limits import WORKER_BASE_BYTES, format_size
from kbd.results.record import Record, inputs_of, label
from kbd.shared.errors import TemplateError
from kbd.shared.protocol import Job, Sized


@dataclass(frozen=True)
class Planned:
    """A kernel ready to run: its entry, its job and its predicted cost."""

    entry: Entry
    job: Job
    memory: int  # predicted peak bytes
    expected_s: float  # predicted wall time, for ordering

    @property
    def label(self) -> str:
        return label(self.entry.name, self.job.mode)


@dataclass
class Hooks:
    """Callbacks for reporting; all are called from the event loop."""

    started: Callable[[str], None] = lambda kernel: None
    phase: Callable[[str, str], None] = lambda kernel, phase: None
    memory: Callable[[str, int], None] = lambda kernel, rss: None
    finished: Callable[[Record], None] = lambda record: None
    lost: Callable[[Record], None] = lambda record: None  # a non-final attempt (kbd.cluster)
    notice: Callable[[str], None] = lambda text: print(text, file=sys.stderr)


@dataclass
class Memory:
    """Memory admission: a kernel starts once its predicted need fits the budget."""

    budget: int
    used: int = 0
    changed: anyio.Event = field(default_factory=anyio.Event)

    async def acquire(self, amount: int) -> None:
        while self.used + amount > self.budget and self.used > 0:
            await self.changed.wait()
        self.used += amount

    def release(self, amount: int) -> None:
        self.used -= amount
        self.changed.set()
        self.changed = anyio.Event()


class Pool:
    """Cores and memory shared by every kernel of one supervisor: a command, or the daemon with
    the sweeps of all its clients.

    A kernel needs a number of whole cores (pinned, not shared) and its estimated memory. Requests
    are served strictly in arrival order: the first waiter gets cores as soon as enough are free
    and its memory fits the budget (or nothing else runs), and nobody overtakes it, so a large
    kernel is not starved by a stream of small ones.
    """

    def __init__(self, cores: list[int], budget: int):
        self.cores = list(cores)
        self.budget = budget
        self.free = list(cores)
        self.reserved = 0
        self._queue: list[object] = []
        self._changed = anyio.Event()

    async def acquire(self, count: int, memory: int) -> tuple[int, ...]:
        count = max(1, min(count, len(self.cores)))
        ticket = object()
        self._queue.append(ticket)
        try:
            while not (self._queue[0] is ticket and self._fits(count, memory)):
                await self._changed.wait()
        finally:
            self._queue.remove(ticket)
            self._notify()
        taken, self.free = tuple(self.free[:count]), self.free[count:]
        self.reserved += memory
        return taken

    def release(self, cores: tuple[int, ...], memory: int) -> None:
        self.free = sorted([*self.free, *cores])
        self.reserved -= memory
        self._notify()

    def _fits(self, count: int, memory: int) -> bool:
        idle = len(self.free) == len(self.cores)
        return len(self.free) >= count and (self.reserved + memory <= self.budget or idle)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()


@dataclass
class Control:
    """How a running sweep is stopped from outside (the daemon): `stop` starts nothing new;
    with `kill` it also kills the running kernels (the scope `execute` sets)."""

    stopping: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope | None = None

    def stop(self, *, kill: bool) -> None:
        self.stopping.set()
        if kill and self.scope is not None:
            self.scope.cancel()


def cores_per_worker(cores: list[int], jobs: int) -> int:
    """Whole cores each of `jobs` parallel workers gets."""
    return max(1, len(cores) // max(1, min(jobs, len(cores))))


def core_slots(cores: list[int], jobs: int) -> list[tuple[int, ...]]:
    """Split the usable cores into `jobs` disjoint slots (round-robin)."""
    jobs = max(1, min(jobs, len(cores)))
    return [tuple(cores[i::jobs]) for i in range(jobs)]


def order(plans: list[Planned]) -> list[Planned]:
    """Longest expected first, so a slow kernel does not start last and stretch the sweep."""
    return sorted(plans, key=lambda p: (-p.expected_s, p.entry.kernel))


async def execute(
    spawner: Spawner | None,
    plans: list[Planned],
    *,
    pool: Pool,
    jobs: int,
    timeout: float,
    log_dir: Path,
    hooks: Hooks,
    control: Control | None = None,
    run: Callable[..., Awaitable[Record]] = run_kernel,
    size: Callable[..., Awaitable[Sized | Record]] = size_kernel,
) -> bool:
    """Run every plan with at most `jobs` at once, on cores and memory from `pool`.

    Without `control`, Ctrl-C and SIGTERM stop the sweep (first: start nothing new; second:
    kill). Returns False when stopped before all plans had started or when running kernels were
    killed (either way some kernels have no record, and `--resume` runs them). `run` runs one
    kernel in a worker (`runner.run_kernel`; tests pass a fake), `size` sizes one
    (`runner.size_kernel`). A plan that needs sizing (`needs_sizing`) is sized in its turn,
    admitted like a kernel at its levels estimate, before its own estimate decides whether and
    when it runs. `spawner` may be None when no plan can start (each is too big, see
    `too_big`): nothing is spawned then.
    """
    width = cores_per_worker(pool.cores, jobs)
    running = 0
    one_ended = anyio.Event()
    found: dict[tuple[str, str], Sized] = {}  # (kernel, dtype): --mode both sizes once

    async def run_one(plan: Planned, cores: tuple[int, ...]) -> None:
        nonlocal running, one_ended
        try:
            hooks.started(plan.label)
            record = await run_plan(
                spawner, plan, cores, timeout=timeout, log_dir=log_dir, hooks=hooks, run=run
            )
            hooks.finished(record)
        finally:
            pool.release(cores, plan.memory)
            running -= 1
            one_ended.set()
            one_ended = anyio.Event()

    async def admit(plan: Planned) -> tuple[int, ...] | None:
        """Cores for `plan` once this sweep is under `jobs` and the pool has room; None when
        the sweep is stopped meanwhile."""
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as waiter:
                waiter.start_soon(_cancel_when_set, control.stopping, scope)
                while running >= jobs:
                    await one_ended.wait()
                cores = await pool.acquire(width, plan.memory)
                waiter.cancel_scope.cancel()
                return cores
        return None

    async def sized_first(plan: Planned) -> Planned | Record | None:
        """The plan sized (or the record of its failed sizing); None when the sweep is stopped
        while it waits for cores."""
        known = found.get((plan.job.kernel, plan.job.dtype))
        if known is not None:
            return sized(plan, known)
        cores = await admit(plan)
        if cores is None:
            return None
        try:
            hooks.started(plan.label)
            outcome = await size_plan(
                spawner, plan, cores, timeout=timeout, log_dir=log_dir, hooks=hooks, size=size
            )
        finally:
            pool.release(cores, plan.memory)
        if isinstance(outcome, Planned):
            found[(plan.job.kernel, plan.job.dtype)] = outcome.job.sized
        return outcome

    own_signals = control is None
    control = control or Control()
    completed = ended = False
    async with anyio.create_task_group() as group:
        control.scope = group.cancel_scope
        if own_signals:
            group.start_soon(watch_interrupts, control.stopping, group.cancel_scope, hooks)
        for plan in plans:
            if control.stopping.is_set():
                break
            if needs_sizing(plan):
                outcome = await sized_first(plan)
                if outcome is None:
                    break
                if isinstance(outcome, Record):
                    hooks.finished(outcome)
                    continue
                plan = outcome
            reason = too_big(plan, pool.budget)
            if reason is not None:  # never started: a worker could not hold it
                hooks.finished(skipped(plan, reason))
                continue
            cores = await admit(plan)
            if cores is None:
                break
            running += 1
            group.start_soon(run_one, plan, cores)
        completed = not control.stopping.is_set()
        while running:
            await one_ended.wait()
        ended = True  # not killed: every started kernel has its record
        group.cancel_scope.cancel()
    return completed and ended


async def _cancel_when_set(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def run_plan(
    spawner: Spawner,
    plan: Planned,
    cores: tuple[int, ...],
    *,
    timeout: float,
    log_dir: Path,
    hooks: Hooks,
    run: Callable[..., Awaitable[Record]] = run_kernel,
) -> Record:
    """Run one planned kernel pinned to `cores`; a kbd bug becomes the kernel's error record.

    Only a dead template (no worker can start any more) raises.
    """
    job = _with_cores(plan.job, cores)
    try:
        return await run(
            spawner,
            plan.entry,
            job,
            timeout=timeout,
            log_path=log_dir / (dumps.file_stem(plan.label) + ".log"),
            on_phase=hooks.phase,
            on_memory=hooks.memory,
        )
    except Exception as exc:
        if _is_template_error(exc):
            raise  # no worker can start any more: the command ends
        return _internal_error(plan, exc)


def needs_sizing(plan: Planned) -> bool:
    """Does the plan run at its problem's own shapes, not measured yet (`size_plan`)?"""
    return plan.job.shapes == "kernelbench" and plan.job.sized is None


async def size_plan(
    spawner: Spawner,
    plan: Planned,
    cores: tuple[int, ...],
    *,
    timeout: float,
    log_dir: Path,
    hooks: Hooks,
    size: Callable[..., Awaitable[Sized | Record]] = size_kernel,
) -> Planned | Record:
    """Size a plan at its problem's own shapes in a worker pinned to `cores` (its log is
    `<kernel>.size.log`): the plan as sizing found it (`sized`), or the record of a sizing that
    failed. Only a dead template raises, as in `run_plan`."""
    try:
        outcome = await size(
            spawner,
            plan.entry,
            _with_cores(plan.job, cores),
            timeout=timeout,
            log_path=log_dir / (dumps.file_stem(plan.label) + ".size.log"),
            on_phase=hooks.phase,
            on_memory=hooks.memory,
        )
    except Exception as exc:
        if _is_template_error(exc):
            raise
        return _internal_error(plan, exc)
    return sized(plan, outcome) if isinstance(outcome, Sized) else outcome


def sized(plan: Planned, found: Sized) -> Planned:
    """The plan at the shapes sizing found: its estimate from them (kbd.plan.limits), its GFLOPS
    from kbd's FLOP count at them (none when uncounted; never the levels entry's, which are for
    other shapes), its -O (`Job.heavy_opt_level`), and cache keys that include them."""
    gflops = found.flops / 1e9 if found.flops is not None else None
    job = msgspec.structs.replace(plan.job, sized=found)
    if job.heavy_opt_level is not None and spec.is_heavy(gflops):
        job = msgspec.structs.replace(job, opt_level=job.heavy_opt_level)
    if job.import_cache is not None:
        cache = job.import_cache
        job = import_cache.attach(job, Path(cache.directory), cache.max_bytes)
    if job.compile_cache is not None:
        cache = job.compile_cache
        job = compile_cache.attach(job, Path(cache.directory), cache.max_bytes)
    return Planned(
        entry=msgspec.structs.replace(plan.entry, gflops=gflops),
        job=job,
        memory=max(plan.memory, limits.estimate_sized(found)),
        expected_s=plan.expected_s,
    )


def plan_record(plan: Planned, outcome: str, phase: str, message: str, **fields) -> Record:
    """The record of a planned kernel that ended without a worker's result (skipped, a kbd
    error, lost with its agent): what identifies it, and `fields`."""
    return Record(
        kernel=plan.entry.name,
        mode=plan.job.mode,
        dtype=plan.job.dtype,
        shapes=plan.job.shapes,
        inputs=inputs_of(plan.job),
        outcome=outcome,
        phase=phase,
        message=message,
        pipeline=plan.job.pipeline,
        warning=plan.entry.warning,
        **fields,
    )


def _internal_error(plan: Planned, exc: Exception) -> Record:
    """A kbd bug must not end the sweep: the kernel's record says what it was."""
    return plan_record(plan, "error", "supervisor", f"kbd internal error: {exc!r}")


async def watch_interrupts(stopping: anyio.Event, scope: anyio.CancelScope, hooks: Hooks) -> None:
    """First Ctrl-C: start nothing new, let running kernels finish. Second: kill them."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            if not stopping.is_set() and signum == signal.SIGINT:
                stopping.set()
                hooks.notice(
                    "kbd: interrupted; waiting for running kernels (Ctrl-C again to kill them)"
                )
                continue
            hooks.notice("kbd: killing running kernels")
            stopping.set()
            scope.cancel()
            return


def _with_cores(job: Job, cores: tuple[int, ...]) -> Job:
    return msgspec.structs.replace(job, limits=msgspec.structs.replace(job.limits, cores=cores))


def too_big(plan: Planned, budget: int) -> str | None:
    """Why a kernel's predicted memory rules it out (its --mem-limit or the budget), or None."""
    limit = plan.job.limits.mem_limit
    if limit is not None and plan.memory > limit + WORKER_BASE_BYTES:
        return f"more than --mem-limit {format_size(limit)} allows"
    if plan.memory > budget:
        return f"more than the memory budget {format_size(budget)}"
    return None


def skipped(plan: Planned, reason: str) -> Record:
    """The record of a kernel never started, because `reason` (from `too_big`)."""
    shapes = ""
    if plan.job.sized is not None:  # the problem's own: say which
        shapes = " for inputs " + _shorten(", ".join(plan.job.sized.inputs), 120)
    message = f"needs about {format_size(plan.memory)}{shapes}, {reason}"
    expected = str(plan.entry.expectation) if plan.entry.expectation else None
    return plan_record(plan, "skipped", "schedule", message, expected=expected)


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _is_template_error(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(TemplateError)[0] is not None
    return isinstance(exc, TemplateError)
