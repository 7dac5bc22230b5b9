"""The head of a cluster sweep: start one agent per node, dispatch kernels, handle lost agents.

`connected`, `agents`, `run_on` and `crash` are what kbd.cluster.tuning (`kbd tune --cluster`)
shares with sweeps: a connection to Ray, the agents of its nodes, one job run on one node.

Runs in the `kbd sweep` process (the Ray driver); it never imports torch. Records come back from
the agents and go through the same hooks as a local sweep's, so the store, `kbd results`,
`--resume`, JUnit and JSON work unchanged.

kbd is the only retry authority: agents are created with max_restarts=0 and max_task_retries=0,
so Ray never reruns anything. A kernel in flight on an agent that is lost (its process died, its
node went away) gets a `lost` attempt and goes back to the queue for another agent; one that
was in flight during MAX_LOSSES losses ends as `crash` and is never dispatched again. Losses are
counted from the store, so the rule holds across `--resume`.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import msgspec
import ray
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from kbd.cluster import wire
from kbd.cluster.agent import Agent
from kbd.cluster.wire import Dispatch, Finished, NodeInfo
from kbd.engine import scheduler
from kbd.engine.scheduler import Hooks, Planned
from kbd.plan.limits import format_size
from kbd.plan.spec import SweepSpec
from kbd.results.record import Record, expect
from kbd.shared import identity
from kbd.shared.errors import ClusterError
from kbd.shared.protocol import START_PHASE, Phase
from kbd.views.progress import Progress

MAX_LOSSES = 2  # agent losses a kernel may be in flight for; then it is a crash
STOP_GRACE_S = 10.0
CONNECT_TIMEOUT_S = 5.0


@dataclass
class Node:
    """One accepted agent."""

    actor: ray.actor.ActorHandle
    info: NodeInfo
    alive: bool = True


@dataclass
class Lost:
    """A job whose agent was lost while it ran (the agent is marked dead and killed)."""

    accepted: bool  # the agent had started it (else it never reached the agent: no attempt)
    phase: str  # the last phase the head heard of
    wall_s: float
    error: str


@dataclass
class _Queue:
    """Kernels waiting for a slot on any node; lost kernels go back to the front."""

    plans: deque[Planned]
    in_flight: int = 0
    changed: anyio.Event = field(default_factory=anyio.Event)

    def notify(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


def execute(
    options: SweepSpec,
    plans: list[Planned],
    log_dir: Path,
    hooks: Hooks,
    progress: Progress,
    losses: dict[str, int],
) -> bool:
    """Run `plans` on the cluster; returns False when the user interrupted.

    `losses`: kernel -> lost attempts already stored for this sweep. Raises ClusterError when
    the cluster cannot be reached, has no usable node, or loses every agent.
    """
    return connected(
        options.cluster, _execute, options, plans, log_dir.resolve(), hooks, progress, losses
    )


def connected(address: str, main, *args):
    """`anyio.run(main, *args)` connected to the Ray cluster at `address` (ClusterError when
    it cannot be reached); disconnected after."""
    _connect(address)
    try:
        return anyio.run(main, *args)
    finally:
        ray.shutdown()


def _connect(address: str) -> None:
    _check_reachable(address)
    try:
        ray.init(
            address=address,
            namespace="kbd",
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    except Exception as exc:  # ray raises ConnectionError, RuntimeError, ValueError, ...
        raise ClusterError(
            f"--cluster {address}: cannot connect to the Ray cluster: {_first_line(exc)}"
        ) from None


def _check_reachable(address: str) -> None:
    """Fail at once when nothing listens at HOST:PORT (ray.init would retry for minutes)."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return  # "auto" and ray:// addresses: ray.init itself fails fast
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ClusterError(
            f"--cluster {address}: cannot connect to the Ray cluster: nothing answers there "
            f"({exc.strerror or exc}); start its head with `ray start --head --port {port}`"
        ) from None


