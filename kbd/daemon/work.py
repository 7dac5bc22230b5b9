"""What a daemon runs: the sweeps, runs and tunes of every client, on one pool of cores and
memory.

Policy (documented in the README): one `scheduler.Pool` holds the daemon's cores and its memory
budget. Every active sweep admits kernels as in-process (longest expected first, at most its
own `-j` at once, each worker pinned to `cores / -j` whole cores), and all of them draw from
the same pool, served strictly in arrival order, so two sweeps share the machine instead of
oversubscribing it and a large kernel is never starved. A sweep's own `--mem-budget`, if
smaller, caps only its kernels' admission into the pool (they still count against the daemon's).
One warm template per thread count (cores per worker) is started on first use and kept.

Followers get a replay (finished records, running kernels) and then live events through a
bounded queue; a follower that falls too far behind is dropped rather than slowing the sweep.
The store stays the source of truth: each attempt is committed as it ends.

A tune (kbd.tune.session) runs its candidates as a sweep runs its kernels: on the same pool, with
the same warm template for its thread count, stopped by the same `Control`; its followers get
its notices and trials (a replay, then live) and its summary at the end (`TuneEnded`), and each
trial is committed as it ends.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc
import msgspec
from anyio.streams.memory import MemoryObjectSendStream

from kbd.daemon.wire import (
    Accepted,
    Done,
    KernelFinished,
    KernelMemory,
    KernelPhase,
    KernelStarted,
    Notice,
    Refused,
    SubmitRequest,
    SubmitTune,
    SweepEnded,
    SweepState,
)
from kbd.engine import prepare, scheduler
from kbd.engine.scheduler import Control, Hooks, Pool, cores_per_worker
from kbd.engine.spawner import Spawner, template_env
from kbd.plan.limits import format_size
from kbd.results.record import Record
from kbd.results.store import Store
from kbd.shared import protocol
from kbd.shared.errors import InputError, fatal_error
from kbd.shared.protocol import START_PHASE
from kbd.tune import session

log = logging.getLogger("kbd.daemon")

FOLLOWER_QUEUE = 4096  # events a follower may lag behind before it is dropped


@dataclass
class Active:
    """A sweep, run or tune the daemon is executing."""

    key: str  # its name: "sweep 3", "run 2", "tune 4"
    command: str
    log_dir: Path
    prepared: prepare.Prepared | None = None  # a sweep or run
    tune: session.Session | None = None  # a tune
    control: Control = field(default_factory=Control)
    finished: list[bytes] = field(default_factory=list)  # frames to replay to a new follower
    running: dict[str, str] = field(default_factory=dict)  # kernel -> phase
    followers: set[MemoryObjectSendStream] = field(default_factory=set)
    status: str = "running"

    @property
    def sweep_id(self) -> int | None:
        return self.prepared.sweep_id if self.prepared is not None else None

    @property
    def tune_id(self) -> int | None:
        return self.tune.tune_id if self.tune is not None else None

    def accepted(self) -> Accepted:
        if self.tune is not None:
            tasks = len(self.tune.tasks)
            return Accepted(sweep_id=None, total=tasks, selected=tasks, tune_id=self.tune_id)
        return Accepted(
            sweep_id=self.sweep_id,
            total=len(self.prepared.plans),
            selected=len(self.prepared.kernels),
        )

    def state(self) -> SweepState:
        if self.tune is not None:
            total, done = len(self.tune.tasks), sum(1 for t in self.tune.tasks if t.done or t.note)
        else:
            total, done = len(self.prepared.plans), len(self.finished)
        return SweepState(
            sweep_id=self.sweep_id,
            tune_id=self.tune_id,
            command=self.command,
            total=total,
            done=done,
            running=sorted(self.running),
            followers=len(self.followers),
            state=self.status,
        )

    def broadcast(self, message: msgspec.Struct) -> bytes:
        frame = protocol.encode(message)
        for follower in list(self.followers):
            try:
                follower.send_nowait(frame)
            except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                log.warning("dropped a follower of %s: it fell behind", self.name)
                self.followers.discard(follower)
                follower.close()
        return frame

    @property
    def name(self) -> str:
        return self.key


class Work:
    """The daemon's work: cores, memory budget, templates, active sweeps (no torch here)."""

    def __init__(self, cores: list[int], budget: int, store: Path):
        self.pool = Pool(cores, budget)
        self.store_path = store
        self.templates: dict[int, Spawner] = {}
        self._template_locks: dict[int, anyio.Lock] = {}
        self.active: dict[int, Active] = {}
        self._runs = itertools.count(1)
        self._rss: dict[tuple[int, str], int] = {}
        self.peak_rss_total = 0
        self._closing = anyio.Event()
        self._group: anyio.abc.TaskGroup | None = None

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as group:
            self._group = group
            task_status.started()
            group.start_soon(self._warm_default)
            await self._closing.wait()
            group.cancel_scope.cancel()

    def busy(self) -> bool:
        return bool(self.active)

    def status(self) -> dict:
        return {
            "cores": self.pool.cores,
            "free_cores": self.pool.free,
            "budget": self.pool.budget,
            "reserved": self.pool.reserved,
            "peak_rss_total": self.peak_rss_total,
            "templates": {str(k): s.pid for k, s in self.templates.items()},
            "sweeps": [a.state() for a in self.active.values()],
        }

    def stop(self, *, kill: bool) -> None:
        for active in self.active.values():
            active.status = "killing" if kill else "stopping"
            active.control.stop(kill=kill)

    async def drain(self) -> None:
        while self.active:
            await anyio.sleep(0.05)
        self._closing.set()

    def cancel(self, sweep_id: int, *, kill: bool, tune: bool = False) -> Done | Refused:
        name = f"{'tune' if tune else 'sweep'} {sweep_id}"
        active = self.active.get(name)
        if active is None:
            stored = "`kbd tune --resume ID` resumes" if tune else "`kbd sweeps` lists"
            return Refused(f"no active {name} in this daemon ({stored} stored ones)")
        active.status = "killing" if kill else "stopping"
        active.control.stop(kill=kill)
        what = "killing its running kernels" if kill else "letting running kernels finish"
        return Done(f"cancelling {name}: starting nothing more, {what}")

    # --- submit and follow ------------------------------------------------------------------

    async def submit(self, request: SubmitRequest, stream, frames) -> None:
        try:
            active = self._prepare(request)
        except InputError as exc:
            await stream.send(protocol.encode(Refused(str(exc), exit_status=2)))
            return
        self.active[active.key] = active
        log.info("%s: %d kernels (%s)", active.name, len(active.prepared.plans), active.command)
        queue = None if request.detach else self._add_follower(active)
        await stream.send(protocol.encode(active.accepted()))
        notes = [active.prepared.note] if active.prepared.note else []
        notes += self._budget_note(active.prepared.options)
        if queue is not None:
            for note in notes:
                await stream.send(protocol.encode(Notice(note)))
        assert self._group is not None
        self._group.start_soon(self._execute, active)
        if queue is not None:
            await self._forward(active, queue, stream, owner=not request.sweep)

    async def submit_tune(self, request: SubmitTune, stream) -> None:
        """Tune in the daemon: its followers get its notices, trials and summary."""
        if request.resume is not None and f"tune {request.resume}" in self.active:
            message = f"tune {request.resume} runs in this daemon: `kbd attach --tune` follows it"
            await stream.send(protocol.encode(Refused(message)))
            return
        try:
            tune = session.begin(
                request.spec,
                self.store_path,
                request.resume,
                Path(request.log_dir) if request.log_dir else None,
                self.store_path.parent / "logs",
                request.command,
            )
        except InputError as exc:
            await stream.send(protocol.encode(Refused(str(exc), exit_status=2)))
            return
        notes = tune.notes + self._budget_note(request.spec.sweep)
        active = Active(
            key=f"tune {tune.tune_id}",
            command=request.command,
            log_dir=tune.log_dir,
            tune=tune,
            finished=[protocol.encode(Notice(text)) for text in notes],
        )
        self.active[active.key] = active
        log.info("%s: %d kernels (%s)", active.name, len(tune.tasks), active.command)
        queue = None if request.detach else self._add_follower(active)
        await stream.send(protocol.encode(active.accepted()))
        assert self._group is not None
        self._group.start_soon(self._execute_tune, active)
        if queue is not None:
            await self._forward(active, queue, stream, owner=False)

    def _budget_note(self, options) -> list[str]:
        if options.mem_budget is None:
            return []
        return [
            "kbd: note: in the daemon, all sweeps share its memory budget "
            f"({format_size(self.pool.budget)}); --mem-budget is not applied"
        ]

    async def follow(self, sweep_id: int | None, stream, *, tune: bool = False) -> None:
        kind = "tune" if tune else "sweep"
        ids = {a.key: a.tune_id if tune else a.sweep_id for a in self.active.values()}
        candidates = [a for a in self.active.values() if ids[a.key] is not None]
        if sweep_id is not None:
            candidates = [a for a in candidates if ids[a.key] == sweep_id]
        if not candidates:
            which = f"{kind} {sweep_id}" if sweep_id is not None else kind
            stored = "`kbd tune --resume` continues" if tune else "`kbd results` shows"
            await stream.send(
                protocol.encode(Refused(f"no active {which} in this daemon ({stored} stored ones)"))
            )
            return
        active = candidates[-1]
        queue = self._add_follower(active)
        await stream.send(protocol.encode(active.accepted()))
        await self._forward(active, queue, stream, owner=False)

    def _add_follower(self, active: Active):
        send, receive = anyio.create_memory_object_stream[bytes](FOLLOWER_QUEUE)
        for frame in active.finished:
            send.send_nowait(frame)
        for kernel, phase in active.running.items():
            send.send_nowait(protocol.encode(KernelStarted(kernel)))
            send.send_nowait(protocol.encode(KernelPhase(kernel, phase)))
        active.followers.add(send)
        return receive

    async def _forward(self, active: Active, queue, stream, *, owner: bool) -> None:
        """Send events until the sweep ends or the client leaves; a run dies with its owner."""
        async with anyio.create_task_group() as group:

            async def watch_client() -> None:
                with contextlib.suppress(Exception):
                    while await stream.receive():
                        pass
                group.cancel_scope.cancel()

            group.start_soon(watch_client)
            async with queue:
                async for frame in queue:
                    await stream.send(frame)
            group.cancel_scope.cancel()
        if owner and active.key in self.active:
            log.info("%s: its client left; cancelling it", active.name)
            active.control.stop(kill=True)

    # --- execution --------------------------------------------------------------------------

    def _prepare(self, request: SubmitRequest) -> Active:
        options = request.spec
        if request.sweep:
            store = Store(self.store_path)
            resumed = store.sweep(request.resume) if request.resume is not None else None
        else:
            store, resumed = None, None
        prepared = prepare.prepare(options, store, resumed, request.command)
        run = None if prepared.sweep_id is not None else next(self._runs)
        key = f"sweep {prepared.sweep_id}" if run is None else f"run {run}"
        if request.log_dir:
            log_dir = Path(request.log_dir)
        else:
            name = f"sweep-{prepared.sweep_id}" if run is None else f"daemon-run-{run}"
            log_dir = self.store_path.parent / "logs" / name
        return Active(key=key, prepared=prepared, command=request.command, log_dir=log_dir)

    async def _execute(self, active: Active) -> None:
        prepared = active.prepared
        options = prepared.options
        store = Store(self.store_path) if prepared.sweep_id is not None else None
        jobs = options.jobs or len(self.pool.cores)
        pool = self.pool
        started = time.monotonic()
        completed = False
        try:
            spawner = await self._template(cores_per_worker(pool.cores, jobs))
            hooks = self._hooks(active, store)
            completed = await _execute_in(spawner, active, pool, jobs, hooks)
        except Exception as exc:
            try:
                error = fatal_error(exc)
            except BaseException:
                log.exception("%s failed", active.name)
                error = exc
            active.broadcast(Notice(f"kbd: error: {error}"))
        finally:
            status = "done" if completed else "interrupted"
            if store is not None:
                store.set_status(prepared.sweep_id, status)
            wall = time.monotonic() - started
            log.info("%s: %s after %.1fs", active.name, status, wall)
            active.broadcast(SweepEnded(status=status, wall_s=wall, completed=completed))
            self._close(active)

    async def _execute_tune(self, active: Active) -> None:
        tune = active.tune
        options = tune.options.sweep
        jobs = options.jobs or len(self.pool.cores)
        started = time.monotonic()
        completed, error = False, None

        def replayed(message: msgspec.Struct) -> None:
            active.finished.append(active.broadcast(message))

        report = session.Report(notice=lambda text: replayed(Notice(text)), trial=replayed)
        try:
            spawner = await self._template(cores_per_worker(self.pool.cores, jobs))
            runner = session.Here(
                spawner,
                self.pool,
                jobs,
                options.timeout,
                tune.log_dir,
                active.control,
                watch=self._hooks(active, None, records=False),
            )
            completed = await session.tune(tune, runner, report)
        except Exception as exc:
            try:
                error = fatal_error(exc)
            except BaseException:
                log.exception("%s failed", active.name)
                error = repr(exc)
        finally:
            ended = session.finish(tune, completed, error)
            log.info("%s: %s after %.1fs", active.name, ended.status, time.monotonic() - started)
            active.broadcast(ended)
            self._close(active)

    def _close(self, active: Active) -> None:
        """After its last event: end the followers' streams and forget `active`."""
        for follower in active.followers:
            follower.close()
        self.active.pop(active.key, None)
        for key in [k for k in self._rss if k[0] == active.key]:
            del self._rss[key]

    def _hooks(self, active: Active, store: Store | None, *, records: bool = True) -> Hooks:
        """Hooks that keep `active`'s running kernels and their memory (`kbd daemon status`,
        a new follower's replay) and broadcast its events; with `records`, a finished record
        is also stored (a sweep) and replayed to later followers. A tune's candidates need no
        records here: the tune stores and reports them as trials."""

        def started(kernel: str) -> None:
            active.running[kernel] = START_PHASE
            active.broadcast(KernelStarted(kernel))

        def phase(kernel: str, name: str) -> None:
            active.running[kernel] = name
            active.broadcast(KernelPhase(kernel, name))

        def memory(kernel: str, rss: int) -> None:
            self._rss[(active.key, kernel)] = rss
            self.peak_rss_total = max(self.peak_rss_total, sum(self._rss.values()))
            active.broadcast(KernelMemory(kernel, rss))

        def finished(record: Record) -> None:
            active.running.pop(record.label, None)
            self._rss.pop((active.key, record.label), None)
            if not records:
                return
            if store is not None:
                store.add_attempt(active.sweep_id, active.prepared.hashes[record.key], record)
            active.finished.append(active.broadcast(KernelFinished(record)))

        def notice(text: str) -> None:
            active.broadcast(Notice(text))

        return Hooks(started=started, phase=phase, memory=memory, finished=finished, notice=notice)

    async def _warm_default(self) -> None:
        """Warm the template `kbd run` and `kbd sweep` use without -j (one core per worker)."""
        try:
            await self._template(cores_per_worker(self.pool.cores, len(self.pool.cores)))
        except Exception as exc:
            log.warning("could not warm a template: %s", exc)

    async def _template(self, threads: int) -> Spawner:
        """The warm template for workers of `threads` cores, started on first use."""
        lock = self._template_locks.setdefault(threads, anyio.Lock())
        async with lock:
            spawner = self.templates.get(threads)
            if spawner is not None and spawner.dead is None:
                return spawner
            assert self._group is not None
            spawner = await self._group.start(self._keep_template, threads)
            self.templates[threads] = spawner
            return spawner

    async def _keep_template(self, threads: int, *, task_status) -> None:
        env = template_env(threads)
        log_path = self.store_path.parent / "logs" / f"daemon-template-{threads}.log"
        log.info("starting a template for %d-core workers", threads)
        try:
            async with Spawner.started(env, log_path) as spawner:
                task_status.started(spawner)
                while spawner.dead is None:
                    await anyio.sleep(1)
                log.warning("template for %d-core workers died: %s", threads, spawner.dead)
        finally:
            if self.templates.get(threads) is not None and self.templates[threads].dead:
                del self.templates[threads]


async def _execute_in(spawner, active: Active, pool: Pool, jobs: int, hooks: Hooks) -> bool:
    return await scheduler.execute(
        spawner,
        active.prepared.plans,
        pool=pool,
        jobs=jobs,
        timeout=active.prepared.options.timeout,
        log_dir=active.log_dir,
        hooks=hooks,
        control=active.control,
    )
