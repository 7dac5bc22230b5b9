"""Which pipeline each kernel runs, and the name its record gives it.

The rule, first match wins:

1. `--pipeline SPEC ...` replaces every kernel's pipeline.
2. Family schedules are on (`kbd run` and `kbd sweep`, so every `--benchmark` run; off with
   `--smoke-test` unless `--schedules family`) and the kernel's levels entry has a family (its
   hand-set `pipeline`, else its generated `family`): the finder's schedule for the target,
   `schedules/<arch>/<feature>/<family>/<dtype>.yaml` for the host's features in the order of
   `kbd.plan.target.RANKING` (or `--feature` in the order given), else
   `schedules/<arch>/<family>/<dtype>.yaml`.
3. Family schedules are on and the entry names no family (a levels file of the user's own):
   the job carries the pipeline of every family that has a schedule for the target and dtype,
   and the worker finds the kernel's family in its exported graph, as `kbd levels generate`
   does, and runs that family's pipeline; the record says the family was found at run time.
   A tunable family schedule (one with a `Tune` section, kbd.plan.space) runs with the
   configuration `kbd tune` adopted for the kernel's exact task key (kbd.plan.tuned), when there
   is one and tuned configurations are on (off with `--untuned`); the record's pipeline names
   it: `x86_64/avx512f/matmul/f32.yaml{reg_m=4 ...} (tuned)`.
4. Otherwise the default scalar pipeline; a kernel whose family has no schedule for the target
   says so in its record (`no softmax f32 schedule for x86_64 (avx512f, avx2)`).

A kernel runs with the one pipeline chosen here: when its family schedule fails, the failure is
its result, and it is never run again with another pipeline.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from kbd.plan import catalog, descriptor, space, target, tuned
from kbd.plan.catalog import Entry
from kbd.plan.spec import SweepSpec
from kbd.shared.errors import InputError
from kbd.shared.protocol import FOUND_AT_RUN_TIME, FamilyPipeline, Stage


class Chosen(NamedTuple):
    stages: list[Stage]
    name: str  # what the record's `pipeline` says: the descriptor run, and why when it fell back
    families: dict[str, FamilyPipeline] = {}  # rule 3: the worker chooses among these


def target_of(options: SweepSpec, machine: target.Machine | None = None) -> tuple[str, list[str]]:
    """The finder's architecture and features, best first: the host's (or `machine`'s) unless
    overridden."""
    arch, flags = (machine.arch, machine.flags) if machine else descriptor.host_target()
    features = target.ranked(flags) if options.features is None else list(options.features)
    return options.target or arch, features


class Chooser:
    """Chooses the pipelines of one plan's kernels (see the module docstring). The target is read
    once and each schedule found and resolved once per plan, not per kernel; a new plan (the
    daemon plans many) reads schedule files again, so edits between sweeps take effect.
    `--pipeline` is handled by the caller, which resolves it once for all kernels."""

    def __init__(
        self,
        options: SweepSpec,
        schedules_dir: Path,
        tuned_configs: dict[str, space.Config] | None = None,
        threads: int = 1,
        machine: target.Machine | None = None,
    ):
        """`machine`: the CPU to choose for (None: this one's; a cluster node's when tuning
        there); `threads`: cores per worker, part of a tuning task's key."""
        self.options = options
        self.schedules_dir = schedules_dir
        self.machine = machine
        self.arch, self.features = target_of(options, machine)
        self.tuned = tuned_configs or {}  # by task key hash
        self.threads = threads
        self._spaces: dict[Path, space.Space | None] = {}
        self._found: dict[tuple[str, str], Path | None] = {}
        self._stages: dict[str, list[Stage]] = {}
        self._families: dict[str, dict[str, FamilyPipeline]] = {}

    def choose(self, entry: Entry) -> Chosen:
        """The pipeline of one kernel."""
        default = descriptor.DEFAULT_PIPELINE
        family = entry.schedule_family
        if family is None and self.options.family_schedules:
            families = self.families(entry.dtype)
            if families:
                return Chosen(self._resolve(default), default, families)
        if family is None:
            return Chosen(self._resolve(default), default)
        if not self.options.family_schedules:
            why = "--schedules scalar" if self.options.schedules else "--smoke-test"
            return Chosen(self._resolve(default), f"{default} (family schedules off: {why})")
        found = self._find(family, entry.dtype)
        if found is not None:
            name = str(found.relative_to(self.schedules_dir))
            key = self.task(entry, found) if self.tuned else None
            config = self.tuned.get(key.hash()) if key is not None else None
            if config is not None:
                tuned_spec = space.spec(str(found), config)
                return Chosen(self._resolve(tuned_spec), f"{space.spec(name, config)} (tuned)")
            return Chosen(self._resolve(str(found)), name)
        where = f"{self.arch} ({', '.join(self.features)})" if self.features else self.arch
        return Chosen(
            self._resolve(default), f"{default} (no {family} {entry.dtype} schedule for {where})"
        )

    def descriptor_for(self, entry: Entry) -> Path | None:
        """The family schedule the finder picks for `entry`, or None."""
        family = entry.schedule_family
        return self._find(family, entry.dtype) if family is not None else None

    def space_of(self, path: Path) -> space.Space | None:
        if path not in self._spaces:
            self._spaces[path] = space.load(path)
        return self._spaces[path]

    def task(self, entry: Entry, path: Path) -> tuned.TaskKey | None:
        """The tuning task of `entry` under the tunable schedule at `path` (None: not tunable).
        A task is keyed by input shapes: an entry that gives none (a kernel at its problem's own
        shapes, `--shapes kernelbench`, which are known only once it is sized) has no task, so
        no tuned configuration applies to it."""
        if self.space_of(path) is None or entry.inputs is None:
            return None
        try:
            name = str(path.relative_to(self.schedules_dir))
        except ValueError:  # a descriptor of the user's own (`kbd tune --pipeline`)
            name = str(path)
        return tuned.task_key(
            entry,
            name,
            self._resolve(str(path)),
            self._source(entry),
            arch=self.arch,
            features=self.features,
            cpu=self.machine.cpu if self.machine else target.cpu_model(),
            threads=self.threads,
        )

    def _source(self, entry: Entry) -> str:
        """The problem's source text ("" when unreadable: planning reports that itself)."""
        try:
            return (catalog.kernelbench_root(self.options.kernelbench) / entry.kernel).read_text()
        except (OSError, UnicodeDecodeError, InputError):
            return ""

    def families(self, dtype: str) -> dict[str, FamilyPipeline]:
        """Every family with a schedule for the target and `dtype`, with its pipeline."""
        if dtype not in self._families:
            base = self.schedules_dir / self.arch
            folders = [base / feature for feature in self.features if feature] + [base]
            names = sorted(
                {p.parent.name for folder in folders for p in folder.glob(f"*/{dtype}.yaml")}
            )
            found = {name: self._find(name, dtype) for name in names}
            self._families[dtype] = {
                name: FamilyPipeline(
                    name=f"{path.relative_to(self.schedules_dir)} ({name}, {FOUND_AT_RUN_TIME})",
                    stages=self._resolve(str(path)),
                )
                for name, path in found.items()
                if path is not None
            }
        return self._families[dtype]

    def _find(self, family: str, dtype: str) -> Path | None:
        key = (family, dtype)
        if key not in self._found:
            self._found[key] = descriptor.find_pipeline(
                family,
                dtype,
                schedules_dir=self.schedules_dir,
                arch=self.arch,
                features=self.features,
            )
        return self._found[key]

    def _resolve(self, spec: str) -> list[Stage]:
        if spec not in self._stages:
            self._stages[spec] = descriptor.resolve_pipeline(
                [spec], schedules_dir=self.schedules_dir, cwd=self.schedules_dir
            )
        return self._stages[spec]


def choose(entry: Entry, options: SweepSpec, schedules_dir: Path) -> Chosen:
    """The pipeline of one kernel on its own (a plan of many uses one Chooser)."""
    return Chooser(options, schedules_dir).choose(entry)
