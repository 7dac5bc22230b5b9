"""Measure what the daemon and its caches buy, both sides in one run.

1. `kbd run` of one small level-1 kernel, end to end (the whole command, client start-up
   included), without a daemon (`--no-daemon`) and with a warm daemon: ReLU on 16x1024 (a
   scratch levels file), and `kbd run level1/19_` as typed (the default catalog, ReLU at its smoke
   shape 16x393216). With a warm daemon each is measured with warm caches (a rerun), with the
   compile cache emptied before each sample (the pipeline and JIT run; the import cache is
   warm) and with both caches emptied.
2. Marginal cost per trivial kernel in a sweep through a warm daemon: (wall of N kernels - wall
   of 1) / (N - 1), with both caches emptied before each sweep ("cold": import, pipeline, JIT),
   with only the compile cache emptied (a re-sweep with another pipeline) and with both warm.
   The trivial kernels are eight level-1 activations at 16x1024 (a scratch levels file), not at
   their smoke shapes (16x393216), where the scalar loops themselves take much longer.
3. `-j 2` against `-j 1` on eight level-1 matmuls with a warm daemon: at smoke shapes through
   their family schedules (about 0.1 s each, mostly the worker's fixed work: fork, inputs,
   eager reference, check), with warm caches and with the compile cache bypassed
   (`--no-compile-cache`: each kernel pays its pipeline and JIT too); and compute-bound, at bench
   shapes through the scalar pipeline (`--shapes bench --schedules scalar`, about 1-2 s of loops
   each), with warm caches.

Every command runs with the default options (not timed: the JIT at -O2). Needs KernelBench
(KBD_KERNELBENCH or the submodule). Prints the CPU, the load average before and after (figures
taken on a shared machine are contended), medians and ratios. Run it with
`scripts/bench-daemon [--samples N]`; it uses a scratch directory and stops the daemon it
started.
"""

from __future__ import annotations

import argparse
import os
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
CACHES = ("import-cache", "compile-cache")


def tiny_levels(path: Path) -> str:
    """A levels file with the trivial kernels at a tiny shape; returns its path."""
    sys.path.insert(0, str(ROOT))
    from kbd.plan import catalog

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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    print(f"CPU: {cpu}, {os.cpu_count()} cores; median of {args.samples} samples per figure")
    print(f"load average before: {_load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="kbd-bench-daemon-") as scratch:
        cwd = Path(scratch)

        def empty(*names: str):
            def before() -> None:
                for name in names:
                    shutil.rmtree(cwd / ".kbd" / name, ignore_errors=True)

            return before

        tiny = ("--levels", tiny_levels(cwd / "tiny.yaml"))
        try:
            runs = {"tiny": (*tiny, SMALL), "as typed": (SMALL,)}
            alone = {
                name: median(cwd, args.samples, "run", *command, "--no-daemon")
                for name, command in runs.items()
            }
            started = time.perf_counter()
            kbd(cwd, "daemon", "start")
            print(f"daemon start (until warm): {time.perf_counter() - started:.2f}s", flush=True)
            for name, command in runs.items():
                kbd(cwd, "run", *command)  # fill the caches for this kernel
                warm = median(cwd, args.samples, "run", *command)
                cold_compile = median(
                    cwd, args.samples, "run", *command, before=empty("compile-cache")
                )
                cold = median(cwd, args.samples, "run", *command, before=empty(*CACHES))
                print(
                    f"1. kbd run {SMALL} ({name}): without daemon {alone[name]:.2f}s; warm daemon "
                    f"{warm:.2f}s with warm caches ({alone[name] / warm:.1f}x), "
                    f"{cold_compile:.2f}s with the compile cache empty, "
                    f"{cold:.2f}s with both caches empty",
                    flush=True,
                )

            sweep = ("sweep", *tiny, "--db", str(cwd / ".kbd" / "results.db"))
            for label, before in (
                ("cold caches", empty(*CACHES)),
                ("cold compile cache, warm import cache", empty("compile-cache")),
                ("warm caches", lambda: None),
            ):
                kbd(cwd, *sweep, *TRIVIAL)  # fill the import cache (and the compile cache)
                one = median(cwd, args.samples, *sweep, TRIVIAL[0], before=before)
                many = median(cwd, args.samples, *sweep, *TRIVIAL, before=before)
                marginal = (many - one) / (len(TRIVIAL) - 1)
                print(
                    f"2. {label}: 1 kernel {one:.2f}s, {len(TRIVIAL)} kernels {many:.2f}s, "
                    f"marginal {marginal:.3f}s per kernel",
                    flush=True,
                )
            compute = ("sweep", *COMPUTE, "--db", str(cwd / ".kbd" / "results.db"))
            for label, extra in (
                ("smoke shapes, family schedules, warm caches", ("--levels", LEVELS)),
                ("smoke shapes, family schedules, --no-compile-cache",
                 ("--levels", LEVELS, "--no-compile-cache")),
                ("compute-bound: bench shapes, scalar pipeline, warm caches",
                 ("--shapes", "bench", "--schedules", "scalar")),
            ):  # fmt: skip
                kbd(cwd, *compute, *extra, "-j", "1")  # warm both templates and caches
                j1 = median(cwd, args.samples, *compute, *extra, "-j", "1")
                j2 = median(cwd, args.samples, *compute, *extra, "-j", "2")
                print(
                    f"3. {len(COMPUTE)} level-1 matmuls, {label}: -j 1 {j1:.2f}s, "
                    f"-j 2 {j2:.2f}s ({j1 / j2:.2f}x)",
                    flush=True,
                )
        finally:
            kbd(cwd, "daemon", "stop", "--now")
    print(f"load average after: {_load()}")


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


if __name__ == "__main__":
    main()
