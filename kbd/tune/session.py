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

Where candidates run is a `Runner`: this machine's pool and a warm template (`Here`: in this
process, or in the daemon with its pool and template, kbd.daemon.work), or one cluster node
(kbd.cluster.tuning). What a tune says goes to a `Report` as kbd.tune.events messages: printed
here, or sent to the daemon's followers. A session is begun (`begin`: planned, stored,
its trials loaded), tuned (`tune`) and finished (`finish`: its status and summary).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import msgspec

from kbd.engine import prepare, scheduler, spawner
from kbd.engine.scheduler import Control, Hooks, Planned, Pool
from kbd.plan import descriptor, limits, pipelines, space, tuned
from kbd.plan.catalog import Entry
from kbd.plan.space import Config, Space
from kbd.plan.spec import SweepSpec, TuneSpec
from kbd.results import tune_summary
from kbd.results.record import Record
from kbd.results.store import Store
from kbd.results.tune_summary import TaskRow, best
from kbd.results.tuning import Trial, TuningStore, trial_of
from kbd.shared.errors import ClusterError, InputError, TemplateError, fatal_error
from kbd.shared.protocol import BenchOptions
from kbd.tune.events import TrialEnded, TuneEnded
from kbd.tune.search import Search

EXIT_OK, EXIT_FAILED = 0, 1


@dataclass
class Task:
    entry: Entry
    path: Path
    space: Space
    key: tuned.TaskKey
    configs: list[Config]
    planned: Planned  # the kernel's job, whose pipeline each candidate replaces
    trials: list[Trial] = field(default_factory=list)
    note: str = ""  # why it was not tuned, in place of a verdict (a cluster node without it)
    done: bool = False  # searched and confirmed, its verdict recorded


@dataclass
class Pending:
    """A selected kernel not planned yet: on a cluster, the node that takes it plans its task
    for its own CPU (kbd.cluster.tuning). `note`: why that node did not tune it."""

    planned: Planned
    note: str = ""

    @property
    def entry(self) -> Entry:
        return self.planned.entry


@dataclass
class Session:
    """A tune ready to run: its stored session, its tasks with their trials so far (on a
    cluster, `Pending` kernels until a node plans them)."""

    options: TuneSpec
    tuning: TuningStore
    tune_id: int
    tasks: list[Task | Pending]
    log_dir: Path
    notes: list[str]  # what to say first (resuming, kernels skipped)


@dataclass
class Report:
    """Where a tune's messages go: this terminal, or the daemon's followers."""

    notice: Callable[[str], None]
    trial: Callable[[TrialEnded], None]


class Runner(Protocol):
    """Where a task's candidates run; `jobs` of them at once."""

    jobs: int

    async def run(self, plans: list[Planned], hooks: Hooks) -> bool:
        """Run every plan, calling `hooks`; False when stopped before all had a record."""


@dataclass
class Here:
    """Candidates on a pool of this machine's cores and a warm template: a `kbd tune` process's
    own, or the daemon's (with its `control`, as its sweeps)."""

    spawner: spawner.Spawner
    pool: Pool
    jobs: int
    timeout: float
    log_dir: Path
    control: Control | None = None  # None: Ctrl-C and SIGTERM stop the tune
    watch: Hooks | None = None  # the daemon's: which candidates run, in which phase, their RSS

    async def run(self, plans: list[Planned], hooks: Hooks) -> bool:
        return await scheduler.execute(
            self.spawner,
            plans,
            pool=self.pool,
            jobs=self.jobs,
            timeout=self.timeout,
            log_dir=self.log_dir,
            hooks=hooks if self.watch is None else _watched(hooks, self.watch),
            control=self.control,
        )


def _watched(hooks: Hooks, watch: Hooks) -> Hooks:
    """`hooks` with `watch`'s view of each candidate's start, phases, memory and end."""

    def finished(record: Record) -> None:
        watch.finished(record)
        hooks.finished(record)

    return Hooks(
        started=watch.started,
        phase=watch.phase,
        memory=watch.memory,
        finished=finished,
        lost=hooks.lost,
        notice=hooks.notice,
    )


def run(
    options: TuneSpec,
    db: Path,
    tune_id: int | None,
    log_dir: Path | None,
    command: str,
    execute: Callable[[Session, Report], bool] | None = None,
) -> int:
    """Tune in this process; the exit status. `tune_id`: the stored session to resume, whose
    options `options` are. `execute` runs the session's tasks (default: on this machine's cores;
    kbd.cluster.tuning.execute: on a Ray cluster)."""
    from kbd.tune import show as view

    logs = Path(".kbd") / "logs"
    session = begin(options, db, tune_id, log_dir, logs, command, here=execute is None)
    report = Report(notice=_say, trial=view.show_trial)
    for note in session.notes:
        report.notice(note)
    completed, error = False, None
    try:
        completed = (execute or _tune_here)(session, report)
    except (TemplateError, ClusterError, BaseExceptionGroup) as exc:
        error = fatal_error(exc)
    ended = finish(session, completed, error)
    view.show_end(ended)
    return ended.exit_status


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def stored(tuning: TuningStore, resume: str) -> tuple[int, TuneSpec]:
    """The id and options of the session `--resume` names ("latest" or an id)."""
    tune_id, text = tuning.session(None if resume == "latest" else _number(resume))
    return tune_id, _decode(text, f"{tuning.store.path}: tuning session {tune_id}")