@contextlib.asynccontextmanager
async def agents(options: SweepSpec, log_dir: Path, hooks: Hooks) -> AsyncIterator[list[Node]]:
    """The agents of the cluster's usable nodes, started; stopped at the end, whatever
    happens."""
    nodes = await _start_agents(options, log_dir, hooks)
    try:
        yield nodes
    finally:
        with anyio.CancelScope(shield=True):
            await _stop_agents(nodes)


async def _execute(options, plans, log_dir, hooks, progress, losses) -> bool:
    queue = _Queue(deque(plans))
    stopping = anyio.Event()
    lost = dict(losses)
    async with agents(options, log_dir, hooks) as nodes, anyio.create_task_group() as group:
        group.start_soon(scheduler.watch_interrupts, stopping, group.cancel_scope, hooks)
        if progress.live:
            group.start_soon(_tick, progress)
        async with anyio.create_task_group() as feeders:
            for node in nodes:
                for _ in range(node.info.slots):
                    feeders.start_soon(_feed, node, queue, stopping, lost, options, hooks)
        group.cancel_scope.cancel()
    if stopping.is_set():
        return False
    if queue.plans:
        raise ClusterError(
            f"every kbd agent was lost; {len(queue.plans)} kernels did not run "
            "(the sweep is resumable, also with --cluster local)"
        )
    return True


async def _start_agents(options: SweepSpec, log_dir: Path, hooks: Hooks) -> list[Node]:
    """One agent per alive node with CPUs; refuse those whose identity or settings differ."""
    candidates = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) >= 1]
    if not candidates:
        raise ClusterError(f"--cluster {options.cluster}: no alive node offers CPUs to Ray")
    remote = ray.remote(Agent)
    ours = identity.current()
    nodes: list[Node] = []
    refused: list[str] = []

    async def start(node: dict) -> None:
        cpus = int(node["Resources"]["CPU"])
        where = f"node {node['NodeManagerAddress']}/{node['NodeID'][:8]}"
        actor = remote.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
            num_cpus=cpus,  # the agent reserves the node: Ray places nothing else there
            max_restarts=0,  # kbd, not Ray, decides what runs again
            max_task_retries=0,
            max_concurrency=1000,
        ).remote(cpus, options.jobs, options.mem_budget, str(log_dir))
        try:
            hello = await actor.hello.remote()
            try:
                info = wire.decode(hello, NodeInfo)
            except msgspec.DecodeError as exc:  # another kbd, whose hello is another message
                refused.append(f"{where}: refused: other kbd code ({exc})")
                ray.kill(actor)
                return
            problems = identity.differences(
                info.identity, ours, "{tool} {theirs} there, {ours} here", across_machines=True
            )
            if info.memory_monitor:
                problems.append(
                    "Ray's memory monitor is on there and could kill kbd in place of kbd's own "
                    "limits (start the node with RAY_memory_monitor_refresh_ms=0)"
                )
            if problems:
                refused.append(f"{where}: refused: {'; '.join(problems)}")
                ray.kill(actor)
                return
            await actor.start.remote()
        except RayError as exc:
            refused.append(f"{where}: no kbd agent: {_first_line(exc)}")
            with contextlib.suppress(Exception):
                ray.kill(actor)
            return
        nodes.append(Node(actor=actor, info=info))

    async with anyio.create_task_group() as group:
        for node in candidates:
            group.start_soon(start, node)
    for line in refused:
        hooks.notice(f"kbd: cluster: {line}")
    if not nodes:
        raise ClusterError(f"--cluster {options.cluster}: no usable node ({len(refused)} refused)")
    nodes.sort(key=lambda n: n.info.node)
    described = ", ".join(
        f"{n.info.node} ({len(n.info.cores)} cores, {n.info.slots} at once, "
        f"budget {format_size(n.info.budget)})"
        for n in nodes
    )
    hooks.notice(f"kbd: cluster: {len(nodes)} nodes: {described}")
    niced = [n.info.node for n in nodes if n.info.niceness > 0]
    if niced:
        hooks.notice(
            f"kbd: cluster: kernels run at a raised niceness on {', '.join(niced)} "
            "(start nodes with RAY_worker_niceness=0 for comparable timings)"
        )
    return nodes


