"""`kbd levels generate`: write levels files from KernelBench, one sandboxed worker per problem.

Each problem is measured by a worker forked from the warm template, as a sweep runs kernels
(`kbd.worker.generate` is the torch side), with a memory cap, pinned cores and a timeout: a
problem file that hangs, crashes or allocates 40 GB fails alone and keeps its old entry.

The files are assembled here: KernelBench order, the measured fields (GENERATED), overrides from
the tier's `overrides.yaml`, and every hand-set field of the existing entry (`pipeline`, `dtype`,
`xfail`) kept. Each file is validated by the catalog before it is written; regenerating twice
gives byte-identical files, and `--check` writes nothing and exits 1 when a file would change.
"""

from __future__ import annotations

import sys
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

import anyio
import msgspec
import yaml

from kbd.engine import scheduler
from kbd.engine.runner import run_in_worker
from kbd.engine.spawner import Spawner, template_env
from kbd.plan import catalog, limits, schema
from kbd.plan.paths import check_output
from kbd.plan.schema import Tier
from kbd.results.record import classify
from kbd.shared.errors import InputError
from kbd.shared.protocol import Generate, Generated, Limits


@dataclass
class Measured:
    """One problem's generation: its measurement, or why there is none."""

    kernel: str
    generated: Generated | None
    failure: str = ""


def run(args: Namespace) -> int:
    """The command: exit 0 when every file is (or, with --check, already was) up to date."""
    tier = schema.TIERS[args.shapes]
    root = catalog.kernelbench_root(args.kernelbench)
    directory = tier.directory(Path(args.levels_dir)) if args.levels_dir else tier.directory()
    overrides = load_overrides(directory / "overrides.yaml")
    kernels = {level: _problems(root, level) for level in schema.LEVELS}
    selected = [
        k for ks in kernels.values() for k in ks if not args.only or k.startswith(tuple(args.only))
    ]
    if not selected:
        which = f"matches {' '.join(args.only)}" if args.only else "found"
        raise InputError(
            f"no KernelBench problem under {root} {which} "
            f"(looked for {', '.join(f'{level}/*.py' for level in schema.LEVELS)})"
        )
    mem_limit = limits.parse_size(args.mem_limit, "--mem-limit")
    # before any worker runs: where the files and logs go
    check_output(
        directory, "--levels-dir" if args.levels_dir else None, folder=True, write=not args.check
    )
    check_output(args.log_dir, "--log-dir", folder=True)
    tasks = [
        _task(root, kernel, tier, overrides.get(kernel, {}), Limits(mem_limit=mem_limit))
        for kernel in selected
    ]
    log_dir = Path(args.log_dir) if args.log_dir else Path(".kbd") / "logs" / "levels-generate"
    results = anyio.run(_measure_all, tasks, args.jobs, args.timeout, log_dir)
    by_kernel = {r.kernel: r for r in results}
    texts = {
        directory / f"{level}.yaml": assemble(
            tier, level, level_kernels, by_kernel, overrides, directory / f"{level}.yaml"
        )
        for level, level_kernels in kernels.items()
        if any(k in by_kernel for k in level_kernels)
    }
    changed = update_files(texts, check=args.check)
    failed = [r for r in results if r.generated is None]
    for r in failed:
        print(f"kbd levels generate: {r.kernel}: {r.failure} (old entry kept)", file=sys.stderr)
    if args.check:
        for path in changed:
            print(f"kbd levels generate: {path} is out of date", file=sys.stderr)
    print(
        f"{len(results)} problems measured, {len(failed)} failed; "
        f"{len(changed)} file(s) {'out of date' if args.check else 'changed'}"
    )
    return 1 if failed or (args.check and changed) else 0


def update_files(texts: dict[Path, str], *, check: bool) -> list[Path]:
    """Write each file whose text changed (none with `check`); returns the changed ones.

    Every text is validated by the catalog first: a file it would refuse is never written."""
    for path, text in texts.items():
        catalog.load_text(text, path)
    changed = [p for p, text in texts.items() if not p.exists() or p.read_text() != text]
    if not check:
        for path in changed:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(texts[path])
            print(f"wrote {path}")
    return changed


def load_overrides(path: Path) -> dict[str, dict]:
    """overrides.yaml: kernel path -> fields (OVERRIDE_FIELDS); missing file = no overrides."""
    if not path.exists():
        return {}
    try:
        data = yaml.load(path.read_text(), Loader=schema.Loader) or {}
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: malformed YAML: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: must map kernel paths to fields")
    for kernel, fields in data.items():
        if not isinstance(fields, dict):
            raise InputError(f"{path}: {kernel}: must be a mapping of fields")
        unknown = sorted(set(fields) - set(schema.OVERRIDE_FIELDS))
        if unknown:
            raise InputError(
                f"{path}: {kernel}: unknown field {unknown[0]!r} "
                f"(known: {', '.join(schema.OVERRIDE_FIELDS)})"
            )
    return data


def _problems(root: Path, level: str) -> list[str]:
    files = sorted((root / level).glob("*.py"), key=lambda p: schema.problem_number(p.name))
    return [f"{level}/{p.name}" for p in files]


