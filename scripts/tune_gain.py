"""What `kbd tune` gains: tune the selected kernels, then time them tuned and untuned back to
back and compare.

In a folder of its own (--dir, its own results database, so that only this tune's adopted
configurations and the repository's `schedules/tuned.jsonl` apply), runs

    kbd tune --shapes bench PREFIX... --budget B --search-time T
    kbd sweep --benchmark --shapes bench PREFIX... --untuned
    kbd sweep --benchmark --shapes bench PREFIX...
    kbd compare UNTUNED TUNED

and prints the tune's wall time per tuned kernel (issue 26's cost: at most 10 minutes per
kernel at a budget of 100 on 2 cores) and the comparison (its geomean is the gain; the goal is
at least 1.15x with no kernel significantly slower and the same kernels passing). The CPU is
named. Options after `--` go to every kbd command (e.g. `--kernelbench DIR`, `-j 2`).

    scripts/tune-gain [--budget 12] [--search-time 0.2] [--dir .kbd/tune-gain] PREFIX...
        [-- KBD-OPTIONS]
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kbd.plan.target import cpu_model  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kernels", nargs="+", metavar="PREFIX")
    parser.add_argument("--budget", type=int, default=12)
    parser.add_argument("--search-time", type=float, default=0.2)
    parser.add_argument("--dir", default=".kbd/tune-gain")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    options = parser.parse_args(argv[:split])
    extra = argv[split + 1 :]
    folder = Path(options.dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {cpu_model(['avx2', 'avx512f'])}; in {folder}", flush=True)

    tune = ["tune", "--shapes", "bench", *options.kernels, "--budget", str(options.budget)]
    tune += ["--search-time", str(options.search_time), *extra]
    started = time.monotonic()
    status = _kbd(tune, folder)
    tune_s = time.monotonic() - started
    tasks = _tasks(folder / ".kbd" / "results.db")
    per_kernel = tune_s / tasks if tasks else float("nan")
    print(
        f"kbd tune: {tune_s:.0f} s for {tasks} kernels ({per_kernel:.0f} s per kernel), "
        f"exit status {status}",
        flush=True,
    )
    sweep = ["sweep", "--benchmark", "--shapes", "bench", *options.kernels, *extra]
    untuned = _sweep([*sweep, "--untuned"], folder)
    tuned = _sweep(sweep, folder)
    return _kbd(["compare", str(untuned), str(tuned)], folder)


def _kbd(args: list[str], folder: Path) -> int:
    command = [str(ROOT / "scripts" / "kbd"), *args]
    print("$ kbd " + " ".join(args), flush=True)
    return subprocess.run(command, cwd=folder, check=False).returncode


def _sweep(args: list[str], folder: Path) -> int:
    """Run a sweep; its id (the newest in the folder's store)."""
    _kbd(args, folder)
    with sqlite3.connect(folder / ".kbd" / "results.db") as connection:
        (sweep_id,) = connection.execute("SELECT MAX(id) FROM sweeps").fetchone()
    if sweep_id is None:
        raise SystemExit("tune-gain: the sweep stored nothing")
    return sweep_id


def _tasks(db: Path) -> int:
    """Tasks of the newest tuning session in the store."""
    with sqlite3.connect(db) as connection:
        row = connection.execute(
            "SELECT COUNT(DISTINCT task) FROM trials WHERE tune_id = (SELECT MAX(id) FROM tunes)"
        ).fetchone()
    return row[0] if row else 0


if __name__ == "__main__":
    sys.exit(main())
