"""Which pipeline each kernel runs, and the name its record gives it.

The rule, first match wins:

1. `--pipeline SPEC ...` replaces every kernel's pipeline.
2. Family schedules are on (`kbd run` and `kbd sweep`, so every `--benchmark` run; off with
   `--smoke-test` unless `--schedules family`) and the kernel's levels entry has a family (its
   hand-set `pipeline`, else its generated `family`): the finder's schedule for the target,
   `schedules/<arch>/<feature>/<family>/<dtype>.yaml` for the host's features in the order of
   `kbd.target.RANKING` (or `--feature` in the order given), else
   `schedules/<arch>/<family>/<dtype>.yaml`.
3. Otherwise the default scalar pipeline; a kernel whose family has no schedule for the target
   says so in its record (`no softmax f32 schedule for x86_64 (avx512f, avx2)`).

A kernel runs with the one pipeline chosen here: when its family schedule fails, the failure is
its result, and it is never run again with another pipeline.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from kbd import descriptor, target
from kbd.catalog import Entry
from kbd.protocol import Stage
from kbd.spec import SweepSpec


class Chosen(NamedTuple):
    stages: list[Stage]
    name: str  # what the record's `pipeline` says: the descriptor run, and why when it fell back


def target_of(options: SweepSpec) -> tuple[str, list[str]]:
    """The finder's architecture and features, best first: the host's unless overridden."""
    arch, flags = descriptor.host_target()
    features = target.ranked(flags) if options.features is None else list(options.features)
    return options.target or arch, features


def choose(entry: Entry, options: SweepSpec, schedules_dir: Path) -> Chosen:
    """The pipeline of one kernel (see the module docstring); `--pipeline` is handled by the
    caller, which resolves it once for all kernels."""
    default = descriptor.DEFAULT_PIPELINE
    family = entry.schedule_family
    if family is None:
        name = default
    elif not options.family_schedules:
        why = "--schedules scalar" if options.schedules else "--smoke-test"
        name = f"{default} (family schedules off: {why})"
    else:
        arch, features = target_of(options)
        found = descriptor.find_pipeline(
            family, entry.dtype, schedules_dir=schedules_dir, arch=arch, features=features
        )
        if found is not None:
            stages = descriptor.resolve_pipeline(
                [str(found)], schedules_dir=schedules_dir, cwd=schedules_dir
            )
            return Chosen(stages, str(found.relative_to(schedules_dir)))
        where = f"{arch} ({', '.join(features)})" if features else arch
        name = f"{default} (no {family} {entry.dtype} schedule for {where})"
    stages = descriptor.resolve_pipeline([default], schedules_dir=schedules_dir, cwd=schedules_dir)
    return Chosen(stages, name)