def _task(root: Path, kernel: str, tier: Tier, override: dict, lim: Limits) -> Generate:
    return Generate(
        kernel=kernel,
        source=str(root / kernel),
        source_text=(root / kernel).read_text(),
        budget=tier.budget,
        limits=lim,
        input_shapes=override.get("input_shapes"),
        init_args=override.get("init_args"),
    )


async def _measure_all(tasks: list[Generate], jobs: int, timeout: float, log_dir: Path):
    """Measure every task in its own worker, `jobs` at a time, each pinned to its own cores."""
    slots = scheduler.core_slots(limits.usable_cores(), jobs)
    free = list(slots)
    results: list[Measured] = []
    env = template_env(len(slots[0]))
    async with Spawner.started(env, log_dir / "template.log") as spawner:
        limiter = anyio.Semaphore(len(slots))

        async def one(task: Generate) -> None:
            async with limiter:
                cores = free.pop()
                try:
                    measured = await _measure(spawner, task, cores, timeout, log_dir)
                    results.append(measured)
                    print(describe(measured), file=sys.stderr, flush=True)
                finally:
                    free.append(cores)

        async with anyio.create_task_group() as group:
            for task in tasks:
                group.start_soon(one, task)
    return results


async def _measure(spawner, task: Generate, cores, timeout: float, log_dir: Path) -> Measured:
    pinned = msgspec.structs.replace(task, limits=msgspec.structs.replace(task.limits, cores=cores))
    name = task.kernel.removesuffix(".py")
    end = await run_in_worker(
        spawner,
        pinned,
        name=name,
        mem_limit=task.limits.mem_limit,
        timeout=timeout,
        log_path=log_dir / (name.replace("/", "__") + ".log"),
    )
    if isinstance(end.result, Generated):
        return Measured(task.kernel, end.result)
    outcome, phase, signal, message = classify(
        end.result, end.death(task.limits.mem_limit, timeout)
    )
    failure = f"{outcome} in {phase}" + (f" ({signal})" if signal else "") + f": {message}"
    return Measured(task.kernel, None, failure)


def describe(m: Measured) -> str:
    """One progress line: what was kept or reduced, bytes and GFLOP before and after."""
    g = m.generated
    if g is None:
        return f"FAILED {m.kernel}: {m.failure}"
    size = limits.format_size
    if not g.reductions:
        what = "KernelBench's shapes"
    elif g.reductions[0][0] == "overrides.yaml":
        what = f"{g.reductions[0][2]} from overrides.yaml"
    else:
        what = ", ".join(f"{name} {old}->{new}" for name, old, new in g.reductions)
    return (
        f"{'ok' if g.fits else 'OVER'}   {m.kernel}: {what} | {size(g.original_nbytes)} -> "
        f"{size(g.nbytes)}, {g.original_flops / 1e9:.4g} -> {g.flops / 1e9:.4g} GFLOP"
    )


def assemble(
    tier: Tier,
    level: str,
    kernels: list[str],
    results: dict[str, Measured],
    overrides: dict[str, dict],
    path: Path,
) -> str:
    """The new text of one levels file; kernels without a new measurement keep their entry."""
    old_entries, old_comments = schema.parse(path.read_text()) if path.exists() else ([], {})
    old = {e.get("kernel"): e for e in old_entries}
    entries, comments = [], {}
    for kernel in kernels:
        result = results.get(kernel)
        if result is None or result.generated is None:
            if kernel in old:
                entries.append(old[kernel])
                if kernel in old_comments:
                    comments[kernel] = old_comments[kernel]
            continue
        override = overrides.get(kernel, {})
        entries.append(entry(kernel, result.generated, override, old.get(kernel, {})))
        notes = [override["reason"]] if "reason" in override else []
        g = result.generated
        if not g.fits:
            notes.append(
                f"over the {tier.name} budget: {limits.format_size(g.nbytes)}, "
                f"{_round6(g.flops / 1e9)} GFLOP"
            )
        if notes:
            comments[kernel] = notes
    return schema.dump(tier.header(level), entries, comments)


def entry(kernel: str, g: Generated, override: dict, old: dict) -> dict:
    """One entry: measured fields, then extra measured fields unless hand-set, then overrides
    and the hand-set fields of the existing entry."""
    new: dict = {
        "kernel": kernel,
        "input_shapes": list(g.input_shapes),
        "initializations": list(g.initializations),
        "output_shape": _output_shape(g.outputs),
    }
    if g.init_args:
        new["init_args"] = list(g.init_args)
    new["gflops"] = _round6(g.flops / 1e9)
    new.update({k: v for k, v in g.fields.items() if k in schema.GENERATED or k not in old})
    for key, value in override.items():
        if key in ("input_shapes", "reason"):
            continue  # measured at them / written as a comment
        new[key] = _round6(float(value)) if key == "gflops" else value
    for key in schema.HAND_SET:
        if key in old and key not in override:
            new[key] = old[key]
    return new


def _output_shape(outputs):
    def one(dims):
        return "x".join(map(str, dims)) if dims else "scalar"

    return one(outputs[0]) if len(outputs) == 1 else [one(d) for d in outputs]


def _round6(x: float) -> float:
    return float(f"{x:.6g}")