def begin(
    options: TuneSpec,
    db: Path,
    tune_id: int | None,
    log_dir: Path | None,
    logs: Path,
    command: str,
    *,
    here: bool = True,
) -> Session:
    """Plan the tasks for this machine (`here`; else each stays `Pending` for the cluster node
    that takes it), create the stored session (or mark `tune_id`'s running again) and load each
    planned task's trials. Raises InputError when there is nothing to tune. Logs go to
    `log_dir`, else to `logs`/tune-ID."""
    tuning = TuningStore(Store(db))
    notes = [f"kbd tune: resuming session {tune_id}"] if tune_id is not None else []
    tasks, skipped = plan_tasks(options, here=here)
    if not tasks:
        first = skipped[0].removeprefix("kbd tune: ").removesuffix("; skipped")
        more = f" (and {len(skipped) - 1} more kernels)" if len(skipped) > 1 else ""
        raise InputError(f"nothing to tune: {first}{more}")
    if tune_id is None:
        tune_id = tuning.create(command, msgspec.json.encode(options).decode())
    else:
        tuning.set_status(tune_id, "running")
    session = Session(
        options, tuning, tune_id, tasks, log_dir or logs / f"tune-{tune_id}", notes + skipped
    )
    for task in tasks:
        if isinstance(task, Task):
            load_trials(session, task)
    return session


def load_trials(session: Session, task: Task) -> None:
    """The task's trials so far: this session's measurements and every session's failures
    (never run again). Records the task in the session (its schedule, configurations and
    default) for the report."""
    key, default = task.key, task.configs[0]
    session.tuning.add_task(
        session.tune_id, key.hash(), task.entry.name, key.descriptor, len(task.configs), default
    )
    task.trials = session.tuning.session_trials(task.key.hash(), session.tune_id)


async def tune(session: Session, runner: Runner, report: Report) -> bool:
    """Tune every task in turn on `runner`; False when stopped before the end."""
    for task in session.tasks:
        if not await tune_task(session, task, runner, report):
            return False
    return True


def finish(session: Session, completed: bool, error: str | None = None) -> TuneEnded:
    """Store how the session ended; its summary, closing lines and exit status."""
    tune_id = session.tune_id
    status = "done" if completed and error is None else "interrupted"
    session.tuning.set_status(tune_id, status)
    resume = f"kbd tune: interrupted; `kbd tune --resume {tune_id}` continues"
    if error is not None:
        return TuneEnded(tune_id, status, [], [f"kbd: error: {error}", resume], EXIT_FAILED)
    rows = [_row(task) for task in session.tasks if isinstance(task, Task) or task.note]
    if not completed:
        return TuneEnded(tune_id, status, rows, [resume], EXIT_FAILED)
    closing = [
        f"kbd tune: {task.entry.name}: no configuration passed and was timed"
        for task in session.tasks
        if not isinstance(task, Task) or not any(x.timed for x in task.trials)
    ]
    return TuneEnded(tune_id, status, rows, closing, EXIT_FAILED if closing else EXIT_OK)


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


def candidates_spec(options: TuneSpec) -> SweepSpec:
    """The sweep options of every candidate's job. Candidates are timed (the JIT's -O of a
    benchmark) and not compile-cached (a tune would flush the cache's useful entries with
    configurations that lose)."""
    return msgspec.structs.replace(
        options.sweep, tuned=False, pipeline=(), compile_cache=False, bench=BenchOptions()
    )


def plan_tasks(options: TuneSpec, *, here: bool = True) -> tuple[list[Task | Pending], list[str]]:
    """One task per selected kernel with a tunable schedule for this machine (`here`), else one
    `Pending` task per kernel some machine could tune (planned by the node that takes it);
    lines saying why the others have none."""
    sweep = candidates_spec(options)
    chooser = prepare.chooser_for(sweep, None) if here else None
    tasks, skipped = [], []
    for planned in prepare.plan(sweep, None):
        if chooser is not None:
            task = task_for(options, planned, chooser)
        else:
            task = _untunable(options, planned.entry) or Pending(planned)
        if isinstance(task, str):
            skipped.append(f"kbd tune: {planned.entry.name}: {task}; skipped")
        else:
            tasks.append(task)
    return tasks, skipped


