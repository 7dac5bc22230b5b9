"""Measure what the JIT's optimisation level costs and saves on a smoke sample.

Runs the same kernels at smoke shapes with `kbd run -O A` and `kbd run -O B` (the default
scalar pipeline, `-j 1`, the import cache off so every run pays the same), alternating the two
levels round by round so drift hits both. Prints per-phase totals for each level, the ratio
B/A, and any kernel whose outcome or passing tolerance differs between the two.
Run it with `scripts/bench-smoke-jit [--levels-a 3] [--level-b 1] [--rounds 1] [PREFIX ...]`.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = [
    "level1/1_", "level1/12_", "level1/23_", "level1/40_", "level1/54_", "level1/82_",
    "level2/1_", "level2/17_", "level2/40_", "level2/76_",
    "level3/1_", "level3/9_", "level3/20_",
]  # fmt: skip
PHASES = ("load", "reference", "import", "pipeline", "jit", "run", "check")


def run(level: int, prefixes: list[str], cwd: Path) -> dict[str, dict]:
    command = [sys.executable, "-m", "kbd", "run", *prefixes, "-O", str(level), "-j", "1",
               "--json", "--no-import-cache", "--timeout", "600"]  # fmt: skip
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {r["kernel"]: r for r in records}


def cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefixes", nargs="*", default=SAMPLE)
    parser.add_argument("--level-a", type=int, default=3)
    parser.add_argument("--level-b", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    levels = (args.level_a, args.level_b)
    totals: dict[int, dict[str, float]] = {level: defaultdict(float) for level in levels}
    seen: dict[int, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for level in levels:
                records = run(level, args.prefixes, Path(tmp))
                seen[level] = records
                for r in records.values():
                    for phase, seconds in r["times"].items():
                        totals[level][phase] += seconds
                    totals[level]["wall"] += r["wall_s"]
    a, b = levels
    print(f"CPU: {cpu()}; {len(seen[a])} kernels, {args.rounds} round(s); -O{a} then -O{b}")
    print(f"{'phase':<10}{'-O' + str(a):>10}{'-O' + str(b):>10}{'ratio':>8}")
    for phase in (*PHASES, "wall"):
        ta, tb = totals[a][phase], totals[b][phase]
        ratio = f"{tb / ta:.2f}" if ta else "-"
        print(f"{phase:<10}{ta:>10.1f}{tb:>10.1f}{ratio:>8}")
    for kernel in sorted(seen[a]):
        ra, rb = seen[a][kernel], seen[b].get(kernel, {})
        key_a = (ra["outcome"], ra.get("passing_tolerance"))
        key_b = (rb.get("outcome"), rb.get("passing_tolerance"))
        if key_a != key_b:
            print(f"differs: {kernel}: -O{a} {key_a}, -O{b} {key_b}")
    outcomes = {level: sorted({r["outcome"] for r in seen[level].values()}) for level in levels}
    print(f"outcomes: -O{a} {outcomes[a]}, -O{b} {outcomes[b]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
