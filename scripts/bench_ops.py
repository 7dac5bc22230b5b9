"""Eager, Inductor and kbd side by side for a fixed set of ops at benchmark shapes, measured by
kbd itself.

The ops (scripts/ops: matmul, batched matmul, an element-wise chain, softmax, conv2d, layer norm
and group norm at KernelBench's bench shapes) run through `kbd run --benchmark --baseline
inductor`: each in its own worker, checked against eager, then timed by the bench phase
(compiled in the JIT's own timing loop, eager and torch.compile's Inductor in Python, alternating
batches on the same pinned cores). Each op gets the schedule the finder picks for its
`pipeline:` family on this CPU, or the scalar pipeline when there is none; `--pipeline X`
replaces them all, as in kbd. The table gives median times, kbd's GFLOPS and its speedup over
eager and over Inductor with their 95% intervals, then the geometric means; the CPU is named.
Schedule work is judged by this table.

    scripts/bench-ops [--cores 0] [--bench-time 1] [--no-inductor] [OP ...] [-- KBD-RUN-OPTIONS]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPS_ROOT = ROOT / "scripts" / "ops"
OPS_LEVELS = OPS_ROOT / "levels.yaml"
sys.path.insert(0, str(ROOT))

from kbd.bench.summary import geomean  # noqa: E402
from kbd.plan.target import cpu_model  # noqa: E402
from kbd.results.stats import format_ns  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Options after -- go to kbd run as they are, e.g. `-- -O 2`.",
    )
    parser.add_argument("ops", nargs="*", help="op prefixes, e.g. 1_ or 5_conv (default: all)")
    parser.add_argument(
        "--cores",
        default="",
        help="cores for the run, e.g. 0 or 0,1 (default: the last usable core; eager then "
        "uses one thread, like compiled code without OpenMP)",
    )
    parser.add_argument("--bench-time", default="1", help="minimum seconds per side (default 1)")
    parser.add_argument("--pipeline", action="append", default=[], help="as in kbd run")
    parser.add_argument(
        "--no-inductor", action="store_true", help="time against eager only (no C++ compiles)"
    )
    # Options after `--` go to kbd run as they are: split them off before argparse, which would
    # otherwise take them for op prefixes.
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    options = parser.parse_args(argv[:split])
    extra = argv[split + 1 :]
    cores = (
        [int(c) for c in options.cores.split(",")]
        if options.cores
        else [sorted(os.sched_getaffinity(0))[-1]]
    )
    os.sched_setaffinity(0, cores)  # kbd's workers split exactly these cores
    selection = [f"level1/{op}" for op in options.ops]
    command = [
        sys.executable,
        "-m",
        "kbd",
        "run",
        "--json",
        "--benchmark",
        "--bench-time",
        options.bench_time,
        *([] if options.no_inductor else ["--baseline", "inductor"]),
        "-j",
        "1",
        "--levels",
        str(OPS_LEVELS),
        "--kernelbench",
        str(OPS_ROOT),
        *[a for p in options.pipeline for a in ("--pipeline", p)],
        *extra,
        *selection,
    ]
    print(f"CPU: {cpu_model()}; cores {','.join(map(str, cores))}", flush=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    if done.returncode == 2:
        return 2
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    header = (
        f"{'op':<22}{'eager':>10}{'Inductor':>10}{'kbd':>10}{'kbd GF/s':>10}"
        f"{'/ eager':>9}  {'95% interval':<16}{'/ Inductor':>11}  {'95% interval':<16}"
        f"{'n':>5}  pipeline"
    )
    print(header)
    for r in records:
        name = r["kernel"].split("/", 1)[1]
        pipeline = r["pipeline"]  # as the record says it ran (kbd.plan.pipelines)
        b = r["bench"]
        if b is None:
            print(f"{name:<22}{r['outcome']} in {r['phase']}: {r['message'][:80]}  ({pipeline})")
            continue
        c, e, i = b["compiled"], b["eager"], b["inductor"]
        interval = f"[{b['speedup_low']:.3g}, {b['speedup_high']:.3g}]"
        inductor, over, over_interval = "-", "-", ""
        if i is not None:
            inductor = format_ns(i["median_ns"])
            over = f"{b['speedup_inductor']:.3g}x"
            over_interval = f"[{b['speedup_inductor_low']:.3g}, {b['speedup_inductor_high']:.3g}]"
        flags = " unstable" if b["unstable"] else ""
        if b["inductor_error"]:
            flags += f" (Inductor failed: {b['inductor_error'][:60]})"
        print(
            f"{name:<22}{format_ns(e['median_ns']):>10}{inductor:>10}{format_ns(c['median_ns']):>10}"
            f"{c['gflops']:>10.3g}{b['speedup']:>8.3g}x  {interval:<16}{over:>11}  "
            f"{over_interval:<16}{c['n']:>5}  {pipeline}{flags}"
        )
    timed = [r["bench"] for r in records if r["bench"]]
    against = [b for b in timed if b["speedup_inductor"] is not None]
    if timed:
        line = f"geomean over eager: kbd {geomean([b['speedup'] for b in timed]):.3g}x"
        if against:
            inductor = [b["eager"]["median_ns"] / b["inductor"]["median_ns"] for b in against]
            line += (
                f"; on the {len(against)} ops timed against Inductor: kbd "
                f"{geomean([b['speedup'] for b in against]):.3g}x, Inductor "
                f"{geomean(inductor):.3g}x, kbd over Inductor "
                f"{geomean([b['speedup_inductor'] for b in against]):.3g}x"
            )
        print(line)
        overhead = max(b["overhead_ns"] for b in timed)
        print(f"kbd's calling-path overhead: {overhead:.2g} ns per call (largest)")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
