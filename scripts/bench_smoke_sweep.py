"""Full smoke sweep: a baseline revision of kbd against this tree, back to back, same machine.

Runs `kbd sweep --smoke-test -j N` over the whole catalog (or the given prefixes) for each
variant in turn: the baseline revision (checked out into a temporary git worktree and run with
this tree's virtual environment), this tree, and optionally this tree with `--no-sandbox` (what
containment costs; it runs first). Every variant gets a fresh results database, empty import and
compile caches and no daemon, so each pays what a fresh clone pays. Prints the CPU, outcome
counts per level, wall time, per-phase totals summed over kernels, the ratios against the first
variant, and every kernel whose outcome differs between variants.
Run it with `scripts/bench-smoke-sweep [--baseline REV] [--no-sandbox-variant] [PREFIX ...]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("load", "reference", "import", "pipeline", "jit", "run", "check")


def cpu() -> str:
    """The CPU's name, family and model, and its widest x86 vector extension."""
    info: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    if "model name" not in info:
        return platform.processor()
    flags = info.get("flags", "").split()
    vector = next((f for f in ("avx512f", "avx2", "sse4_2") if f in flags), "no avx")
    return f"{info['model name']} (family {info['cpu family']} model {info['model']}, {vector})"


def sweep(
    tree: Path, extra: list[str], prefixes: list[str], jobs: int, scratch: Path, cwd: Path
) -> dict:
    """Run one smoke sweep of `tree`'s kbd in `cwd`; return its records by kernel and its wall
    time."""
    scratch.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "kbd", "sweep", "--smoke-test", "-j", str(jobs), "--json",
               "--db", str(scratch / "results.db"), "--log-dir", str(scratch / "logs"),
               *extra, *prefixes]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.setdefault("KBD_KERNELBENCH", str(ROOT / "third_party/KernelBench/KernelBench"))
    start = time.monotonic()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if not records:
        sys.exit(f"{' '.join(command)} (in {tree}) produced no records:\n{done.stderr[-2000:]}")
    return {"wall": wall, "records": {r["kernel"]: r for r in records}}


def totals(records: dict[str, dict]) -> dict[str, float]:
    summed: dict[str, float] = defaultdict(float)
    for record in records.values():
        for phase, seconds in record.get("times", {}).items():
            summed[phase] += seconds
        summed["kernel wall"] += record["wall_s"]
    return summed


def per_level(records: dict[str, dict]) -> str:
    counts: dict[str, Counter] = defaultdict(Counter)
    for kernel, record in records.items():
        counts[kernel.partition("/")[0]][record["outcome"]] += 1
    return "; ".join(
        f"{level}: " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(c.items()))
        for level, c in sorted(counts.items())
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefixes", nargs="*", help="kernel prefixes (default: all 250)")
    parser.add_argument("--baseline", default=None, help="git revision to compare against")
    parser.add_argument("--no-sandbox-variant", action="store_true",
                        help="also run this tree with --no-sandbox")  # fmt: skip
    parser.add_argument("-j", "--jobs", type=int, default=2)
    args = parser.parse_args()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="kbd-smoke-sweep-") as tmp:
        scratch = Path(tmp)
        if args.baseline:
            tree = scratch / "baseline-tree"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree),
                            args.baseline], check=True, capture_output=True)  # fmt: skip
            try:
                results[f"baseline {args.baseline}"] = sweep(
                    tree, [], args.prefixes, args.jobs, scratch / "baseline", cwd=tree
                )
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(tree)], check=False)  # fmt: skip
        # Each variant of this tree runs in its own empty folder: its import and compile caches
        # (<cwd>/.kbd) start empty, as in a fresh clone, and one variant never reuses what
        # another compiled. --no-sandbox runs first: were order to favour either, not the
        # sandboxed one.
        variants = [("this tree", ["--no-daemon"], scratch / "head")]
        if args.no_sandbox_variant:
            bare = ("this tree --no-sandbox", ["--no-daemon", "--no-sandbox"], scratch / "bare")
            variants.insert(0, bare)
        for name, extra, folder in variants:
            results[name] = sweep(ROOT, extra, args.prefixes, args.jobs, folder, cwd=folder)
    names = list(results)
    first = names[0]
    print(f"CPU: {cpu()}, {os.cpu_count()} cores; kbd sweep --smoke-test -j {args.jobs}")
    for name in names:
        records = results[name]["records"]
        print(f"{name}: {len(records)} kernels; {per_level(records)}")
    header = f"{'':<14}" + "".join(f"{name:>26}" for name in names)
    print(header + ("".join(f"{'/ ' + first:>26}" for _ in names[1:])))
    sums = {name: totals(results[name]["records"]) for name in names}
    for row in ("sweep wall", "kernel wall", *PHASES):
        values = [results[n]["wall"] if row == "sweep wall" else sums[n][row] for n in names]
        ratios = [f"{v / values[0]:.2f}" if values[0] else "-" for v in values[1:]]
        print(f"{row:<14}" + "".join(f"{v:>26.1f}" for v in values)
              + "".join(f"{r:>26}" for r in ratios))  # fmt: skip
    base = results[first]["records"]
    for name in names[1:]:
        for kernel in sorted(set(base) | set(results[name]["records"])):
            a = base.get(kernel, {}).get("outcome")
            b = results[name]["records"].get(kernel, {}).get("outcome")
            if a != b:
                print(f"differs: {kernel}: {first} {a}, {name} {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
