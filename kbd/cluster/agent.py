"""The kbd agent of one node: a Ray actor (async) that runs kernels the way a local sweep does.

The head creates one per node, pinned there, and calls `hello`, `start`, then `run` up to
`slots` times at once, then `stop`. The agent owns the node's warm template
(kbd.engine.spawner), its core slots and memory admission (kbd.engine.scheduler) and runs each
kernel with kbd.engine.runner, so every sandboxing rule of a local sweep holds on the node.

Traps this module avoids (see the README's cluster section):
- The template is fork+exec'd from the actor's event-loop thread, which lives as long as the
  actor: PR_SET_PDEATHSIG fires when the *thread* that forked dies, so the template (and through
  it every worker) dies with the agent. The agent itself never forks without exec.
- Ray forces OMP_NUM_THREADS on its workers; the template gets kbd's own thread variables.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import ray

import kbd
from kbd.caches import compile_cache
from kbd.cluster import wire
from kbd.cluster.wire import Dispatch, Finished, NodeInfo
from kbd.engine import scheduler
from kbd.engine.scheduler import Hooks, Planned
from kbd.engine.spawner import Spawner, template_env
from kbd.plan import limits, target
from kbd.shared import identity
from kbd.shared.protocol import START_PHASE, Phase


class Agent:
    """One node's kbd: template, slots, memory admission. Methods are called by kbd.cluster.head."""

    def __init__(self, cpus: int, jobs: int | None, mem_budget: int | None, log_dir: str):
        node_id = ray.get_runtime_context().get_node_id()
        self.node = f"{socket.gethostname()}/{node_id[:8]}"
        cores = limits.usable_cores()[: max(1, cpus)]  # as many as the node offers Ray
        self.slots = scheduler.core_slots(cores, jobs or len(cores))
        self.cores = tuple(cores)
        self.budget = mem_budget or limits.default_budget()
        self.log_dir = Path(log_dir)
        self._free = list(self.slots)
        self._spawner: Spawner | None = None
        self._memory: scheduler.Memory | None = None
        self._stopping: asyncio.Event | None = None
        self._serving: asyncio.Task | None = None

    async def hello(self) -> bytes:
        """The node's resources, identity and Ray settings (the head decides whether to use it)."""
        return wire.encode(
            NodeInfo(
                node=self.node,
                cores=self.cores,
                slots=len(self.slots),
                budget=self.budget,
                identity=identity.current(),
                memory_monitor=os.environ.get("RAY_memory_monitor_refresh_ms") != "0",  # noqa: SIM112
                niceness=os.nice(0),
                machine=target.this_machine(),
                threads=len(self.slots[0]),
            )
        )

    async def start(self) -> None:
        """Start the warm template (from this event-loop thread) and wait until it is ready."""
        self._memory = scheduler.Memory(self.budget)
        self._stopping = asyncio.Event()
        ready = asyncio.get_running_loop().create_future()
        self._serving = asyncio.create_task(self._serve(ready))
        await ready

    async def _serve(self, ready: asyncio.Future) -> None:
        # The template runs the very kbd this agent imported (the one whose hash the head checked),
        # whatever Ray added to this process's sys.path.
        kbd_root = str(Path(kbd.__file__).resolve().parent.parent)
        env = template_env(
            len(self.slots[0]),
            PYTHONPATH=os.pathsep.join(filter(None, [kbd_root, os.environ.get("PYTHONPATH")])),
            KBD_NODE=self.node,  # where a kernel runs, for its log
        )
        log = self.log_dir / f"template-{self.node.replace('/', '-')}.log"
        try:
            async with Spawner.started(env, log) as spawner:
                self._spawner = spawner
                ready.set_result(None)
                await self._stopping.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise
        finally:
            self._spawner = None

    async def run(self, dispatch: bytes) -> AsyncIterator[bytes]:
        """Run one kernel: stream Phase events (the first one at once), then its Finished record."""
        task = wire.decode(dispatch, Dispatch)
        yield wire.encode(Phase(START_PHASE))
        job = task.job
        if job.compile_cache is not None:  # compiled for this node's CPU: keyed by it
            cache = job.compile_cache
            job = compile_cache.attach(job, Path(cache.directory), cache.max_bytes)
        plan = Planned(entry=task.entry, job=job, memory=task.memory, expected_s=0.0)
        reason = scheduler.too_big(plan, self.budget)
        if reason is not None:
            yield wire.encode(Finished(self._mark(scheduler.skipped(plan, reason))))
            return
        events: asyncio.Queue = asyncio.Queue()
        running = asyncio.create_task(self._run(plan, task.timeout, events.put_nowait))
        try:
            while True:
                event = await events.get()
                if isinstance(event, BaseException):
                    raise event  # the template died: the head treats this agent as lost
                yield wire.encode(event)
                if isinstance(event, Finished):
                    return
        finally:
            if not running.done():
                running.cancel()  # the head gave up on it: kill and reap the worker

    async def _run(self, plan: Planned, timeout: float, emit) -> None:
        held = plan.memory
        await self._memory.acquire(held)
        cores = self._free.pop(0)  # the head never sends more than `slots` kernels at once
        try:
            if self._spawner is None:
                raise RuntimeError("kbd agent: run before start, or after its template ended")
            hooks = Hooks(phase=lambda kernel, phase: emit(Phase(phase)))
            if scheduler.needs_sizing(plan):  # at its problem's own shapes: as a local sweep
                sized = await scheduler.size_plan(
                    self._spawner, plan, cores, timeout=timeout, log_dir=self.log_dir, hooks=hooks
                )
                if isinstance(sized, Planned):
                    reason = scheduler.too_big(sized, self.budget)
                    if reason is not None:
                        sized = scheduler.skipped(sized, reason)
                if not isinstance(sized, Planned):
                    emit(Finished(self._mark(sized)))
                    return
                plan = sized
                self._memory.release(held)  # admitted again at the size it has
                held = 0
                await self._memory.acquire(plan.memory)
                held = plan.memory
            record = await scheduler.run_plan(
                self._spawner, plan, cores, timeout=timeout, log_dir=self.log_dir, hooks=hooks
            )
            emit(Finished(self._mark(record)))
        except BaseException as exc:
            emit(exc)
            raise
        finally:
            self._free.append(cores)
            self._memory.release(held)

    async def stop(self) -> None:
        """Stop the template (it kills every worker) and wait for it."""
        if self._stopping is not None:
            self._stopping.set()
        if self._serving is not None:
            await asyncio.gather(self._serving, return_exceptions=True)

    def _mark(self, record):
        return msgspec.structs.replace(record, node=self.node)
