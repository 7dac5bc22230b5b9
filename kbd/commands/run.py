"""`kbd run` and `kbd sweep`: plan the selected kernels, run them, report and store results.

The scheduler, the template's spawner and anyio are imported where a command runs in this
process: a command a daemon serves never loads them (client start-up is part of every
`kbd run`, and the daemon already has them).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import sys
import time
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from kbd import cluster
from kbd.plan import catalog, descriptor, limits, pipelines, spec
from kbd.plan.catalog import Entry
from kbd.plan.spec import SweepSpec
from kbd.results.record import Record, label
from kbd.results.store import Store, Sweep
from kbd.shared.errors import ClusterError, InputError
from kbd.shared.outcomes import is_final
from kbd.shared.paths import check_output
from kbd.shared.protocol import Inspect, Job, Limits
from kbd.views import reports
from kbd.views.progress import Progress

if TYPE_CHECKING:
    from kbd.engine.scheduler import Planned

SCHEDULES_DIR = catalog.REPO_ROOT / "schedules"
SECONDS_PER_GFLOP = 2.0  # scalar-loop code; only used to order kernels never run before


@dataclass
class Prepared:
    """A run or sweep ready to execute: what is left to run and where its records go."""

    options: SweepSpec
    plans: list[Planned]  # still to run, in order
    kernels: list[str]  # every selected kernel, in run order
    sweep_id: int | None  # None: a `kbd run` (nothing stored)
    hashes: dict[str, str]  # kernel -> configuration hash, stored with its attempt
    note: str | None = None  # what the user should know first, e.g. how much a resume runs


def prepare(options: SweepSpec, store: Store | None, resumed: Sweep | None, command: str):
    """Plan a run (store None) or a sweep: create its row, or pick up where `resumed` ended."""
    plans = _plan(options, store)
    if options.shard is not None:
        plans = [p for p in plans if options.shard.contains(p.entry.name)]
    kernels = list(dict.fromkeys(p.entry.name for p in plans))
    note = None
    sweep_id = None
    if resumed is not None:
        finished = {r.key for r in store.records(resumed.id) if is_final(r.outcome)}
        plans = [p for p in plans if (p.entry.name, p.job.mode) not in finished]
        sweep_id = resumed.id
        store.set_status(sweep_id, "running")
        note = f"kbd: resuming sweep {sweep_id}: {len(plans)} of {len(kernels)} kernels left"
    elif store is not None:
        sweep_id = store.create_sweep(
            command, spec.encode(options), kernels, _hash([p.job for p in plans])
        )
    hashes = {(p.entry.name, p.job.mode): _hash(p.job) for p in plans}
    return Prepared(options, plans, kernels, sweep_id, hashes, note)


def options_of(args: Namespace, store: Store | None) -> tuple[SweepSpec, Sweep | None]:
    """The spec to run: from the command line, or the stored one of the sweep to resume."""
    if store is not None and args.resume:
        resumed = store.sweep(None if args.resume == "latest" else _sweep_id(args.resume))
        options = spec.decode(resumed.options, f"{store.path}: sweep {resumed.id}")
        if getattr(args, "cluster", None):  # where to finish it may change; what to run may not
            options = msgspec.structs.replace(options, cluster=spec.parse_cluster(args.cluster))
        return options, resumed
    return spec.from_args(args, Path.cwd()), None


def run_or_sweep(args: Namespace) -> int:
    check_output(args.junit, "--junit")  # before anything runs or is stored
    check_output(args.log_dir, "--log-dir", folder=True)
    sweep = args.command == "sweep"
    store = Store(Path(args.db)) if sweep else None
    options, resumed = options_of(args, store)
    if options.cluster is not None:
        cluster.require_ray()
    detach = getattr(args, "detach", False)
    if detach and (args.daemon == "no" or options.cluster is not None):
        raise InputError("--detach runs the sweep in the daemon; not with --no-daemon or --cluster")
    if options.cluster is None and (args.daemon != "no" or detach):
        from kbd.daemon import submit

        status = submit.run_or_sweep(args, options, resumed)
        if status is not None:
            return status  # the daemon ran it
    return _run_here(args, options, store, resumed)


def _run_here(args: Namespace, options: SweepSpec, store: Store | None, resumed: Sweep | None):
    """Run in this process, with a template of its own (or on a cluster)."""
    import anyio

    from kbd.engine import scheduler
    from kbd.engine.scheduler import Hooks
    from kbd.engine.spawner import TemplateError

    sweep = store is not None
    prepared = prepare(options, store, resumed, shlex.join(["kbd", *sys.argv[1:]]))
    if prepared.note:
        print(prepared.note, file=sys.stderr)
    plans, hashes, sweep_id = prepared.plans, prepared.hashes, prepared.sweep_id
    log_dir = Path(args.log_dir) if args.log_dir else _default_log_dir(sweep_id if sweep else None)

    progress = Progress(total=len(plans), live=sys.stderr.isatty() and not args.json)
    records: list[Record] = []

    def finished(record: Record) -> None:
        records.append(record)
        if store is not None:
            store.add_attempt(sweep_id, hashes[record.key], record)
        show(args, progress, record)

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
            env = template_env(scheduler.cores_per_worker(pool.cores, jobs))
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
        records = in_order(store.records(sweep_id), prepared.kernels)
    return report(args, records, wall, completed, sweep_id)


def show(args: Namespace, progress: Progress, record: Record) -> None:
    """One finished kernel: its line above the progress block, or a JSON line on stdout."""
    if getattr(args, "json", False):
        print(reports.json_line(record), flush=True)
        progress.finished(record, None)
    else:
        progress.finished(record, reports.line(record))


def report(args: Namespace, records, wall: float, completed: bool, sweep_id: int | None) -> int:
    """Summary, JUnit, the resume hint; returns the exit status."""
    as_json = getattr(args, "json", False)
    if getattr(args, "junit", None):
        reports.write_junit(records, Path(args.junit))
    if not as_json or sys.stderr.isatty():
        print(reports.summary(records, wall), file=sys.stderr if as_json else sys.stdout)
    if sweep_id is not None and not completed:
        print(
            f"kbd: sweep {sweep_id} interrupted; continue with `kbd sweep --resume {sweep_id}`",
            file=sys.stderr,
        )
    if not completed:
        return 130
    return 1 if any(r.failed for r in records) else 0


def template_env(cores_per_worker: int) -> dict[str, str]:
    """The template's environment: thread counts match the cores each worker is pinned to."""
    return {**os.environ, **limits.thread_env(cores_per_worker), "PYTHONFAULTHANDLER": "1"}


