"""`kbd tune --cluster ADDRESS`: each tuning task on one node, several nodes at once.

The `kbd tune` process is the head (kbd.cluster.head's agents, one per node). Each node takes
the next kernel to tune and runs its whole task there, its search and its confirmation, `slots`
candidates at a time, so that every timing of a task compares within one node. The task is
planned for that node only (the head's session holds `Pending` kernels; the node plans with
kbd.tune.session.task_for, its `Machine` and threads): its schedule is the one for the node's
CPU features and its key names the node's CPU, so what it adopts applies there and on machines
like it, and a kernel the head's CPU has no schedule for is still tuned where one exists.
Trials and adopted configurations go to the head's store as each ends, through the same session
as a local tune.

A lost agent: the task's finished trials stay; candidates in flight there have no trial (one in
flight during MAX_LOSSES losses becomes a `crash` trial, never run again), and the task goes
back to the queue for another node. There its key is computed again: on a node of the same CPU
and threads it is the same and the task continues where it was; on another CPU it is another
task, which starts afresh (the node's notice says so; the first node's trials stay stored under
its key). With every agent lost, the tune ends `interrupted`, and `kbd tune --resume` continues
it (on the cluster, or here with `--cluster local`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path

import anyio

from kbd.cluster import head
from kbd.engine import prepare, scheduler
from kbd.engine.scheduler import Hooks, Planned
from kbd.shared.errors import ClusterError
from kbd.tune import session as tuning
from kbd.tune.session import Report, Session

IDLE_POLL_S = 0.2  # how often a node with nothing queued looks for a task another node lost


class NodeLost(Exception):
    """The agent running a task was lost: the task goes to another node."""


def execute(session: Session, report: Report) -> bool:
    """Tune every task of `session` on the cluster; False when interrupted (Ctrl-C). Raises
    ClusterError when the cluster cannot be reached or every agent is lost."""
    log_dir = session.log_dir.resolve()
    return head.connected(session.options.sweep.cluster, _execute, session, report, log_dir)


async def _execute(session: Session, report: Report, log_dir: Path) -> bool:
    hooks = Hooks(notice=report.notice)
    queue = deque(range(len(session.tasks)))
    stopping = anyio.Event()
    losses: dict[str, int] = {}  # candidate (task key hash and pipeline) -> agent losses
    keys: dict[int, str] = {}  # task index -> its key hash on the node that last took it
    in_flight: set[int] = set()  # task indices being tuned on some node
    options = session.options.sweep
    async with head.agents(options, log_dir, hooks) as nodes, anyio.create_task_group() as group:
        group.start_soon(scheduler.watch_interrupts, stopping, group.cancel_scope, hooks)
        async with anyio.create_task_group() as feeders:
            for node in nodes:
                feeders.start_soon(
                    _feed, node, session, report, queue, stopping, losses, keys, in_flight
                )
        group.cancel_scope.cancel()
    if stopping.is_set():
        return False
    if queue:
        raise ClusterError(
            f"every kbd agent was lost; {len(queue)} kernels were not tuned to the end (the "
            f"tune is resumable, also with --cluster local)"
        )
    return True


async def _feed(
    node: head.Node, session, report, queue, stopping, losses, keys, in_flight: set[int]
) -> None:
    """One node: take the next task, tune it there, until none is left (none queued and none in
    flight on another node, which could come back) or the node is lost."""
    where = node.info.node
    chooser = prepare.chooser_for(
        tuning.candidates_spec(session.options), None, node.info.machine, node.info.threads
    )
    while node.alive and not stopping.is_set():
        if not queue:
            if not in_flight:
                return
            # another node's task may come back (its agent lost): wait for it or for the end
            await anyio.sleep(IDLE_POLL_S)
            continue
        index = queue.popleft()
        in_flight.add(index)
        try:
            tuned = await _tune_on(
                node, where, chooser, index, session, report, queue, stopping, losses, keys
            )
            if not tuned:
                return
        finally:
            in_flight.discard(index)


async def _tune_on(
    node, where, chooser, index, session, report, queue, stopping, losses, keys
) -> bool:
    """Tune task `index` on `node`; False when stopped or the node was lost (the task back at
    the queue's front)."""
    task = tuning.task_for(session.options, session.tasks[index].planned, chooser)
    name = session.tasks[index].entry.name
    if isinstance(task, str):
        session.tasks[index].note = f"not tuned on {where}: {task}"
        report.notice(f"kbd tune: {name}: {task} on {where}; not tuned")
        return True
    before = keys.get(index)
    if before is not None and before != task.key.hash():
        report.notice(
            f"kbd tune: {name}: {where} differs from the node that began it (CPU, features "
            "or threads): its trials there stay stored, and it starts afresh on this one"
        )
    keys[index] = task.key.hash()
    tuning.load_trials(session, task)
    session.tasks[index] = task
    report.notice(f"kbd tune: {name}: tuning on {where} ({task.key.cpu})")
    runner = NodeRunner(node, session.options.sweep.timeout, stopping, losses, task.key.hash())
    try:
        return await tuning.tune_task(session, task, runner, report)  # False: stopped
    except NodeLost:
        queue.appendleft(index)
        return False


@dataclass
class NodeRunner:
    """A task's candidates on one node, as many at once as it has slots."""

    node: head.Node
    timeout: float
    stopping: anyio.Event
    losses: dict[str, int]
    task: str  # the task's key hash

    @property
    def jobs(self) -> int:
        return self.node.info.slots

    async def run(self, plans: list[Planned], hooks: Hooks) -> bool:
        """Run `plans` there; False when stopped first; NodeLost when the agent was lost (the
        records of those that ended before are in; those in flight have none)."""
        pending = list(plans)
        lost: list[tuple[Planned, head.Lost]] = []

        async def slot() -> None:
            while pending and self.node.alive and not self.stopping.is_set():
                plan = pending.pop(0)
                outcome = await head.run_on(self.node, plan, self.timeout, hooks)
                if isinstance(outcome, head.Lost):
                    lost.append((plan, outcome))
                    return
                hooks.finished(outcome)

        async with anyio.create_task_group() as group:
            for _ in range(self.jobs):
                group.start_soon(slot)
        if lost:
            for plan, outcome in lost:
                if not outcome.accepted:
                    continue  # never reached the agent: not an attempt
                key = f"{self.task} {plan.job.pipeline}"
                self.losses[key] = self.losses.get(key, 0) + 1
                if self.losses[key] >= head.MAX_LOSSES:
                    count = self.losses[key]
                    hooks.finished(
                        head.crash(plan, self.node, outcome.phase, count, outcome.wall_s)
                    )
            raise NodeLost(self.node.info.node)
        return not pending
