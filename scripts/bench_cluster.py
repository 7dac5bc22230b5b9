"""Benchmark `kbd sweep --cluster`: the same compute-bound kernels on 1 node and on 2 nodes.

Starts a real local Ray cluster (`ray start`, one core per node, pinned with taskset), runs a
sweep of N scalar-loop matmul chains on the head node alone, adds a second node, and runs the
same sweep again; both in this one run. It prints the command's wall time (Ray connection and
the agents' template start included) and the span from the first kernel's start to the last
kernel's end (from the store), with the ratios. Run it with `scripts/bench-cluster`.

Each kernel runs 128 matmuls by default, about 3 s on one core: compute-bound. With 32 (about
0.7 s), each kernel's import, JIT and dispatch weigh as much as its loops, and on a 2-core
machine the head and Ray's own processes share the cores of the two nodes, so the span ratio
measured 1.43x against 1.67x at 128 (AMD EPYC Zen 4, same session). `--depth` changes it.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_overhead import make_kernels

from kbd.cluster.localcluster import LocalCluster
from kbd.plan.target import cpu_model


def sweep(address: str, kb: Path, levels: Path, workdir: Path) -> tuple[float, float, int]:
    """(command wall, kernel span, nodes used) of one cluster sweep."""
    workdir.mkdir()
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "kbd", "sweep", "--kernelbench", str(kb), "--levels", str(levels),
         "--cluster", address],
        cwd=workdir, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"bench sweep failed:\n{result.stdout}\n{result.stderr}")
    with sqlite3.connect(workdir / ".kbd" / "results.db") as db:
        rows = db.execute(
            "SELECT finished - wall_s, finished, json_extract(record, '$.node') FROM attempts"
        ).fetchall()
    span = max(end for _, end, _ in rows) - min(begin for begin, _, _ in rows)
    return wall, span, len({node for _, _, node in rows})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", type=int, default=8, help="kernels per sweep (default 8)")
    parser.add_argument("--size", type=int, default=256, help="matrix size N (default 256)")
    parser.add_argument("--depth", type=int, default=128, help="matmuls per kernel (128)")
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit("bench-cluster needs 2 cores (one per node)")
    print(f"CPU: {cpu_model()}, cores {cores[0]} and {cores[1]}; load average "
          f"{os.getloadavg()[0]:.2f} at start")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, LocalCluster([(cores[0],)]) as cluster:
        root = Path(tmp)
        kb, levels = make_kernels(root, args.kernels, args.size, args.depth)
        one = sweep(cluster.address, kb, levels, root / "one")
        cluster.add_node((cores[1],))
        two = sweep(cluster.address, kb, levels, root / "two")
    print(f"{args.kernels} kernels of {args.depth} scalar-loop {args.size}^3 matmuls + tanh, "
          "one core per node:")  # fmt: skip
    for label, (wall, span, nodes) in (("1 node ", one), ("2 nodes", two)):
        print(f"  {label}  command {wall:7.2f} s   kernels {span:7.2f} s   ({nodes} node(s) used)")
    print(f"  speed-up 2 nodes / 1 node: command {one[0] / two[0]:.2f}x, "
          f"kernels {one[1] / two[1]:.2f}x")  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.2f} at end (the machine is shared)")


if __name__ == "__main__":
    main()
