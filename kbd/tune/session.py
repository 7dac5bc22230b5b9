"""`kbd tune`: search each selected kernel's schedule configurations, keep every trial, confirm
the best against the default in fresh processes, and adopt it only on a confirmed gain.

Builder and runner are kbd's own: each candidate configuration is a job like any other (the
kernel with `--pipeline DESCRIPTOR{var=value ...}`), compiled and checked `-j` wide in
sandboxed workers and timed alone against eager in its process (`--benchmark`, one process per
candidate while searching). Its record becomes a trial in the tuning database, committed as it
ends (kbd.results.tuning), whatever its outcome. The search (kbd.tune.search) never proposes a
configuration twice. Then the best and the default are timed again with the full benchmark
protocol (`--bench-processes` fresh processes each, 3 by default): the best is adopted when its
speedup's interval lies above the default's, else the default stays, and the record says so.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from kbd.engine import prepare, scheduler, spawner
from kbd.plan import descriptor, limits, space, tuned
from kbd.plan.catalog import Entry
from kbd.plan.space import Config, Space
from kbd.plan.spec import SweepSpec, TuneDefaults
from kbd.results import tune_summary
from kbd.results.record import Record
from kbd.results.store import Store
from kbd.results.tune_summary import best
from kbd.results.tuning import Trial, TuningStore, trial_of
from kbd.shared.errors import InputError, TemplateError, fatal_error
from kbd.shared.protocol import BenchOptions
from kbd.tune.search import Search

EXIT_OK, EXIT_FAILED = 0, 1


class TuneSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What `kbd tune` does: the sweep options of its candidates, and how to search."""

    sweep: SweepSpec  # selection, compilation, limits; `bench` is the confirmation protocol
    descriptor: str | None = None  # --pipeline: the tunable descriptor (None: the finder's)
    budget: int = TuneDefaults().budget  # measurements per kernel
    search_time_s: float = TuneDefaults().search_time_s  # per side and candidate, searching
    seed: int = 0


@dataclass
class Task:
    entry: Entry
    path: Path
    space: Space
    key: tuned.TaskKey
    configs: list[Config]
    planned: scheduler.Planned  # the kernel's job, whose pipeline each candidate replaces
    trials: list[Trial] = field(default_factory=list)


def run(options: TuneSpec, db: Path, resume: str | None, log_dir: Path | None, command: str) -> int:
    """Tune the selected kernels; the exit status."""
    store = Store(db)
    tuning = TuningStore(store)
    if resume is not None:
        tune_id, text = tuning.session(None if resume == "latest" else _number(resume))
        options = _decode(text, f"{store.path}: tuning session {tune_id}")
        print(f"kbd tune: resuming session {tune_id}", file=sys.stderr)
    else:
        tune_id = None
    tasks, skipped = _tasks(options)
    if not tasks:
        first = skipped[0].removeprefix("kbd tune: ").removesuffix("; skipped")
        more = f" (and {len(skipped) - 1} more kernels)" if len(skipped) > 1 else ""
        raise InputError(f"nothing to tune: {first}{more}")
    if tune_id is None:
        tune_id = tuning.create(command, msgspec.json.encode(options).decode())
    log_dir = log_dir or Path(".kbd") / "logs" / f"tune-{tune_id}"
    for line in skipped:
        print(line, file=sys.stderr)
    for task in tasks:
        key, default = task.key, task.configs[0]
        tuning.add_task(
            tune_id, key.hash(), task.entry.name, key.descriptor, len(task.configs), default
        )
        # every session's failures (never run again), and this session's measurements
        ours = tuning.trials(task.key.hash(), tune_id)
        failed = [t for t in tuning.trials(task.key.hash()) if t.outcome != "pass"]
        task.trials = ours + [t for t in failed if t not in ours]
    try:
        completed = _execute(options, tasks, tuning, tune_id, log_dir)
    except (TemplateError, BaseExceptionGroup) as exc:
        print(f"kbd: error: {fatal_error(exc)}", file=sys.stderr)
        tuning.set_status(tune_id, "interrupted")
        return EXIT_FAILED
    tuning.set_status(tune_id, "done" if completed else "interrupted")
    _summary(tasks)
    if not completed:
        print(f"kbd tune: interrupted; `kbd tune --resume {tune_id}` continues", file=sys.stderr)
        return EXIT_FAILED
    failed = [t for t in tasks if not any(x.timed for x in t.trials)]
    for task in failed:
        print(
            f"kbd tune: {task.entry.name}: no configuration passed and was timed", file=sys.stderr
        )
    return EXIT_FAILED if failed else EXIT_OK


