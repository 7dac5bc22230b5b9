"""Eager against compiled for a fixed set of ops at benchmark shapes, measured by kbd itself.

The ops (scripts/ops: matmul, batched matmul, an element-wise chain, softmax, conv2d, layer norm
and group norm at KernelBench's bench shapes) run through `kbd run --benchmark`: each in its own
worker, checked against eager, then timed by the bench phase (compiled in the JIT's own timing
loop, eager in Python, alternating batches on the same pinned cores). Each op gets the schedule
the finder picks for its `pipeline:` family on this CPU, or the scalar pipeline when there is
none; `--pipeline X` replaces them all, as in kbd. The table gives median times, GFLOPS and the
speedup over eager with its 95% interval; the CPU is named. Schedule work is judged by this
table.

    scripts/bench-ops [--cores 0] [--bench-time 1] [OP ...] [-- KBD-RUN-OPTIONS ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPS_ROOT = ROOT / "scripts" / "ops"
OPS_LEVELS = OPS_ROOT / "levels.yaml"
sys.path.insert(0, str(ROOT))

from kbd.plan import catalog, pipelines  # noqa: E402  (after the path set-up above)
from kbd.plan.spec import SweepSpec  # noqa: E402
from kbd.results.stats import format_ns  # noqa: E402


def cpu_model() -> str:
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    return f"{name} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')})"


def pipeline_of(entry: catalog.Entry, override: list[str]) -> str:
    """What the op is compiled with, as kbd chooses it (kbd.plan.pipelines)."""
    if override:
        return " + ".join(override)
    return pipelines.choose(entry, SweepSpec(), ROOT / "schedules").name


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
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
    entries = {e.name: e for e in catalog.load([OPS_LEVELS])}
    print(f"CPU: {cpu_model()}; cores {','.join(map(str, cores))}", flush=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    if done.returncode == 2:
        return 2
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    header = (
        f"{'op':<22}{'eager':>10}{'compiled':>10}{'eager GF/s':>12}{'comp. GF/s':>12}"
        f"{'speedup':>9}  {'95% interval':<16}{'n':>5}  pipeline"
    )
    print(header)
    for r in records:
        name = r["kernel"].split("/", 1)[1]
        pipeline = pipeline_of(entries[r["kernel"]], options.pipeline)
        b = r["bench"]
        if b is None:
            print(f"{name:<22}{r['outcome']} in {r['phase']}: {r['message'][:80]}  ({pipeline})")
            continue
        c, e = b["compiled"], b["eager"]
        interval = f"[{b['speedup_low']:.3g}, {b['speedup_high']:.3g}]"
        flags = " unstable" if b["unstable"] else ""
        print(
            f"{name:<22}{format_ns(e['median_ns']):>10}{format_ns(c['median_ns']):>10}"
            f"{e['gflops']:>12.3g}{c['gflops']:>12.3g}{b['speedup']:>8.3g}x  {interval:<16}"
            f"{c['n']:>5}  {pipeline}{flags}"
        )
    overheads = [r["bench"]["overhead_ns"] for r in records if r["bench"]]
    if overheads:
        print(f"compiled calling-path overhead: {max(overheads):.2g} ns per call (largest)")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