async def _feed(node: Node, queue: _Queue, stopping, lost, options, hooks) -> None:
    """One slot of one node: take the next kernel, run it there, until nothing is left."""
    while node.alive and not stopping.is_set():
        if not queue.plans:
            if queue.in_flight == 0:
                return
            with anyio.move_on_after(0.5):  # a kernel in flight may come back (lost)
                await queue.changed.wait()
            continue
        plan = queue.plans.popleft()
        queue.in_flight += 1
        try:
            await _run_on(node, plan, queue, lost, options, hooks)
        finally:
            queue.in_flight -= 1
            queue.notify()


async def run_on(node: Node, plan: Planned, timeout: float, hooks: Hooks) -> Record | Lost:
    """Run one job on `node`: its record, or Lost when the node's agent was lost meanwhile."""
    name = plan.label
    dispatch = Dispatch(entry=plan.entry, job=plan.job, memory=plan.memory, timeout=timeout)
    accepted, phase, started = False, START_PHASE, time.monotonic()
    hooks.started(name)
    try:
        async for ref in node.actor.run.remote(wire.encode(dispatch)):
            event = wire.decode(await ref, wire.AgentEvent)
            if isinstance(event, Phase):
                accepted, phase = True, event.name
                hooks.phase(name, phase)
            elif isinstance(event, Finished):
                return event.record
        raise RuntimeError("the agent ended the run without a record")
    except (RayError, RuntimeError) as exc:
        _lose(node, exc, hooks)
        wall = round(time.monotonic() - started, 3)
        return Lost(accepted=accepted, phase=phase, wall_s=wall, error=_first_line(exc))


async def _run_on(node: Node, plan: Planned, queue: _Queue, lost, options, hooks) -> None:
    name = plan.label
    outcome = await run_on(node, plan, options.timeout, hooks)
    if isinstance(outcome, Record):
        hooks.finished(outcome)
        return
    if not outcome.accepted:  # never reached the agent: not an attempt
        queue.plans.appendleft(plan)
        return
    lost[name] = lost.get(name, 0) + 1
    wall, phase = outcome.wall_s, outcome.phase
    if lost[name] >= MAX_LOSSES:
        hooks.finished(crash(plan, node, phase, lost[name], wall))
        return
    message = (
        f"the kbd agent on {node.info.node} was lost while running it ({outcome.error}); "
        "running it again on another node"
    )
    hooks.lost(
        scheduler.plan_record(plan, "lost", phase, message, wall_s=wall, node=node.info.node)
    )
    queue.plans.appendleft(plan)


def _lose(node: Node, exc: BaseException, hooks: Hooks) -> None:
    """Stop using an agent; kill it, so that nothing of it keeps running a requeued kernel."""
    if not node.alive:
        return
    node.alive = False
    hooks.notice(f"kbd: cluster: lost the kbd agent on {node.info.node}: {_first_line(exc)}")
    with contextlib.suppress(Exception):
        ray.kill(node.actor, no_restart=True)


def crash(plan: Planned, node: Node, phase: str, count: int, wall: float) -> Record:
    """The final record of a job in flight during `count` agent losses (MAX_LOSSES)."""
    message = (
        f"node agent died {count} times while running it (last on {node.info.node}); not retried"
    )
    outcome, note = expect("crash", phase, message, plan.entry.expectation)
    return scheduler.plan_record(
        plan,
        outcome,
        phase,
        f"{message} [{note}]" if note else message,
        wall_s=wall,
        expected=str(plan.entry.expectation) if plan.entry.expectation else None,
        node=node.info.node,
    )


async def _stop_agents(nodes: list[Node]) -> None:
    for node in nodes:
        if node.alive:
            with anyio.move_on_after(STOP_GRACE_S), contextlib.suppress(RayError):
                await node.actor.stop.remote()
        with contextlib.suppress(Exception):
            ray.kill(node.actor, no_restart=True)


async def _tick(progress: Progress) -> None:
    while True:
        await anyio.sleep(0.5)
        progress.render()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