def _untunable(options: TuneSpec, entry: Entry) -> str | None:
    """Why a kernel cannot be tuned on any machine, or None."""
    if options.descriptor is None and entry.schedule_family is None:
        return "its levels entry names no family (--pipeline names a descriptor to tune)"
    if entry.inputs is None:
        return "its levels entry has no input shapes"
    return None


def task_for(options: TuneSpec, planned: Planned, chooser: pipelines.Chooser) -> Task | str:
    """The tuning task of one planned kernel for the chooser's machine, or why it has none."""
    entry = planned.entry
    reason = _untunable(options, entry)
    if reason is not None:
        return reason
    if options.descriptor is not None:
        path = Path(options.descriptor)
    else:
        path = chooser.descriptor_for(entry)
    if path is None:
        return f"no {entry.schedule_family} {entry.dtype} schedule for this CPU"
    tunable = space.load(path)
    if tunable is None:
        return f"{path} declares no Tune space"
    key = chooser.task(entry, path)
    configs = tunable.configs(space.target_for(chooser.features))
    return Task(entry, path, tunable, key, configs, planned)


async def tune_task(session: Session, task: Task, runner: Runner, report: Report) -> bool:
    """Search one task's configurations and confirm the best; False when stopped."""
    options = session.options
    name = task.entry.name
    seeds = _seeds(session.tuning, task)
    search = Search(task.space, task.configs, options.budget, seeds, options.seed)
    how = "every configuration" if search.exhaustive else f"{options.budget} of them"
    report.notice(
        f"kbd tune: {name}: {len(task.configs)} valid configurations of {task.path.name}"
        f" ({task.space.size()} before constraints); measuring {how}"
    )
    search_bench = BenchOptions(
        min_time_s=options.search_time_s,
        min_samples=5,
        budget_s=max(5.0, 10 * options.search_time_s),
        processes=1,
        inductor=False,
    )
    counter = len({tuned.config_text(t.config) for t in task.trials if t.stage == "search"})
    while batch := search.next(task.trials, max(2, 2 * runner.jobs)):
        plans = {}
        for config in batch:
            counter += 1
            plans[_label(name, counter)] = (
                config,
                _plan(options, task, config, search_bench, counter),
            )
        if not await _run(session, task, plans, "search", runner, report):
            return False
    task.done = await _confirm(session, task, runner, report)
    return task.done


async def _confirm(session: Session, task: Task, runner: Runner, report: Report) -> bool:
    """Time the best and the default again in fresh processes, unless the verdict needs no
    confirmation (tune_summary.verdict), and record the verdict."""
    options, tuning, tune_id = session.options, session.tuning, session.tune_id
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
        if plans and not await _run(session, task, plans, "confirm", runner, report):
            return False
        verdict = tune_summary.verdict(task.trials, default)
    if verdict.text == tune_summary.EVERY_CONFIGURATION_FAILED:  # nothing to record
        return True
    report.notice(f"kbd tune: {name}: {verdict.text}")
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


async def _run(session: Session, task: Task, plans, stage: str, runner: Runner, report) -> bool:
    by_label = {label: config for label, (config, _) in plans.items()}

    def finished(record: Record) -> None:
        trial = trial_of(record, by_label[record.kernel], stage)
        session.tuning.add_trial(session.tune_id, task.key.hash(), task.entry.name, trial, record)
        task.trials.append(trial)
        report.trial(_ended(task, trial))

    hooks = Hooks(finished=finished, notice=report.notice)
    return await runner.run([planned for _, planned in plans.values()], hooks)


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
    return Planned(entry=entry, job=job, memory=task.planned.memory, expected_s=1.0)


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


def _ended(task: Task, trial: Trial) -> TrialEnded:
    searched = [t for t in task.trials if t.stage == "search"]
    top = best(task.trials)
    return TrialEnded(
        kernel=task.entry.name,
        trial=trial,
        measured=len(searched),
        failed=sum(1 for t in searched if t.outcome != "pass"),
        best=top.speedup if top is not None else None,
    )


def _row(task: Task | Pending) -> TaskRow:
    """The task's row of the summary table (kbd.results.tune_summary, as the HTML report shows
    it)."""
    if isinstance(task, Pending):
        return TaskRow(task.entry.name, None, 0, "0", None, None, task.note)
    summary = tune_summary.summarize(
        task.entry.name, task.key.descriptor, len(task.configs), task.configs[0], task.trials
    )
    return tune_summary.row(summary, task.note)


def _tune_here(session: Session, report: Report) -> bool:
    import anyio

    sweep = session.options.sweep
    pool = Pool(limits.usable_cores(), sweep.mem_budget or limits.default_budget())
    jobs = sweep.jobs or len(pool.cores)
    env = spawner.template_env(scheduler.cores_per_worker(pool.cores, jobs))

    async def main() -> bool:
        async with spawner.Spawner.started(env, session.log_dir / "template.log") as started:
            runner = Here(started, pool, jobs, sweep.timeout, session.log_dir)
            return await tune(session, runner, report)

    return anyio.run(main)
