"""Measure what containment costs per worker, with and without it, side by side.

1. Worker start: spawn request -> first heartbeat (forked from the warm template, job received,
   limits and containment applied), and spawn -> reaped (the worker's whole life when it exits
   at once, including tearing down its network namespace), alternating workers with
   containment on and off so that both sides see the same machine load.
2. Each mechanism alone, timed inside a freshly forked process: unshare(CLONE_NEWNET), the Landlock
   ruleset (also with a results store in ./.kbd hidden, as a sweep from this directory would
   have), the seccomp filter, and the scratch folder's creation and removal.

Prints medians, spreads and the difference; run it with `scripts/bench-sandbox [--samples N]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream

from kbd.commands.doctor import machine_line
from kbd.engine.scratch import remove_tree, scratch_folder, store_files
from kbd.engine.spawner import Spawner, template_env
from kbd.shared import protocol
from kbd.shared.protocol import Job, Limits, Phase
from kbd.worker import landlock, sandbox, seccomp

START = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x


def get_inputs():
    return [torch.rand(4)]


def get_init_inputs():
    return []
"""


def job(contained: bool, scratch: Path) -> Job:
    return Job(
        kernel="level1/0_start.py", source="0_start.py", source_text=START, inputs=None,
        init_args=None, outputs=None, dtype="f32", stages=[], seed=0, tolerance=0.01,
        max_tolerance=1.0, opt_level=3,
        limits=Limits(cores=(0,), mem_limit=4 << 30, scratch=str(scratch), sandbox=contained),
    )  # fmt: skip


async def worker_times(samples: int) -> dict[bool, tuple[list[float], list[float]]]:
    """{contained: (spawn -> heartbeat, spawn -> reaped)} over alternating workers."""
    times: dict[bool, tuple[list[float], list[float]]] = {True: ([], []), False: ([], [])}
    env = template_env(1)
    with tempfile.TemporaryDirectory() as logs:
        async with Spawner.started(env, Path(logs) / "template.log") as spawner:
            for i in range(2 * samples + 2):
                contained = i % 2 == 0
                with scratch_folder("bench") as scratch:
                    message = job(contained, scratch)
                    start = time.perf_counter()
                    worker = await spawner.spawn()
                    await worker.channel.send(protocol.encode(message))
                    stream = BufferedByteReceiveStream(worker.channel)
                    first = await protocol.receive(stream, protocol.WorkerMessage)
                    heartbeat = time.perf_counter() - start
                    assert isinstance(first, Phase), first
                    await worker.channel.aclose()  # the worker kills itself on EOF
                    os.close(worker.output_fd)
                    await spawner.wait(worker.pid)
                    reaped = time.perf_counter() - start
                if i >= 2:  # the first pair warms up
                    times[contained][0].append(heartbeat)
                    times[contained][1].append(reaped)
    return times


def mechanism_times(samples: int) -> dict[str, list[float]]:
    """Seconds each mechanism takes, timed inside a freshly forked child (no fork noise)."""
    scratch = tempfile.mkdtemp(prefix="kbd-bench-")
    hidden = list(store_files(Path(".kbd") / "results.db"))  # as a sweep here would
    steps = {
        "network namespace": sandbox.isolate_network,
        "landlock ruleset": lambda: landlock.restrict([scratch], ["/dev/null"]),
        "landlock, store hidden": lambda: landlock.restrict([scratch], ["/dev/null"], hidden),
        "seccomp socket filter": seccomp.deny_sockets,
    }
    found: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(samples):
        for name, step in steps.items():
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                start = time.perf_counter()
                step()
                os.write(write, struct.pack("d", time.perf_counter() - start))
                os._exit(0)
            os.close(write)
            found[name].append(struct.unpack("d", os.read(read, 8))[0])
            os.close(read)
            os.waitpid(pid, 0)
    remove_tree(Path(scratch))
    folder: list[float] = []
    for _ in range(samples):
        start = time.perf_counter()
        with scratch_folder("bench"):
            pass
        folder.append(time.perf_counter() - start)
    found["scratch folder (make + remove)"] = folder
    return found


def ms(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4)
    return f"{statistics.median(values) * 1e3:7.2f} ms (IQR {q[0] * 1e3:.2f}-{q[2] * 1e3:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=40, help="workers per side (default 40)")
    args = parser.parse_args()
    print(machine_line())
    times = anyio.run(worker_times, args.samples)
    print(f"worker, median of {args.samples} per side (alternating):")
    for label, index in (("spawn -> first heartbeat", 0), ("spawn -> reaped", 1)):
        on, off = times[True][index], times[False][index]
        delta = statistics.median(on) - statistics.median(off)
        ratio = statistics.median(on) / statistics.median(off)
        print(f"  {label:<26} contained {ms(on)}   uncontained {ms(off)}")
        print(f"  {'':<26} difference {delta * 1e3:+.2f} ms, ratio {ratio:.2f}x")
    print(f"each mechanism alone, timed inside a forked child, median of {args.samples}:")
    for name, values in mechanism_times(args.samples).items():
        print(f"  {name:<32} {ms(values)}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