def _number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InputError(f"--resume {text!r}: a tuning session id is a number") from None


def _decode(text: str, where: str) -> TuneSpec:
    try:
        return msgspec.json.decode(text, type=TuneSpec)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise InputError(f"{where}: stored options are not valid ({exc})") from None


def _tasks(options: TuneSpec) -> tuple[list[Task], list[str]]:
    """One task per selected kernel with a tunable schedule; lines saying why others have none."""
    # Candidates are timed (the JIT's -O of a benchmark) and not compile-cached (a tune would
    # flush the cache's useful entries with configurations that lose).
    sweep = msgspec.structs.replace(
        options.sweep, tuned=False, pipeline=(), compile_cache=False, bench=BenchOptions()
    )
    chooser = prepare.chooser_for(sweep, None)
    target = space.target_for(chooser.features)
    tasks, skipped = [], []
    for planned in prepare.plan(sweep, None):
        entry = planned.entry
        if options.descriptor is not None:
            path = Path(options.descriptor)
        else:
            path = chooser.descriptor_for(entry)
        if path is None:
            why = (
                "its levels entry names no family (--pipeline names a descriptor to tune)"
                if entry.schedule_family is None
                else f"no {entry.schedule_family} {entry.dtype} schedule for this CPU"
            )
            skipped.append(f"kbd tune: {entry.name}: {why}; skipped")
            continue
        if entry.inputs is None:
            skipped.append(f"kbd tune: {entry.name}: its levels entry has no input shapes; skipped")
            continue
        tunable = space.load(path)
        if tunable is None:
            skipped.append(f"kbd tune: {entry.name}: {path} declares no Tune space; skipped")
            continue
        key = chooser.task(entry, path)
        tasks.append(Task(entry, path, tunable, key, tunable.configs(target), planned))
    return tasks, skipped


def _execute(options: TuneSpec, tasks: list[Task], tuning: TuningStore, tune_id: int, log_dir):
    import anyio

    pool = scheduler.Pool(
        limits.usable_cores(), options.sweep.mem_budget or limits.default_budget()
    )
    jobs = options.sweep.jobs or len(pool.cores)
    env = spawner.template_env(scheduler.cores_per_worker(pool.cores, jobs))
    return anyio.run(_tune_all, options, tasks, tuning, tune_id, log_dir, pool, jobs, env)


async def _tune_all(options, tasks, tuning, tune_id, log_dir, pool, jobs, env) -> bool:
    from kbd.engine.spawner import Spawner

    async with Spawner.started(env, log_dir / "template.log") as started:
        for task in tasks:
            if not await _tune_one(options, task, tuning, tune_id, log_dir, pool, jobs, started):
                return False
    return True


async def _tune_one(options, task: Task, tuning, tune_id, log_dir, pool, jobs, started) -> bool:
    name = task.entry.name
    seeds = _seeds(tuning, task)
    search = Search(task.space, task.configs, options.budget, seeds, options.seed)
    how = "every configuration" if search.exhaustive else f"{options.budget} of them"
    print(
        f"kbd tune: {name}: {len(task.configs)} valid configurations of {task.path.name}"
        f" ({task.space.size()} before constraints); measuring {how}",
        file=sys.stderr,
    )
    search_bench = BenchOptions(
        min_time_s=options.search_time_s,
        min_samples=5,
        budget_s=max(5.0, 10 * options.search_time_s),
        processes=1,
        inductor=False,
    )
    counter = len({tuned.config_text(t.config) for t in task.trials if t.stage == "search"})
    while batch := search.next(task.trials, max(2, 2 * jobs)):
        plans = {}
        for config in batch:
            counter += 1
            plans[_label(name, counter)] = (
                config,
                _plan(options, task, config, search_bench, counter),
            )
        ok = await _run(
            plans, "search", task, tuning, tune_id, log_dir, pool, jobs, started, options
        )
        if not ok:
            return False
    return await _confirm(options, task, tuning, tune_id, log_dir, pool, jobs, started)


