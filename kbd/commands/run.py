"""`kbd run` and `kbd sweep`: run the selected kernels here, in the daemon or on a cluster.

Planning is kbd.engine.prepare's, printing kbd.views.reports'. The scheduler, the template's
spawner and anyio are imported where a command runs in this process: a command a daemon serves
never loads them (client start-up is part of every `kbd run`, and the daemon already has them).
"""

from __future__ import annotations

import contextlib
import shlex
import sys
import time
from pathlib import Path

import msgspec

from kbd import cluster
from kbd.plan import limits, spec
from kbd.plan.invocation import Invocation
from kbd.plan.paths import check_output
from kbd.plan.spec import SweepSpec
from kbd.results.record import Record
from kbd.results.store import Store, Sweep
from kbd.shared.errors import ClusterError, InputError, TemplateError, fatal_error
from kbd.views import reports
from kbd.views.progress import Progress


def options_of(
    invocation: Invocation, args_spec: SweepSpec | None, store: Store | None
) -> tuple[SweepSpec, Sweep | None]:
    """The spec to run: the command line's (`args_spec`), or the stored one of the sweep to
    resume."""
    if store is not None and invocation.resume:
        resumed = store.sweep(None if invocation.resume == "latest" else _sweep_id(invocation))
        options = spec.decode(resumed.options, f"{store.path}: sweep {resumed.id}")
        if invocation.cluster:  # where to finish it may change; what to run may not
            options = msgspec.structs.replace(
                options, cluster=spec.parse_cluster(invocation.cluster)
            )
        return options, resumed
    assert args_spec is not None
    return args_spec, None


def run_or_sweep(invocation: Invocation, args_spec: SweepSpec | None) -> int:
    """Run or sweep as the invocation says; `args_spec` is the command line's spec (None when
    it resumes a stored sweep)."""
    check_output(invocation.junit, "--junit")  # before anything runs or is stored
    check_output(invocation.log_dir, "--log-dir", folder=True)
    store = Store(invocation.store_path) if invocation.sweep else None
    options, resumed = options_of(invocation, args_spec, store)
    if options.cluster is not None:
        cluster.require_ray()
    if invocation.detach and (invocation.daemon == "no" or options.cluster is not None):
        raise InputError("--detach runs the sweep in the daemon; not with --no-daemon or --cluster")
    if options.cluster is None and (invocation.daemon != "no" or invocation.detach):
        from kbd.daemon import submit

        status = submit.run_or_sweep(invocation, options, resumed)
        if status is not None:
            return status  # the daemon ran it
    return _run_here(invocation, options, store, resumed)


def _run_here(
    invocation: Invocation, options: SweepSpec, store: Store | None, resumed: Sweep | None
) -> int:
    """Run in this process, with a template of its own (or on a cluster)."""
    import anyio

    from kbd.engine import prepare, scheduler, spawner
    from kbd.engine.scheduler import Hooks

    prepared = prepare.prepare(options, store, resumed, shlex.join(["kbd", *sys.argv[1:]]))
    if prepared.note:
        print(prepared.note, file=sys.stderr)
    plans, hashes, sweep_id = prepared.plans, prepared.hashes, prepared.sweep_id
    log_dir = Path(invocation.log_dir) if invocation.log_dir else _default_log_dir(sweep_id)

    progress = Progress(total=len(plans), live=sys.stderr.isatty() and not invocation.json)
    records: list[Record] = []

    def finished(record: Record) -> None:
        records.append(record)
        if store is not None:
            store.add_attempt(sweep_id, hashes[record.key], record)
        reports.show(invocation, progress, record)

    def lost(record: Record) -> None:  # a cluster node was lost: not a verdict, runs again
        store.add_attempt(sweep_id, hashes[record.key], record)
        progress.running.pop(record.label, None)
        progress.notice(reports.line(record))

    hooks = Hooks(
        started=progress.started,
        phase=progress.phase,
        memory=progress.memory,
        finished=finished,
        lost=lost,
        notice=progress.notice,
    )
    started = time.monotonic()
    try:
        if options.cluster is None:
            pool = scheduler.Pool(
                limits.usable_cores(), options.mem_budget or limits.default_budget()
            )
            jobs = options.jobs or len(pool.cores)
            env = spawner.template_env(scheduler.cores_per_worker(pool.cores, jobs))
            completed = anyio.run(
                _execute, env, log_dir, plans, pool, jobs, options.timeout, hooks, progress
            )
        else:
            from kbd.cluster import head  # imports ray

            losses = store.count_attempts(sweep_id, "lost")
            completed = head.execute(options, plans, log_dir, hooks, progress, losses)
    except (TemplateError, ClusterError, BaseExceptionGroup) as exc:
        progress.close()
        print(f"kbd: error: {fatal_error(exc)}", file=sys.stderr)
        if store is not None:
            store.set_status(sweep_id, "interrupted")
        return 1
    progress.close()
    wall = time.monotonic() - started
    if store is not None:
        store.set_status(sweep_id, "done" if completed else "interrupted")
        records = store.records(sweep_id)
    return reports.report(invocation, records, wall, completed, sweep_id)


async def _execute(env, log_dir, plans, pool, jobs, timeout, hooks, progress) -> bool:
    import anyio

    from kbd.engine import scheduler
    from kbd.engine.spawner import Spawner

    # A command with nothing to start (a finished sweep resumed, every kernel too big for its
    # memory limit or the budget) records what it must without paying for a template (seconds
    # of torch import).
    starts = any(scheduler.too_big(plan, pool.budget) is None for plan in plans)
    async with contextlib.AsyncExitStack() as stack:
        spawner = None
        if starts:
            spawner = await stack.enter_async_context(
                Spawner.started(env, log_dir / "template.log")
            )
        group = await stack.enter_async_context(anyio.create_task_group())
        if progress.live:
            group.start_soon(_tick, progress)
        completed = await scheduler.execute(
            spawner,
            plans,
            pool=pool,
            jobs=jobs,
            timeout=timeout,
            log_dir=log_dir,
            hooks=hooks,
        )
        group.cancel_scope.cancel()
        return completed


async def _tick(progress: Progress) -> None:
    """Redraw the live display so elapsed times and memory keep moving."""
    import anyio

    while True:
        await anyio.sleep(0.5)
        progress.render()


def _sweep_id(invocation: Invocation) -> int:
    try:
        return int(invocation.resume)
    except ValueError:
        raise InputError(f"--resume {invocation.resume!r}: a sweep id is a number") from None


def _default_log_dir(sweep_id: int | None) -> Path:
    name = f"sweep-{sweep_id}" if sweep_id is not None else time.strftime("run-%Y%m%d-%H%M%S")
    return Path(".kbd") / "logs" / name
