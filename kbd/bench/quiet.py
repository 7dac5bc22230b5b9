"""Benchmarks on a quiet machine: one kernel is timed at a time, and every other worker of this
supervisor is paused (SIGSTOP) while it is, its deadline standing still meanwhile.

Why: at `-j 2` the kernel being timed shared the L3 cache, the memory bandwidth and the boost
clock with whatever the other worker did (a JIT, another benchmark). Two identical level-1
sweeps then disagreed by more than their intervals on a third of the kernels, both sides moving
by up to 1.8x (README, "Repeatability"). Import, pipeline, JIT and checks still run in parallel;
only timing is serialized.

The protocol: a worker announces its `bench` phase (a `Phase` frame) and waits; the supervisor
(`TimedAlone`) takes the token (`Quiet.acquire`), pauses the others and answers `QuietGranted`;
the token goes back when the worker's result arrives or the worker ends. The scope is one
supervisor process: the sweeps of a daemon's clients share one; separate `kbd` commands without
a daemon do not coordinate.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
from collections.abc import Callable, Iterator

import anyio
from anyio.abc import ByteSendStream, TaskGroup
from anyio.lowlevel import RunVar

from kbd.shared import protocol
from kbd.shared.protocol import QuietGranted


class Pausable:
    """One running worker's process group and the deadline it runs under."""

    def __init__(
        self, pgid: int, deadline: anyio.CancelScope, shown: Callable[[bool], None]
    ) -> None:
        self.pgid = pgid
        self.deadline = deadline
        self.shown = shown  # tells the live display: paused (True) or running again (False)
        self._remaining: float | None = None  # of the deadline, while paused
        self._paused_at = 0.0
        self.paused_s = 0.0  # how long it has been paused in all, up to its last resume

    def pause(self) -> None:
        """Stop the group; its deadline stands still until `resume`."""
        if self._remaining is None:
            _signal(self.pgid, signal.SIGSTOP)
            self._paused_at = anyio.current_time()
            self._remaining = self.deadline.deadline - self._paused_at
            self.deadline.deadline = math.inf
            self.shown(True)

    def resume(self) -> None:
        if self._remaining is not None:
            _signal(self.pgid, signal.SIGCONT)
            now = anyio.current_time()
            self.deadline.deadline = now + self._remaining
            self.paused_s += now - self._paused_at
            self._remaining = None
            self.shown(False)


class Quiet:
    """The token a worker holds while it is timed, and the workers it pauses."""

    def __init__(self) -> None:
        self._token = anyio.Semaphore(1)  # FIFO; unlike a Lock, any task may release it
        self._running: set[Pausable] = set()
        self._holder: Pausable | None = None

    @contextlib.contextmanager
    def running(
        self,
        pgid: int,
        deadline: anyio.CancelScope,
        shown: Callable[[bool], None] = lambda paused: None,
    ) -> Iterator[Pausable]:
        """Register a worker for as long as it runs; one started while another is timed is
        paused at once. On the way out it is continued (so that TERM can reach it) and gives
        back the token if it held it."""
        worker = Pausable(pgid, deadline, shown)
        self._running.add(worker)
        if self._holder is not None:
            worker.pause()
        try:
            yield worker
        finally:
            self._running.discard(worker)
            self.release(worker)
            worker.resume()

    async def acquire(self, worker: Pausable) -> bool:
        """Wait for the token, then pause every other running worker. False when `worker`
        ended while it waited (the token is not kept)."""
        await self._token.acquire()
        if worker not in self._running:
            self._token.release()
            return False
        self._holder = worker
        for other in self._running - {worker}:
            other.pause()
        return True

    def release(self, worker: Pausable) -> None:
        """Give the token back if `worker` holds it, continuing the others."""
        if self._holder is not worker:
            return
        self._holder = None
        for other in self._running:
            other.resume()
        self._token.release()


class TimedAlone:
    """The supervisor's side of the protocol for one worker whose job is timed alone: at its
    bench phase, a task of `group` waits for the token and then tells the worker on `channel`
    (`QuietGranted`); `done` gives the token back once the worker's result is in."""

    def __init__(
        self, quiet: Quiet, worker: Pausable, channel: ByteSendStream, group: TaskGroup
    ) -> None:
        self._quiet = quiet
        self._worker = worker
        self._channel = channel
        self._group = group

    def phase(self, name: str) -> None:
        """The worker announced phase `name`."""
        if name == protocol.BENCH_PHASE:
            self._group.start_soon(self._grant)

    async def _grant(self) -> None:
        if await self._quiet.acquire(self._worker):
            # A worker dead already ends without its grant; its exit is classified.
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                await self._channel.send(protocol.encode(QuietGranted()))

    def done(self) -> None:
        """The worker's result is in: its timing is over."""
        self._quiet.release(self._worker)


def _signal(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


_current: RunVar[Quiet] = RunVar("kbd.bench.quiet")


def current() -> Quiet:
    """The coordinator of this event loop's workers (one per supervisor process in practice:
    the scope the module docstring describes)."""
    try:
        return _current.get()
    except LookupError:
        quiet = Quiet()
        _current.set(quiet)
        return quiet
