"""Measure what the daemon and the import cache buy, both sides in one run.

1. `kbd run` of one small level-1 kernel (ReLU on 16x1024), end to end (the whole command),
   without a daemon (`--no-daemon`) and with a warm daemon.
2. Marginal cost per trivial kernel in a sweep through a warm daemon: (wall of N kernels - wall
   of 1) / (N - 1), with a cold import cache (emptied before each sweep) and a warm one. The
   trivial kernels are eight level-1 activations at 16x1024 (a scratch levels file), not at
   their smoke shapes (16x393216), where the scalar loops themselves take seconds.
3. `-j 2` against `-j 1` on eight compute-bound kernels (level-1 matmuls at smoke shapes),
   with a warm daemon.

Needs KernelBench (KBD_KERNELBENCH or the submodule). Prints the CPU, medians and ratios.
Run it with `scripts/bench-daemon [--samples N]`; it uses a scratch directory and stops the
daemon it started.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMALL = "level1/19_"  # ReLU
TRIVIAL = [f"level1/{n}_" for n in (19, 20, 21, 22, 25, 26, 29, 30)]  # elementwise activations
COMPUTE = [f"level1/{n}_" for n in (1, 2, 3, 4, 6, 7, 8, 9)]  # matmuls
LEVELS = str(ROOT / "levels" / "level1.yaml")
TINY = "16x1024"


def tiny_levels(path: Path) -> str:
    """A levels file with the trivial kernels at a tiny shape; returns its path."""
    sys.path.insert(0, str(ROOT))
    from kbd import catalog

    names = sorted(p.name for p in (catalog.kernelbench_root(None) / "level1").glob("*.py"))
    lines = []
    for prefix in TRIVIAL:
        name = next(n for n in names if n.startswith(prefix.split("/")[1]))
        lines += [
            f"- kernel: level1/{name}",
            f"  input_shapes: [{TINY}]",
            "  initializations: [rnd]",
            f"  output_shape: {TINY}",
        ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def kbd(cwd: Path, *args: str) -> float:
    """Wall seconds of one `kbd` command (it must succeed)."""
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "kbd", *args], cwd=cwd, capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    if result.returncode not in (0, 1):
        sys.exit(f"kbd {' '.join(args)} failed:\n{result.stderr}")
    return wall


def median(cwd: Path, samples: int, *args: str, before=lambda: None) -> float:
    walls = []
    for _ in range(samples):
        before()
        walls.append(kbd(cwd, *args))
    return statistics.median(walls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args()
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        "unknown CPU",
    )
    print(f"CPU: {cpu}; {samples_note(args.samples)}")
    with tempfile.TemporaryDirectory(prefix="kbd-bench-daemon-") as scratch:
        cwd = Path(scratch)
        cache = cwd / ".kbd" / "import-cache"
        common = ("--levels", tiny_levels(cwd / "tiny.yaml"))
        try:
            cold = median(cwd, args.samples, "run", *common, SMALL, "--no-daemon")
            started = time.perf_counter()
            kbd(cwd, "daemon", "start")
            print(f"daemon start (until warm): {time.perf_counter() - started:.2f}s")
            kbd(cwd, "run", *common, SMALL)  # fill the import cache for this kernel
            warm = median(cwd, args.samples, "run", *common, SMALL)
            print(
                f"1. kbd run {SMALL}: without daemon {cold:.2f}s, warm daemon {warm:.2f}s "
                f"({cold / warm:.1f}x)"
            )

            def empty_cache() -> None:
                shutil.rmtree(cache, ignore_errors=True)

            sweep = ("sweep", *common, "--db", str(cwd / ".kbd" / "results.db"))
            for label, before in (("cold import cache", empty_cache), ("warm import cache", None)):
                before = before or (lambda: None)
                if label.startswith("warm"):
                    kbd(cwd, *sweep, *TRIVIAL)
                one = median(cwd, args.samples, *sweep, TRIVIAL[0], before=before)
                many = median(cwd, args.samples, *sweep, *TRIVIAL, before=before)
                marginal = (many - one) / (len(TRIVIAL) - 1)
                print(
                    f"2. {label}: 1 kernel {one:.2f}s, {len(TRIVIAL)} kernels {many:.2f}s, "
                    f"marginal {marginal:.3f}s per kernel"
                )
            compute = ("sweep", "--levels", LEVELS, "--db", str(cwd / ".kbd" / "results.db"))
            kbd(cwd, *compute, *COMPUTE, "-j", "1")  # warm both templates and the cache
            j1 = median(cwd, args.samples, *compute, *COMPUTE, "-j", "1")
            j2 = median(cwd, args.samples, *compute, *COMPUTE, "-j", "2")
            print(
                f"3. {len(COMPUTE)} compute-bound kernels: -j 1 {j1:.2f}s, -j 2 {j2:.2f}s "
                f"({j1 / j2:.2f}x)"
            )
        finally:
            kbd(cwd, "daemon", "stop", "--now")


def samples_note(samples: int) -> str:
    return f"median of {samples} samples per figure"


if __name__ == "__main__":
    main()
