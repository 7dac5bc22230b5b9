"""How close `kbd tune`'s search gets to the best configuration within a budget, on spaces small
enough to measure whole.

For each selected kernel (its family schedule's space at most --max-space configurations),
`kbd tune --budget <whole space>` measures every configuration into a database of its own (a
rerun reuses it: only what is missing is measured). Then the search (kbd.tune.search) is
replayed against those measurements with `--budget` (default 50) for ten seeds, the tuner's own
(0) first: a kernel reaches when the best configuration the search measured is within 95% of
the exhaustive best. Prints one line per kernel and the share of kernels that reach with seed 0
and on average over the seeds; the CPU is named. The acceptance: at least 80% of kernels.

    scripts/tune-quality [--budget 50] [--max-space 150] [--db .kbd/tune-quality.db] PREFIX...
        [-- KBD-TUNE-OPTIONS]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kbd.plan import space, tuned  # noqa: E402
from kbd.plan.target import cpu_model  # noqa: E402
from kbd.results.tuning import Trial  # noqa: E402
from kbd.tune.search import Search  # noqa: E402

SEEDS = range(10)
REACH = 0.95


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kernels", nargs="+", metavar="PREFIX")
    parser.add_argument("--budget", type=int, default=50)
    parser.add_argument("--max-space", type=int, default=150)
    parser.add_argument("--db", default=".kbd/tune-quality.db")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    options = parser.parse_args(argv[:split])
    extra = argv[split + 1 :]
    command = [sys.executable, "-m", "kbd", "tune", *options.kernels, "--db", options.db]
    command += ["--budget", str(options.max_space), *extra]
    print("measuring every configuration:", " ".join(command[2:]), file=sys.stderr)
    subprocess.run(command, check=False)
    reached_first, shares, lines = 0, [], []
    for _task, kernel, descriptor, trials in _exhaustive(Path(options.db), options.max_space):
        timed = [t for t in trials if t.timed]
        if not timed:
            continue
        top = max(t.speedup for t in timed)
        loaded = space.load(_path(descriptor))
        configs = _configs(loaded, trials)
        reached = []
        for seed in SEEDS:
            found = _replay(loaded, configs, trials, options.budget, seed)
            reached.append(found >= REACH * top)
        reached_first += reached[0]
        shares.append(sum(reached) / len(reached))
        lines.append(
            f"{kernel:60} {len(configs):>5} configs  best {top:6.3g}x  seed 0 "
            f"{'reaches' if reached[0] else 'misses '}  {sum(reached)}/{len(reached)} seeds"
        )
    print(f"CPU: {cpu_model(['avx2', 'avx512f'])}; budget {options.budget}, 95% of the best")
    print("\n".join(lines))
    if not shares:
        print("no kernel with a whole space measured")
        return 1
    print(
        f"{reached_first} of {len(shares)} kernels reach with seed 0"
        f" ({100 * reached_first / len(shares):.0f}%); {100 * sum(shares) / len(shares):.0f}%"
        " over ten seeds"
    )
    return 0


def _path(descriptor: str) -> Path:
    path = Path(descriptor)
    return path if path.is_absolute() else ROOT / "schedules" / path


def _exhaustive(db: Path, max_space: int):
    """(task, kernel, descriptor, trials) of each task whose space was measured whole."""
    with sqlite3.connect(db) as connection:
        tasks = connection.execute("SELECT DISTINCT task, kernel FROM trials").fetchall()
        for task, kernel in tasks:
            rows = connection.execute(
                "SELECT config, outcome, phase, speedup, low, high FROM trials"
                " WHERE task = ? AND stage = 'search'",
                (task,),
            ).fetchall()
            record = connection.execute(
                "SELECT record FROM trials WHERE task = ? LIMIT 1", (task,)
            ).fetchone()
            descriptor = json.loads(record[0])["pipeline"].split("{")[0]
            trials = {}
            for config, outcome, phase, speedup, low, high in rows:
                trials[config] = Trial(
                    config=json.loads(config),
                    stage="search",
                    outcome=outcome,
                    phase=phase,
                    speedup=speedup,
                    low=low,
                    high=high,
                )
            loaded = space.load(_path(descriptor))
            if loaded is None or len(trials) < len(_configs(loaded, list(trials.values()))):
                continue
            if len(trials) > max_space:
                continue
            yield task, kernel, descriptor, list(trials.values())


def _configs(loaded: space.Space, trials: list[Trial]) -> list:
    """The space's valid configurations in the tuner's order, from the measured ones (the
    target's constraints were applied when they were measured)."""
    measured = {tuned.config_text(t.config) for t in trials}
    everything = loaded.configs(space.Target(lanes=16, vregs=32)) + loaded.configs(
        space.Target(lanes=8, vregs=16)
    )
    ordered, seen = [], set()
    for config in everything:
        text = tuned.config_text(config)
        if text in measured and text not in seen:
            ordered.append(config)
            seen.add(text)
    return ordered


def _replay(loaded, configs, trials: list[Trial], budget: int, seed: int) -> float:
    """The best speedup the search finds within `budget`, with the measurements as oracle."""
    oracle = {tuned.config_text(t.config): t for t in trials}
    search = Search(loaded, configs, budget, seed=seed)
    seen: list[Trial] = []
    while batch := search.next(seen, 4):
        seen += [oracle[tuned.config_text(c)] for c in batch]
    timed = [t.speedup for t in seen if t.timed]
    return max(timed) if timed else 0.0


if __name__ == "__main__":
    sys.exit(main())
