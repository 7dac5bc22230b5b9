"""Preparing a run or sweep: one job per selected kernel and mode, in run order, and the sweep's
row in the store (or what is left of a resumed sweep).

Used wherever kernels run: `kbd run` and `kbd sweep` in this process, the daemon and replay's
planning tests. The jobs carry everything a worker needs (source, shapes, stages, limits), so
that a record can be reproduced from its job alone.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import msgspec

from kbd.caches import compile_cache, import_cache, inductor_cache
from kbd.engine import dumps, scheduler
from kbd.engine.scheduler import Planned
from kbd.engine.scratch import store_files
from kbd.plan import catalog, descriptor, limits, pipelines, spec, target, tuned
from kbd.plan.catalog import Entry
from kbd.plan.invocation import DEFAULT_DB
from kbd.plan.spec import SweepSpec
from kbd.results import tuning
from kbd.results.record import label
from kbd.results.store import Store, Sweep
from kbd.shared import identity
from kbd.shared.errors import InputError
from kbd.shared.outcomes import is_final
from kbd.shared.protocol import Inspect, Job, Limits

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


def prepare(
    options: SweepSpec, store: Store | None, resumed: Sweep | None, command: str
) -> Prepared:
    """Plan a run (store None) or a sweep: create its row, or pick up where `resumed` ended."""
    plans = plan(options, store)
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
            command, spec.encode(options), kernels, configuration_hash([p.job for p in plans])
        )
    hashes = {(p.entry.name, p.job.mode): configuration_hash(p.job) for p in plans}
    return Prepared(options, plans, kernels, sweep_id, hashes, note)


def plan(options: SweepSpec, store: Store | None) -> list[Planned]:
    """Load and check the selected kernels and build one job per kernel."""
    root = catalog.kernelbench_root(options.kernelbench)
    files = [Path(f) for f in options.levels] or catalog.default_levels_files(options.shapes)
    entries = catalog.select(catalog.load(files), list(options.kernels))
    if options.dtype is not None:
        entries = [catalog.with_dtype(entry, options.dtype) for entry in entries]
    own = options.shapes == "kernelbench"  # sized before they run: kbd.engine.scheduler
    if own:
        entries = [catalog.own_shapes(entry) for entry in entries]
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
    inductor_dir = Path(options.cwd) / ".kbd" / inductor_cache.DIRECTORY
    past = store.past() if store is not None else {}
    plans = []
    chooser = chooser_for(options, store)
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
            families=chosen.families,
            seed=options.seed,
            tolerance=options.tolerance_for(entry.dtype),
            max_tolerance=max(options.max_tolerance, options.tolerance_for(entry.dtype)),
            opt_level=options.opt_level_for(entry.gflops),
            limits=Limits(
                mem_limit=mem_limit,
                hidden=store_files(store.path) if store is not None else (),
                sandbox=options.sandbox,
                require_sandbox=options.require_sandbox,
            ),
            bench=options.bench,
            mode=mode,
            inspect=dumps.inspect_for(options, label(entry.name, mode), single),
            shapes="kernelbench" if own else "levels",
            heavy_opt_level=options.heavy_opt_level() if own else None,
        )
        if options.import_cache and mode == "import":
            job = import_cache.attach(job, cache_dir, import_cache.DEFAULT_MAX_BYTES)
        # a kernel whose pipeline is to be shown (--print-*, --object-file) must run it
        if options.compile_cache and mode == "import" and job.inspect == Inspect():
            job = compile_cache.attach(job, compiled_dir, compile_cache.DEFAULT_MAX_BYTES)
        if options.compile_cache and job.bench is not None and job.bench.inductor:
            job = inductor_cache.attach(job, inductor_dir)
        previous = past.get((entry.name, mode))
        memory = limits.estimate(entry)
        if previous is not None and previous.peak_rss_bytes and previous.outcome != "memory":
            memory = max(memory, previous.peak_rss_bytes)
        if previous is not None:  # its own time: not the pauses for other kernels' timing
            expected = previous.wall_s - previous.paused_s
        else:
            expected = (entry.gflops or 0.5) * SECONDS_PER_GFLOP
        plans.append(Planned(entry=entry, job=job, memory=memory, expected_s=expected))
    return scheduler.order(plans)


def chooser_for(
    options: SweepSpec,
    store: Store | None,
    machine: target.Machine | None = None,
    threads: int | None = None,
) -> pipelines.Chooser:
    """The pipeline chooser of a plan, with the tuned configurations it applies: for this
    machine with workers of `cores / -j` cores, or for `machine` with workers of `threads`
    (a cluster node's, kbd.cluster.tuning)."""
    if threads is None:
        jobs = options.jobs or len(limits.usable_cores())
        threads = scheduler.cores_per_worker(limits.usable_cores(), jobs)
    configs = tuned.lookup(tuned_configurations(options, store)) if options.tuned else {}
    return pipelines.Chooser(options, SCHEDULES_DIR, configs, threads, machine)


def tuned_configurations(options: SweepSpec, store: Store | None) -> list[tuned.Tuned]:
    """The repository's reviewed tuned configurations (schedules/tuned.jsonl), then the results
    store's (this store, or the default one in the working folder when it exists), which win."""
    found = []
    repository = SCHEDULES_DIR / tuned.REPOSITORY_FILE
    if repository.is_file():
        found += tuned.read_jsonl(repository)
    if store is None and (Path(options.cwd) / DEFAULT_DB).is_file():
        store = Store(Path(options.cwd) / DEFAULT_DB)
    if store is not None:
        found += tuning.TuningStore(store, create=False).all_tuned()
    return found


def _read_source(entry: Entry, path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(
            f"{entry.levels_file}: kernel {entry.kernel}: cannot read {path} ({exc})"
        ) from None


def configuration_hash(value) -> str:
    """Configuration hash: the job(s) (which carry the kernel source and transform scripts) and
    the tool versions."""
    jobs = value if isinstance(value, list) else [value]
    digest = hashlib.sha256()
    tools = identity.current()
    for name, version in (("torch", tools.torch), ("torch-mlir", tools.torch_mlir)):
        digest.update(f"{name}={version}".encode())
    for job in jobs:
        bare = msgspec.structs.replace(
            job, limits=Limits(), import_cache=None, compile_cache=None, inspect=Inspect()
        )
        digest.update(msgspec.msgpack.encode(bare))
    return digest.hexdigest()[:16]
