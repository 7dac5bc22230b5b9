"""Run many kernels on all cores: core slots, memory admission, ordering, Ctrl-C.

One task group per sweep; each kernel runs in its own task with its own worker. Supervisor
side: no torch.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import msgspec

from kbd.catalog import Entry
from kbd.limits import WORKER_BASE_BYTES, format_size
from kbd.outcome import Record
from kbd.protocol import Job
from kbd.runner import run_kernel
from kbd.spawner import Spawner, TemplateError


@dataclass(frozen=True)
class Planned:
    """A kernel ready to run: its entry, its job and its predicted cost."""

    entry: Entry
    job: Job
    memory: int  # predicted peak bytes
    expected_s: float  # predicted wall time, for ordering


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


def core_slots(cores: list[int], jobs: int) -> list[tuple[int, ...]]:
    """Split the usable cores into `jobs` disjoint slots (round-robin)."""
    jobs = max(1, min(jobs, len(cores)))
    return [tuple(cores[i::jobs]) for i in range(jobs)]


def order(plans: list[Planned]) -> list[Planned]:
    """Longest expected first, so a slow kernel does not start last and stretch the sweep."""
    return sorted(plans, key=lambda p: (-p.expected_s, p.entry.kernel))


async def execute(
    spawner: Spawner,
    plans: list[Planned],
    *,
    slots: list[tuple[int, ...]],
    budget: int,
    timeout: float,
    log_dir: Path,
    hooks: Hooks,
    run: Callable[..., Awaitable[Record]] = run_kernel,
) -> bool:
    """Run every plan; returns False when the user interrupted before all had started.

    `run` runs one kernel in a worker (`runner.run_kernel`; tests pass a fake).
    """
    memory = Memory(budget)
    free_slots = list(slots)
    slot_freed = anyio.Event()
    stopping = anyio.Event()

    async def run_one(plan: Planned, cores: tuple[int, ...]) -> None:
        nonlocal slot_freed
        try:
            hooks.started(plan.entry.name)
            record = await run_plan(
                spawner, plan, cores, timeout=timeout, log_dir=log_dir, hooks=hooks, run=run
            )
            hooks.finished(record)
        finally:
            memory.release(plan.memory)
            free_slots.append(cores)
            slot_freed.set()
            slot_freed = anyio.Event()

    async with anyio.create_task_group() as group:
        group.start_soon(watch_interrupts, stopping, group.cancel_scope, hooks)
        for plan in plans:
            reason = too_big(plan, budget)
            if reason is not None:  # never started: a worker could not hold it
                hooks.finished(skipped(plan, reason))
                continue
            while not free_slots and not stopping.is_set():
                with anyio.move_on_after(0.5):
                    await slot_freed.wait()
            if stopping.is_set():
                break
            cores = free_slots.pop(0)
            await memory.acquire(plan.memory)
            group.start_soon(run_one, plan, cores)
        completed = not stopping.is_set()
        while len(free_slots) < len(slots):
            await slot_freed.wait()
        group.cancel_scope.cancel()
    return completed


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
            log_path=log_dir / (plan.entry.name.replace("/", "__") + ".log"),
            on_phase=hooks.phase,
            on_memory=hooks.memory,
        )
    except Exception as exc:
        if _is_template_error(exc):
            raise  # no worker can start any more: the command ends
        return Record(  # a kbd bug must not end the sweep: record it
            kernel=plan.entry.name,
            outcome="error",
            phase="supervisor",
            message=f"kbd internal error: {exc!r}",
        )


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
    message = f"needs about {format_size(plan.memory)}, {reason}"
    return Record(
        kernel=plan.entry.name,
        outcome="skipped",
        phase="schedule",
        message=message,
        expected=str(plan.entry.xfail) if plan.entry.xfail else None,
    )


def _is_template_error(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(TemplateError)[0] is not None
    return isinstance(exc, TemplateError)