def fatal_error(exc: BaseException) -> BaseException:
    """The TemplateError or ClusterError inside `exc` (maybe a group); re-raises anything else."""
    from kbd.engine.spawner import TemplateError

    if isinstance(exc, BaseExceptionGroup):
        found, _ = exc.split((TemplateError, ClusterError))
        if found is None:
            raise exc
        exc = found.exceptions[0]
        while isinstance(exc, BaseExceptionGroup):
            exc = exc.exceptions[0]
    return exc


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


def _plan(options: SweepSpec, store: Store | None):
    """Load and check the selected kernels and build one job per kernel."""
    from kbd.caches import compile_cache, import_cache
    from kbd.engine import dumps, scheduler
    from kbd.engine.scheduler import Planned
    from kbd.shared import containment

    root = catalog.kernelbench_root(options.kernelbench)
    files = [Path(f) for f in options.levels] or catalog.default_levels_files(options.shapes)
    entries = catalog.select(catalog.load(files), list(options.kernels))
    catalog.check_sources(entries, root)
    override = (
        descriptor.resolve_pipeline(
            list(options.pipeline), schedules_dir=SCHEDULES_DIR, cwd=Path(options.cwd)
        )
        if options.pipeline
        else None
    )
    mem_limit = options.mem_limit
    cache_dir = Path(options.cwd) / ".kbd" / import_cache.DIRECTORY
    compiled_dir = Path(options.cwd) / ".kbd" / compile_cache.DIRECTORY
    past = store.past() if store is not None else {}
    plans = []
    chooser = pipelines.Chooser(options, SCHEDULES_DIR)
    single = len(entries) * len(options.modes) == 1  # --print-to then names a file
    for entry, mode in ((e, m) for e in entries for m in options.modes):
        source = root / entry.kernel
        chosen = (
            pipelines.Chosen(override, " + ".join(options.pipeline))
            if override
            else chooser.choose(entry)
        )
        job = Job(
            kernel=entry.kernel,
            source=str(source),
            source_text=_read_source(entry, source),
            inputs=entry.inputs,
            init_args=entry.init_args,
            outputs=entry.outputs,
            dtype=entry.dtype,
            stages=chosen.stages,
            pipeline=chosen.name,
            seed=options.seed,
            tolerance=options.tolerance,
            max_tolerance=options.max_tolerance,
            opt_level=options.opt_level_for(entry.gflops),
            limits=Limits(
                mem_limit=mem_limit,
                hidden=containment.store_files(store.path) if store is not None else (),
                sandbox=options.sandbox,
                require_sandbox=options.require_sandbox,
            ),
            bench=options.bench,
            mode=mode,
            inspect=dumps.inspect_for(options, label(entry.name, mode), single),
        )
        if options.import_cache and mode == "import":
            job = import_cache.attach(job, cache_dir, import_cache.DEFAULT_MAX_BYTES)
        # a kernel whose pipeline is to be shown (--print-*, --object-file) must run it
        if options.compile_cache and mode == "import" and job.inspect == Inspect():
            job = compile_cache.attach(job, compiled_dir, compile_cache.DEFAULT_MAX_BYTES)
        previous = past.get((entry.name, mode))
        memory = limits.estimate(entry)
        if previous is not None and previous.peak_rss_bytes and previous.outcome != "memory":
            memory = max(memory, previous.peak_rss_bytes)
        expected = previous.wall_s if previous else (entry.gflops or 0.5) * SECONDS_PER_GFLOP
        plans.append(Planned(entry=entry, job=job, memory=memory, expected_s=expected))
    return scheduler.order(plans)


def _read_source(entry: Entry, path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(
            f"{entry.levels_file}: kernel {entry.kernel}: cannot read {path} ({exc})"
        ) from None


def _hash(value) -> str:
    """Configuration hash: the job(s) (which carry the kernel source and transform scripts) and
    the tool versions."""
    jobs = value if isinstance(value, list) else [value]
    digest = hashlib.sha256()
    for name in ("torch", "torch-mlir"):
        digest.update(f"{name}={_version(name)}".encode())
    for job in jobs:
        bare = msgspec.structs.replace(
            job, limits=Limits(), import_cache=None, compile_cache=None, inspect=Inspect()
        )
        digest.update(msgspec.msgpack.encode(bare))
    return digest.hexdigest()[:16]


def _version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "missing"


def _sweep_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InputError(f"--resume {text!r}: a sweep id is a number") from None


def in_order(records: list[Record], kernels: list[str]) -> list[Record]:
    position = {k: i for i, k in enumerate(kernels)}
    return sorted(
        records, key=lambda r: (position.get(r.kernel, len(position)), r.mode != "import")
    )


def _default_log_dir(sweep_id: int | None) -> Path:
    name = f"sweep-{sweep_id}" if sweep_id is not None else time.strftime("run-%Y%m%d-%H%M%S")
    return Path(".kbd") / "logs" / name
