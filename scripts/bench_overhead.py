"""Benchmark kbd's worker start-up and parallel throughput against their baselines.

1. Start overhead: time from asking for a worker to its first heartbeat (forked from the warm
   template, job received, sandbox applied), against a fresh `python` that imports torch and
   torch-mlir (what one-process-per-kernel without a template costs before any work).
2. Throughput: the same compute-bound kernels (scalar-loop matmuls) with `-j 1` and `-j 2`.

Both sides are measured in the same run, and the script prints medians and ratios.
Run it with `scripts/bench-overhead [--samples N] [--kernels N]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream

from kbd.engine.spawner import Spawner, template_env
from kbd.shared import protocol
from kbd.shared.protocol import Job, Limits, Phase

ROOT = Path(__file__).resolve().parent.parent
FRESH_IMPORT = (
    "import torch, torch_mlir\n"
    "from torch_mlir import fx, ir, passmanager\n"
    "from torch_mlir.execution_engine import ExecutionEngine\n"
)
# Compute-bound: a chain of matmuls whose operands stay in cache.
CHAIN = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, w):
        for _ in range(DEPTH):
            x = torch.tanh(torch.matmul(x, w))
        return x


def get_inputs():
    return [torch.rand(SIZE, SIZE), torch.rand(SIZE, SIZE) / SIZE]


def get_init_inputs():
    return []
"""


# The start-up probe only needs a loadable problem; it is never run.
START = CHAIN.replace("DEPTH", "1").replace("SIZE", "4")


def fresh_interpreter_start(samples: int) -> list[float]:
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", FRESH_IMPORT], check=True)
        times.append(time.perf_counter() - start)
    return times


async def worker_start(samples: int, kb: Path) -> list[float]:
    """Spawn request -> first heartbeat, for `samples` workers in a row."""
    env = template_env(1)
    source = kb / "level1" / "0_start.py"
    job = Job(
        kernel="level1/0_start.py", source=str(source), source_text=source.read_text(),
        inputs=None,
        init_args=None, outputs=None, dtype="f32", stages=[], seed=0, tolerance=0.01,
        max_tolerance=1.0, opt_level=3, limits=Limits(cores=(0,), mem_limit=4 << 30),
    )  # fmt: skip
    times = []
    with tempfile.TemporaryDirectory() as logs:
        async with Spawner.started(env, Path(logs) / "template.log") as spawner:
            for _ in range(samples):
                start = time.perf_counter()
                worker = await spawner.spawn()
                await worker.channel.send(protocol.encode(job))
                stream = BufferedByteReceiveStream(worker.channel)
                message = await protocol.receive(stream, protocol.WorkerMessage)
                assert isinstance(message, Phase), message
                times.append(time.perf_counter() - start)
                await worker.channel.aclose()  # the worker kills itself on EOF
                os.close(worker.output_fd)
                await spawner.wait(worker.pid)
    return times


def throughput(jobs: int, kb: Path, levels: Path, workdir: Path) -> float:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "kbd", "run", "--kernelbench", str(kb), "--levels", str(levels),
         "-j", str(jobs), "--json"],
        cwd=workdir, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - start
    passed = result.stdout.count('"outcome":"pass"')
    if result.returncode != 0:
        sys.exit(f"bench kernels failed ({passed} passed):\n{result.stdout}\n{result.stderr}")
    return wall


def make_kernels(root: Path, count: int, size: int, depth: int) -> tuple[Path, Path]:
    kb = root / "KernelBench"
    (kb / "level1").mkdir(parents=True)
    entries = []
    for i in range(1, count + 1):
        source = CHAIN.replace("DEPTH", str(depth)).replace("SIZE", str(size))
        (kb / "level1" / f"{i}_chain.py").write_text(source)
        entries.append(f"- kernel: level1/{i}_chain.py\n  gflops: {2 * depth * size**3 / 1e9}\n")
    levels = root / "bench.yaml"
    levels.write_text("".join(entries))
    return kb, levels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=10, help="start-ups to time (default 10)")
    parser.add_argument("--kernels", type=int, default=16, help="kernels for throughput (16)")
    parser.add_argument("--size", type=int, default=256, help="matrix size N (default 256)")
    parser.add_argument("--depth", type=int, default=32, help="matmuls per kernel (32)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        kb, levels = make_kernels(root, args.kernels, args.size, args.depth)
        (kb / "level1" / "0_start.py").write_text(START)

        fresh = fresh_interpreter_start(args.samples)
        warm = anyio.run(worker_start, args.samples, kb)
        fresh_med, warm_med = statistics.median(fresh), statistics.median(warm)
        print(f"start overhead, median of {args.samples}:")
        print(f"  fresh python importing torch + torch-mlir  {fresh_med:7.3f} s "
              f"(min {min(fresh):.3f}, max {max(fresh):.3f})")  # fmt: skip
        print(f"  kbd worker forked from the warm template   {warm_med:7.3f} s "
              f"(min {min(warm):.3f}, max {max(warm):.3f})")  # fmt: skip
        print(f"  ratio fresh / kbd: {fresh_med / warm_med:.1f}x")

        serial = throughput(1, kb, levels, root)
        parallel = throughput(2, kb, levels, root)
        print(f"throughput, {args.kernels} kernels of {args.depth} scalar-loop {args.size}^3 "
              "matmuls + tanh (wall time, template start included):")  # fmt: skip
        print(f"  -j 1  {serial:7.2f} s")
        print(f"  -j 2  {parallel:7.2f} s")
        print(f"  speed-up -j 2 / -j 1: {serial / parallel:.2f}x")


if __name__ == "__main__":
    main()
