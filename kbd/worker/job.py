"""Run one kernel: load, reference, import, pipeline, jit, run, check (and bench, when asked).

Each step is announced with a phase heartbeat *before* it starts, so a worker that dies or hangs
is pinned to the step it was in. Python exceptions become `error` results (or `memory` when an
allocation failed); signals are classified by the supervisor.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable

import numpy as np
import torch

from kbd.protocol import Imported, Job, Result
from kbd.worker import bench, cached_import, check, ingress, mlir, runtime

_MEMORY_MARKERS = ("can't allocate memory", "out of memory", "unable to allocate", "bad_alloc")


class _Step:
    """Announces a phase and records its duration."""

    def __init__(self, announce: Callable[[str], None]):
        self.announce = announce
        self.phase = "load"
        self.times: dict[str, float] = {}

    def __call__(self, phase: str):
        self.phase = phase
        self.announce(phase)
        return self

    def __enter__(self):
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        key = "pipeline" if self.phase.startswith("pipeline:") else self.phase
        self.times[key] = self.times.get(key, 0.0) + time.perf_counter() - self._start
        return False


def run(
    job: Job,
    announce: Callable[[str], None],
    limits_enforced: dict[str, str],
    send: Callable[[Imported], None] = lambda message: None,
) -> Result:
    """Run the job and return its result; never raises for a kernel's own failure.

    `send` carries a freshly imported module to the supervisor's import cache."""
    step = _Step(announce)
    try:
        return _run(job, step, limits_enforced, send)
    except BaseException as exc:  # the kernel's failure, whatever it raises, is data
        return _failure(exc, step, limits_enforced)


def _run(job: Job, step: _Step, limits_enforced: dict[str, str], send) -> Result:
    with step("load"):
        ingress.seed_everything(job.seed)
        problem = ingress.load_problem(job.source, job.source_text)
        model = ingress.build_model(problem, job.init_args, job.dtype)
        if job.inputs is None:
            args = [
                a.contiguous() if isinstance(a, torch.Tensor) else a for a in problem.get_inputs()
            ]
            inputs = ingress.buffers_from_args(args)
        else:
            args, inputs = ingress.make_inputs(job.inputs, job.seed)
    with step("reference"):
        expected = ingress.reference(model, args)
    with step("import"):
        lifted, lifted_args = ingress.lift_parameters(*ingress.bind_scalars(model, args))
        weights = ingress.buffers_from_args(lifted_args[: len(lifted_args) - len(inputs)])
        inputs = [*weights, *inputs]
        module = cached_import.import_module(job, lifted, lifted_args, send)
        out_types, in_types = mlir.results_to_out_params(module)
        _check_signature(job, out_types, in_types, expected, inputs)
    for stage in job.stages:
        with step(f"pipeline:{stage.name}"):
            mlir.apply_stage(module, stage)
    with step("jit"):
        if job.bench is not None:
            mlir.add_bench_wrappers(module, len(out_types) + len(in_types))
        compiled = mlir.Compiled(module, job.opt_level, openmp=runtime.uses_openmp(job.stages))
    outputs = [np.zeros(t.dims, ingress.NUMPY_DTYPES[t.dtype]) for t in out_types]
    with step("run"):
        compiled([*outputs, *inputs])
    with step("check"):
        result = check.compare(expected, outputs, job.tolerance, job.max_tolerance)
    samples = None
    phase = "check"
    if result.passed and job.bench is not None:
        phase = "bench"
        with step("bench"):
            buffers = [*outputs, *inputs]
            samples = bench.measure(
                compiled.timer(buffers), compiled.timer(buffers, noop=True), model, args, job.bench
            )
            # Validation stays on: the outputs the timing loop left behind must still match.
            result = check.compare(expected, outputs, job.tolerance, job.max_tolerance)
            if not result.passed:
                result = dataclasses.replace(
                    result, message=f"after benchmarking: {result.message}"
                )
                samples = None
    return Result(
        outcome="pass" if result.passed else "mismatch",
        phase=phase,
        message=result.message,
        passing_tolerance=result.passing_tolerance,
        max_abs_error=result.max_abs_error,
        max_rel_error=result.max_rel_error,
        times=step.times,
        limits_enforced=limits_enforced,
        bench=samples,
    )


def _check_signature(job: Job, out_types, in_types, expected, inputs) -> None:
    """The imported function must take the buffers we built and return what eager returned."""
    for t in [*out_types, *in_types]:
        if t.dtype not in ingress.NUMPY_DTYPES:
            raise TypeError(f"unsupported element type {t.dtype} in the imported function")
    if len(in_types) != len(inputs):
        raise ValueError(
            f"imported function takes {len(in_types)} tensors, {len(inputs)} inputs were built"
        )
    for i, (t, buffer) in enumerate(zip(in_types, inputs, strict=True)):
        if t.dims != buffer.shape or np.dtype(ingress.NUMPY_DTYPES[t.dtype]) != buffer.dtype:
            raise ValueError(
                f"input {i}: imported function expects {t.dims} {t.dtype}, "
                f"got {buffer.shape} {buffer.dtype}"
            )
    if len(out_types) != len(expected):
        raise ValueError(
            f"imported function returns {len(out_types)} results, eager returned {len(expected)}"
        )
    if job.outputs is not None:
        for i, (want, got) in enumerate(zip(job.outputs, out_types, strict=False)):
            if want.dims != got.dims:
                raise ValueError(
                    f"output {i}: levels entry says {'x'.join(map(str, want.dims)) or 'scalar'}, "
                    f"the kernel returns {'x'.join(map(str, got.dims)) or 'scalar'}"
                )


def _failure(exc: BaseException, step: _Step, limits_enforced: dict[str, str]) -> Result:
    message = _first_line(exc)
    is_memory = isinstance(exc, MemoryError) or any(m in message.lower() for m in _MEMORY_MARKERS)
    traceback.print_exception(exc)  # full traceback goes to the kernel's log
    return Result(
        outcome="memory" if is_memory else "error",
        phase=step.phase,
        message=message,
        times=step.times,
        limits_enforced=limits_enforced,
    )


def _first_line(exc: BaseException) -> str:
    """The exception's first non-empty line; for MLIR, its first `error:` diagnostic."""
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = next((line for line in lines if line.startswith("error:")), lines[0] if lines else "")
    if isinstance(exc, mlir.StageError):
        return first
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
