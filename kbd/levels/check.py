"""`kbd levels check`: validate every levels file without torch and without running anything.

Checks, in order:
1. every `levels/*.yaml` and `levels/<tier>/*.yaml` loads through the catalog (schema, shapes,
   inits, xfail), and no kernel appears twice within a tier;
2. each tier's `overrides.yaml` is well formed and names only kernels of that tier's files;
3. each generated file (`level1-3.yaml` of a tier) has exactly the generator's layout and header,
   so a regeneration changes only what measurement changes;
4. when KernelBench is found (`--kernelbench`, $KBD_KERNELBENCH, the submodule): every listed
   kernel exists there and every problem of level1-3 has an entry in each tier. Without
   KernelBench (a fresh clone before `git submodule update --init`) this part is skipped with a
   note, and the command still exits 0 when the rest holds; a `--kernelbench DIR` that does
   not exist is an error (exit status 2).

Whether the measured fields are up to date needs torch and minutes: `kbd levels generate --check`.
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

from kbd.levels import generate
from kbd.plan import catalog, schema
from kbd.shared.errors import InputError


def run(args: Namespace) -> int:
    levels_dir = Path(args.levels_dir) if args.levels_dir else schema.LEVELS_DIR
    if not levels_dir.is_dir():
        raise InputError(f"--levels-dir {levels_dir}: no such folder")
    if args.kernelbench:  # named on the command line: a typo, not a clone without the submodule
        catalog.kernelbench_root(args.kernelbench)
    problems: list[str] = []
    listed: dict[str, set[str]] = {}  # tier -> kernels
    for name, tier in schema.TIERS.items():
        directory = tier.directory(levels_dir)
        files = sorted(directory.glob("*.yaml"))
        files = [f for f in files if f.name != "overrides.yaml"]
        if not files:
            continue
        kernels: dict[str, Path] = {}  # in a generated file
        selected: set[str] = set()  # in another file of the folder (ci.yaml)
        for path in files:
            try:
                entries = catalog.load_file(path)
            except InputError as exc:
                problems.append(str(exc))
                continue
            generated = path.stem in schema.LEVELS  # others (ci.yaml) are selections
            for e in entries:
                if not generated:
                    selected.add(e.kernel)
                elif e.kernel in kernels:
                    problems.append(f"{path}: {e.kernel} is also listed in {kernels[e.kernel]}")
                else:
                    kernels[e.kernel] = path
            if generated:
                problems.extend(_layout(tier, path))
            print(f"{path}: {len(entries)} entries")
        listed[name] = set(kernels) | selected
        problems.extend(_overrides(directory / "overrides.yaml", set(kernels)))
    if not listed:
        raise InputError(f"--levels-dir {levels_dir}: no levels files (*.yaml) to check")
    problems.extend(_against_kernelbench(args.kernelbench, listed))
    for problem in problems:
        print(f"kbd levels check: {problem}")
    print(f"{'ok' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


def _layout(tier: schema.Tier, path: Path) -> list[str]:
    text = path.read_text()
    entries, comments = schema.parse(text)
    expected = schema.dump(tier.header(path.stem), entries, comments)
    if text == expected:
        return []
    for number, (got, want) in enumerate(
        zip(text.splitlines(), expected.splitlines(), strict=False), 1
    ):
        if got != want:
            return [f"{path}:{number}: not in the generator's layout (expected {want!r})"]
    return [f"{path}: not in the generator's layout (length differs)"]


def _overrides(path: Path, kernels: set[str]) -> list[str]:
    try:
        overrides = generate.load_overrides(path)
    except InputError as exc:
        return [str(exc)]
    return [
        f"{path}: {k} is in no levels file of this folder" for k in overrides if k not in kernels
    ]


def _against_kernelbench(option: str | None, listed: dict[str, set[str]]) -> list[str]:
    try:
        root = catalog.kernelbench_root(option)
    except InputError as exc:
        print(f"note: {exc}; skipped checking the kernels against KernelBench")
        return []
    problems = []
    every = {
        str(p.relative_to(root)) for level in schema.LEVELS for p in (root / level).glob("*.py")
    }
    for tier, kernels in listed.items():
        problems += [f"{tier}: {k} does not exist in {root}" for k in sorted(kernels - every)]
        if tier in schema.TIERS:
            missing = sorted(every - kernels)
            problems += [f"{tier}: KernelBench problem {k} has no entry" for k in missing]
    print(f"checked against KernelBench at {root}: {len(every)} problems")
    return problems
