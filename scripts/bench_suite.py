"""The test suite's wall time: a baseline revision against a newer one, back to back, as CI runs it.

Each revision is checked out into a temporary git worktree (as a fresh clone: no KernelBench, no
caches, no daemon) and runs the pytest command of its own `scripts/test` (the README's test
command, without the bootstrap and ruff), with this tree's virtual environment. The two
alternate, `--rounds` times. With `--subset MODULE ...`, the newer revision also runs those test
modules only (e.g. the ones that descend from the baseline's, to compare like with like when
features with their own tests have landed since).

Prints, per run, pytest's summary, the wall time and the machine's busy CPU time over the run
(from /proc/stat: every process on the machine, daemons and Ray included), then the ratios.
Run it with `scripts/bench-suite --baseline REV [--head REV] [--rounds N] [--subset MODULE ...]`.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kbd.commands.doctor import machine_line

ROOT = Path(__file__).resolve().parent.parent
PYTEST_LINE = re.compile(r"^exec \.venv/bin/python -m pytest(?P<args>.*)$", re.MULTILINE)
SUMMARY = re.compile(r"^=*\s*(?P<summary>\d+ (passed|failed).*) in [\d.]+s", re.MULTILINE)


def busy_cpu_s() -> float:
    """Seconds of CPU the whole machine has spent busy since boot (all cores)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def pytest_args(tree: Path) -> list[str]:
    """The arguments `scripts/test` of `tree` gives pytest (without the user's "$@")."""
    found = PYTEST_LINE.search((tree / "scripts" / "test").read_text())
    if found is None:
        sys.exit(f"{tree / 'scripts' / 'test'}: no `exec .venv/bin/python -m pytest` line")
    return [a for a in shlex.split(found["args"]) if a != "$@"]


def run_suite(tree: Path, extra: list[str]) -> dict:
    command = [sys.executable, "-m", "pytest", *pytest_args(tree), "-q", "-p", "no:cacheprovider"]
    env = {k: v for k, v in os.environ.items() if k not in ("KBD_KERNELBENCH", "PYTHONPATH")}
    env["PYTHONPATH"] = str(tree)
    cpu, start = busy_cpu_s(), time.monotonic()
    done = subprocess.run([*command, *extra], cwd=tree, env=env, capture_output=True, text=True)
    wall, cpu = time.monotonic() - start, busy_cpu_s() - cpu
    summary = SUMMARY.search(done.stdout)
    return {
        "wall": wall,
        "cpu": cpu,
        "summary": summary["summary"] if summary else f"exit {done.returncode}: no summary",
        "ok": done.returncode == 0,
    }


def short_hash(rev: str) -> str:
    """The commit `rev` names, abbreviated (a usage error, status 2, when it names none)."""
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "--verify",
                            f"{rev}^{{commit}}"], capture_output=True, text=True)  # fmt: skip
    if found.returncode != 0:
        print(f"bench-suite: error: {rev}: {found.stderr.strip()}", file=sys.stderr)
        sys.exit(2)
    return found.stdout.strip()


def worktree(rev: str, path: Path) -> None:
    """Check `rev` out at `path` (a fresh clone's view: tracked files only)."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev],
                   check=True, capture_output=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare against")
    parser.add_argument("--head", default="HEAD", help="the newer revision (default: HEAD)")
    parser.add_argument("--rounds", type=int, default=1, help="baseline/head pairs (default 1)")
    parser.add_argument(
        "--subset", nargs="+", metavar="MODULE", default=[],
        help="also run the head with only these test modules (tests/test_x.py ...)",
    )  # fmt: skip
    args = parser.parse_args()
    if subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                      capture_output=True, text=True).stdout.strip():  # fmt: skip
        print("note: this tree has uncommitted changes; they are not measured", file=sys.stderr)
    base, head = short_hash(args.baseline), short_hash(args.head)
    variants: list[tuple[str, str, list[str]]] = [
        (f"baseline {base}", base, []),
        (f"head {head}", head, []),
    ]
    if args.subset:
        variants.append((f"head {head}, {len(args.subset)} modules", head, args.subset))
    results: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    print(machine_line(), f"{os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory(prefix="kbd-bench-suite-") as tmp:
        trees = {rev: Path(tmp) / f"tree{i}" for i, rev in enumerate({base, head})}
        try:
            for rev, path in trees.items():
                worktree(rev, path)
            for round_ in range(1, args.rounds + 1):
                for name, rev, extra in variants:
                    result = run_suite(trees[rev], extra)
                    results[name].append(result)
                    figures = f"wall {result['wall']:.1f} s, machine CPU {result['cpu']:.1f} s"
                    print(f"round {round_} {name}: {result['summary']}; {figures}", flush=True)
        finally:
            for path in trees.values():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(path)], check=False)  # fmt: skip
    first = results[variants[0][0]]
    base_wall = statistics.median(r["wall"] for r in first)
    base_cpu = statistics.median(r["cpu"] for r in first)
    print(f"{'':<44}{'wall s':>10}{'CPU s':>10}{'wall ratio':>12}{'CPU ratio':>11}")
    for name, runs in results.items():
        wall = statistics.median(r["wall"] for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        print(
            f"{name:<44}{wall:>10.1f}{cpu:>10.1f}{wall / base_wall:>12.2f}{cpu / base_cpu:>11.2f}"
        )
    sys.exit(0 if all(r["ok"] for runs in results.values() for r in runs) else 1)


if __name__ == "__main__":
    main()
