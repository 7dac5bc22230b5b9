"""Benchmark kbd's family schedules against PyTorch eager and the scalar pipeline.

For each case (a small torch module at a benchmark shape and its schedule family), the script
imports it with kbd's worker modules, compiles it with the family schedule the finder picks for
this CPU (or `--feature`), checks the result against eager, and times eager, the family schedule
and (with --scalar) the scalar pipeline interleaved on the same pinned core(s), so machine load
hits every side alike. It prints medians, GFLOPS and ratios to eager, and names the CPU.
Run it with `scripts/bench-schedules [CASE ...] [--reps N] [--cores 0,1] [--scalar]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from kbd.plan import descriptor, target
from kbd.plan.target import cpu_model
from kbd.worker import ingress, mlir, runtime

ROOT = Path(__file__).resolve().parent.parent
SCHEDULES = ROOT / "schedules"
# Pause before each timed call: the previous side's idle threads spin-wait for their next
# parallel loop (torch's libgomp some 5 ms, kbd's OpenMP runtime 1 ms) and would share the
# cores with the call being timed.
SETTLE = 0.02


@dataclass(frozen=True)
class Case:
    family: str
    make: Callable[[], torch.nn.Module]
    shapes: tuple[tuple[int, ...], ...]
    flop: float


class _Matmul(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


class _Chain(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(torch.relu(2 * x + 1)) * 0.5


class _Softmax(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


class _Bmm(torch.nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b)


CASES = {
    "matmul": Case("matmul", _Matmul, ((1024, 1024), (1024, 1024)), 2 * 1024**3),
    "bmm": Case("batch_matmul", _Bmm, ((8, 512, 512), (8, 512, 512)), 2 * 8 * 512**3),
    "chain": Case("element_wise", _Chain, ((4096, 4096),), 5 * 4096 * 4096),
    "softmax": Case("softmax", _Softmax, ((4096, 1024),), 5 * 4096 * 1024),
}


def compile_case(case: Case, args: list[torch.Tensor], specs: list[str]):
    stages = descriptor.resolve_pipeline(specs, schedules_dir=SCHEDULES, cwd=Path.cwd())
    module = mlir.import_model(case.make(), args)
    out_types, _ = mlir.results_to_out_params(module)
    for stage in stages:
        mlir.apply_stage(module, stage)
    return mlir.Compiled(module, 3, openmp=runtime.uses_openmp(stages)), out_types


def on_cores(fn: Callable[[], object], cores: list[int]) -> None:
    """Run fn pinned to these cores with as many OpenMP threads."""
    os.sched_setaffinity(0, cores)
    runtime.openmp_libraries()  # sets the thread count from the affinity
    fn()


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help=f"cases to run (default: all of {list(CASES)})")
    parser.add_argument("--reps", type=int, default=11, help="timed calls per side (median)")
    parser.add_argument("--cores", default="", help="cores to pin to, e.g. 0,1 (default: one)")
    parser.add_argument("--feature", action="append", default=None, help="finder feature")
    parser.add_argument("--scalar", action="store_true", help="also time the scalar pipeline")
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="also time the family schedule on all --cores "
        "against one of them (OpenMP threads = cores)",
    )
    options = parser.parse_args()
    unknown = sorted(set(options.cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}; known: {', '.join(CASES)}")
    options.cases = options.cases or list(CASES)
    cores = (
        [int(c) for c in options.cores.split(",")]
        if options.cores
        else [sorted(os.sched_getaffinity(0))[-1]]
    )
    os.sched_setaffinity(0, cores)
    options.core_list = cores
    options.core_list = cores
    torch.set_num_threads(len(cores))
    arch, flags = descriptor.host_target()
    features = options.feature if options.feature is not None else target.ranked(flags)
    print(f"CPU: {cpu_model()}, cores {cores}, {options.reps} interleaved calls per side")
    for name in options.cases:
        measure(name, CASES[name], arch, features, options)


def measure(name: str, case: Case, arch: str, features: list[str], options) -> None:
    """Compile one case with its family schedule, check it, time it against eager, print."""
    torch.manual_seed(0)
    args = [torch.randn(shape) for shape in case.shapes]
    schedule = descriptor.find_pipeline(
        case.family, "f32", schedules_dir=SCHEDULES, arch=arch, features=features
    )
    if schedule is None:
        print(f"{name}: no {case.family} schedule for {arch} with these features")
        return
    model = case.make()
    expected = model(*args).numpy()
    inputs = ingress.buffers_from_args(args)
    calls = {"eager": lambda: model(*args)}
    specs = {"family": str(schedule)}
    if options.scalar:
        specs["scalar"] = descriptor.DEFAULT_PIPELINE
    for side, spec in specs.items():
        compiled, out_types = compile_case(case, args, [spec])
        outputs = [np.zeros(t.dims, np.float32) for t in out_types]
        compiled([*outputs, *inputs])
        error = float(np.abs(outputs[0] - expected).max())
        assert np.allclose(outputs[0], expected, rtol=1e-3, atol=1e-3), (side, error)
        calls[side] = lambda c=compiled, o=outputs: c([*o, *inputs])
    if options.scaling:
        family = calls["family"]
        calls["1 core"] = lambda: on_cores(family, options.core_list[:1])
        calls["all"] = lambda: on_cores(family, options.core_list)
        del calls["family"]
    samples: dict[str, list[float]] = {side: [] for side in calls}
    for call in calls.values():
        call()  # warm-up
    for rep in range(options.reps):
        for side, call in calls.items():
            if side == "scalar" and rep >= 3:
                continue  # the scalar pipeline is slow; three calls give its median
            time.sleep(SETTLE)
            samples[side].append(timed(call))
    medians = {side: statistics.median(times) for side, times in samples.items()}
    print(f"{name} ({schedule.relative_to(SCHEDULES)}):")
    for side, seconds in medians.items():
        print(
            f"  {side:7} {seconds * 1e3:9.3f} ms  {case.flop / seconds / 1e9:7.2f} GFLOPS"
            f"  {medians['eager'] / seconds:6.3f}x eager"
        )


if __name__ == "__main__":
    main()