async def _confirm(options, task: Task, tuning, tune_id, log_dir, pool, jobs, started) -> bool:
    """Time the best and the default again in fresh processes, unless the verdict needs no
    confirmation (tune_summary.verdict), and record the verdict."""
    name = task.entry.name
    default = task.configs[0]
    verdict = tune_summary.verdict(task.trials, default)
    if verdict.confirming:
        confirm_bench = options.sweep.bench or BenchOptions()
        done = {tuned.config_text(t.config) for t in task.trials if t.stage == "confirm"}
        wanted = [
            c for c in (default, best(task.trials).config) if tuned.config_text(c) not in done
        ]
        plans = {}
        for index, config in enumerate(wanted):
            label = _label(name, f"confirm{index}")
            plans[label] = (config, _plan(options, task, config, confirm_bench, f"confirm{index}"))
        if not await _run(
            plans, "confirm", task, tuning, tune_id, log_dir, pool, jobs, started, options
        ):
            return False
        verdict = tune_summary.verdict(task.trials, default)
    if best(task.trials) is None:  # nothing passed: nothing to record
        return True
    print(f"kbd tune: {name}: {verdict.text}", file=sys.stderr)
    tuning.adopt(
        tuned.Tuned(
            key=task.key,
            kernel=name,
            config=verdict.config if verdict.adopted else default,
            adopted=verdict.adopted,
            gain=verdict.gain,
            gain_low=verdict.gain_low,
            note=verdict.text,
        ),
        tune_id,
    )
    return True


async def _run(plans, stage, task, tuning, tune_id, log_dir, pool, jobs, started, options) -> bool:
    from kbd.engine.scheduler import Hooks

    by_label = {label: config for label, (config, _) in plans.items()}

    def finished(record: Record) -> None:
        config = by_label[record.kernel]
        trial = trial_of(record, config, stage)
        tuning.add_trial(tune_id, task.key.hash(), task.entry.name, trial, record)
        task.trials.append(trial)
        print(_line(task, trial, stage), file=sys.stderr, flush=True)

    hooks = Hooks(finished=finished, notice=lambda text: print(text, file=sys.stderr))
    return await scheduler.execute(
        started,
        [planned for _, planned in plans.values()],
        pool=pool,
        jobs=jobs,
        timeout=options.sweep.timeout,
        log_dir=log_dir,
        hooks=hooks,
    )


def _label(kernel: str, counter) -> str:
    return f"{kernel}@{counter}"


def _plan(options: TuneSpec, task: Task, config: Config, bench: BenchOptions, counter):
    """The planned run of one configuration: the kernel's job with the descriptor at `config`,
    named `<kernel>@<n>` (its log, its record) so that candidates of one kernel run side by
    side."""
    pipeline = space.spec(str(task.path), {**task.space.default(), **config})
    stages = descriptor.resolve_pipeline(
        [pipeline], schedules_dir=prepare.SCHEDULES_DIR, cwd=Path(options.sweep.cwd)
    )
    job = msgspec.structs.replace(
        task.planned.job, stages=stages, pipeline=pipeline, families={}, bench=bench
    )
    entry = msgspec.structs.replace(task.entry, kernel=f"{_label(task.entry.name, counter)}.py")
    return scheduler.Planned(entry=entry, job=job, memory=task.planned.memory, expected_s=1.0)


def _seeds(tuning: TuningStore, task: Task) -> list[Config]:
    """The adopted configurations of the same schedule for other shapes on this machine."""
    found = []
    for other in tuning.all_tuned():
        key = other.key
        if (
            other.adopted
            and key.descriptor == task.key.descriptor
            and key.cpu == task.key.cpu
            and key.hash() != task.key.hash()
        ):
            found.append({n: other.config[n] for n in task.space.domains if n in other.config})
    return found


def _line(task: Task, trial: Trial, stage: str) -> str:
    searched = [t for t in task.trials if t.stage == "search"]
    failures = sum(1 for t in searched if t.outcome != "pass")
    top = best(task.trials)
    config = " ".join(f"{k}={v}" for k, v in sorted(trial.config.items()))
    if trial.timed:
        result = f"{trial.speedup:.3g}x [{trial.low:.3g}, {trial.high:.3g}]"
    else:
        result = (
            f"{trial.outcome} ({trial.phase}{': ' + trial.message[:80] if trial.message else ''})"
        )
    where = f"{len(searched)} measured, {failures} failed" if stage == "search" else "confirming"
    leader = f"best {top.speedup:.3g}x" if top is not None else "nothing timed yet"
    return f"  {task.entry.name} {{{config}}}: {result}   [{where}; {leader}]"


def _summary(tasks: list[Task]) -> None:
    """The summary table (kbd.results.tune_summary, as the HTML report shows it)."""
    rows = [
        tune_summary.summarize(
            t.entry.name, t.key.descriptor, len(t.configs), t.configs[0], t.trials
        )
        for t in tasks
    ]
    print("\n" + tune_summary.table(rows))
