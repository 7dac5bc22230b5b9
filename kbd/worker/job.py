"""Run one kernel: load, reference, import, pipeline, jit, run, check (import mode), or load,
reference, compile (Dynamo, with import, pipeline and jit per subgraph), run, check (compile
mode); then bench when asked.

Each step is announced with a phase heartbeat *before* it starts, so a worker that dies or hangs
is pinned to the step it was in. Python exceptions become `error` results (or `memory` when an
allocation failed); signals are classified by the supervisor.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

import msgspec
import numpy as np
import torch

from kbd.shared.protocol import (
    BENCH_PHASE,
    FOUND_AT_RUN_TIME,
    Imported,
    Job,
    Library,
    PipelineChosen,
    Replay,
    Result,
    Size,
    Sized,
    is_pipeline_phase,
)
from kbd.worker import (
    bench,
    cached_import,
    check,
    ingress,
    library,
    mlir,
    runtime,
    sizing,
    stages,
    state,
)

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
        key = "pipeline" if is_pipeline_phase(self.phase) else self.phase
        self.times[key] = self.times.get(key, 0.0) + time.perf_counter() - self._start
        return False


def run(
    job: Job,
    announce: Callable[[str], None],
    limits_enforced: dict[str, str],
    send: Callable[[Imported | Library | PipelineChosen], None],
    end: Callable[[Result], NoReturn],
) -> Result:
    """Run the job and return its result; never raises for a kernel's own failure.

    `send` carries a freshly imported module to the supervisor's import cache, and a freshly
    compiled library to its compile cache. `end` reports a result and ends the worker: for a
    runtime symbol that fails inside compiled code (an allocation that failed under the memory
    cap ends as `memory`, as a MemoryError raised here does)."""
    step = _Step(announce)
    with runtime.on_failure(lambda exc: end(_failure(exc, step, limits_enforced))):
        try:
            return _run(job, step, limits_enforced, send, end)
        except BaseException as exc:  # the kernel's failure, whatever it raises, is data
            return _failure(exc, step, limits_enforced)


def replay(
    task: Replay, announce: Callable[[str], None], limits_enforced: dict[str, str]
) -> Result:
    """Run a reproducer bundle's stage (`kbd replay`); its failure is data, as in `run`."""
    step = _Step(announce)
    try:
        return stages.replay(task, step, limits_enforced)
    except BaseException as exc:
        return _failure(exc, step, limits_enforced)


def size(
    task: Size, announce: Callable[[str], None], limits_enforced: dict[str, str]
) -> Sized | Result:
    """Measure a problem at its own shapes without making its inputs (kbd.worker.sizing); its
    failure is data, as in `run`."""
    step = _Step(announce)
    try:
        with step("load"):
            ingress.seed_everything(task.seed)
            problem = ingress.load_problem(task.source, task.source_text)
        with step("size"):
            return sizing.size(problem, task.dtype)
    except BaseException as exc:
        return _failure(exc, step, limits_enforced)


def _run(job: Job, step: _Step, limits_enforced: dict[str, str], send, end) -> Result:
    with step("load"):
        ingress.seed_everything(job.seed)
        problem = ingress.load_problem(job.source, job.source_text)
        model = ingress.build_model(problem, job.init_args, job.dtype)
        if job.inputs is None:
            args = [
                a.contiguous() if isinstance(a, torch.Tensor) else a for a in problem.get_inputs()
            ]
            if job.dtype != "f32":
                args = ingress.cast_floating(args, job.dtype)
            if job.sized is not None:
                sizing.check_inputs(args, job.sized)
            inputs = ingress.buffers_from_args(args)
        else:
            args, inputs = ingress.make_inputs(job.inputs, job.seed)
        if state.register_tensor_attributes(model) and job.dtype != "f32":
            model = model.to(ingress.TORCH_DTYPES[job.dtype])  # the attributes just registered
        if job.dtype in LOW_PRECISION and not ingress.has_floating(model, args):
            return _skipped(job, step, limits_enforced, "nothing in it is floating-point")
    with step("reference"):
        try:
            eager = _Eager.run(model, args)
        except Exception as exc:
            # eager failing in a low-precision type (an op without a kernel for it, oneDNN
            # refusing it, a forward that makes f32 tensors of its own) is eager's limit
            if job.dtype not in LOW_PRECISION or isinstance(exc, MemoryError):
                raise
            return _skipped(job, step, limits_enforced, f"eager cannot run it: {exc}")
    if job.mode == "compile":
        return _run_compile(job, step, model, args, eager, limits_enforced, end, send)
    eager_model, eager_args = model, args  # what --benchmark times eager with
    with step("import"):
        if job.families:  # exporting for it fails (or kills the worker) as importing would
            job = _family_pipeline(job, model, args, send)
        if eager.random:  # random ops in forward take eager's draws as extra inputs
            model = state.RandomAsInputs(model, len(eager.random))
            args = [*args, *eager.random]
            inputs = [*inputs, *ingress.buffers_from_args(eager.random)]
        lifted, lifted_args = ingress.lift_parameters(*ingress.bind_scalars(model, args))
        weights = ingress.buffers_from_args(lifted_args[: len(lifted_args) - len(inputs)])
        names = [*getattr(lifted, "names", [])[: len(weights)], *_input_names(len(inputs))]
        inputs = [*weights, *inputs]
        compiled = library.load_cached(job)
        if compiled is not None:  # the compile cache had it: no import, pipeline or JIT
            out_types, in_types = library.buffer_types(job.compile_cache.signature)
            mutated = job.compile_cache.signature.mutated
        else:
            module = cached_import.import_module(job, lifted, lifted_args, send)
            mutated = mlir.mutated_inputs(module)
            out_types, in_types = mlir.results_to_out_params(module)
        _check_signature(job, out_types[len(mutated) :], in_types, eager.expected, inputs)
    cache_use = "hit" if compiled is not None else None
    if compiled is None:
        pipeline = stages.Pipeline(job.stages, job.inspect, job.limits.scratch, step)
        pipeline.run(module, job.kernel)
        with step("jit"):
            if job.bench is not None:
                mlir.add_bench_wrappers(module, len(out_types) + len(in_types))
            openmp = runtime.uses_openmp(job.stages)
            compiled = mlir.Compiled(module, job.opt_level, openmp=openmp)
            pipeline.compiled(compiled)
            if job.compile_cache is not None:
                sig = library.signature(out_types, in_types, mutated)
                compiled, cache_use = library.offer(job, compiled, module, sig, send)
    outputs = [np.zeros(t.dims, ingress.NUMPY_DTYPES[t.dtype]) for t in out_types]
    # --benchmark times forwards from the state eager started from, not the one `run` leaves.
    timed = [b.copy() if i in mutated and job.bench else b for i, b in enumerate(inputs)]
    if _checks_first(job):
        with step("run"):
            compiled([*outputs, *inputs])
            for j, i in enumerate(mutated):  # state the forward wrote: carried out on our copy
                np.copyto(inputs[i], outputs[j])
    return _checked(
        job,
        step,
        eager.expected,
        outputs[len(mutated) :],
        limits_enforced,
        measure=lambda: (
            bench.measure(
                compiled.timer([*outputs, *timed]),
                compiled.timer([*outputs, *timed], noop=True),
                eager_model,
                eager_args,
                job.bench,
                _second_baseline(job, eager_model, eager_args),
            ),
            outputs[len(mutated) :],  # the timing loop wrote its results here
        ),
        random_inputs=len(eager.random),
        state_writes=[names[i] for i in mutated],
        compile_cache=cache_use,
    )


def _run_compile(
    job: Job, step: _Step, model, args, eager: _Eager, limits_enforced, end, send
) -> Result:
    """Compile mode: torch.compile with kbd's Dynamo backend, one forward to compile (its
    subgraphs run in eager) and one, profiled, that runs the compiled code and whose outputs are
    checked. Both start from eager's RNG and buffer state."""
    from kbd.worker import dynamo  # imported here: import mode never pays for it

    if job.families:
        step("compile")  # exporting fails (or kills the worker) where compiling would
        job = _family_pipeline(job, model, args, send)
    dynamo.configure()
    pipeline = stages.Pipeline(job.stages, job.inspect, job.limits.scratch, step)
    backend = dynamo.Backend(pipeline, job.kernel, job.opt_level, step)

    def failed(exc: BaseException) -> Result:
        """A failure still records what was compiled until then."""
        return msgspec.structs.replace(
            _failure(backend.error or exc, step, limits_enforced),
            coverage=dynamo.coverage(backend, {}, finished=False),
            random_inputs=backend.random_inputs,
            state_writes=backend.state_writes,
        )

    with runtime.on_failure(lambda exc: end(failed(exc))):
        try:
            return _compile_and_check(job, step, model, args, eager, limits_enforced, backend)
        except BaseException as exc:
            return failed(exc)


def _compile_and_check(
    job: Job, step: _Step, model, args, eager: _Eager, limits_enforced, backend
) -> Result:
    from kbd.worker import dynamo

    compiled = torch.compile(model, backend=backend, dynamic=False)
    step("compile")
    start, inner = time.perf_counter(), sum(step.times.values())
    try:
        with torch.no_grad(), dynamo.first_forward():
            compiled(*eager.fresh_args(model, args))
    except Exception as exc:
        raise (backend.error or exc) from None  # the real error, not Dynamo's wrapper
    step.times["compile"] = time.perf_counter() - start - (sum(step.times.values()) - inner)
    subgraphs = len(backend.graph_ops)
    with step("run"):
        fresh = eager.fresh_args(model, args)
        with torch.no_grad(), dynamo.profile() as profile:
            out = compiled(*fresh)
        if len(backend.graph_ops) != subgraphs:
            raise RuntimeError(
                "Dynamo recompiled the forward on its second call with the same inputs"
            )
    coverage = dynamo.coverage(backend, dynamo.eager_ops(profile))
    extra = dict(
        coverage=coverage, random_inputs=backend.random_inputs, state_writes=backend.state_writes
    )
    if coverage.subgraphs == 0:
        reasons = "; ".join(coverage.break_reasons) or "Dynamo captured no graph"
        return Result(
            outcome="eager",
            phase="compile",
            message=f"nothing compiled: the whole forward ran in eager ({reasons})",
            times=step.times,
            limits_enforced=limits_enforced,
            **extra,
        )

    def measure():
        """Time the whole compiled forward against eager, then run it once more from eager's
        starting state for the check after timing (Dynamo must not have recompiled)."""
        fresh = eager.fresh_args(model, args)
        baseline = _second_baseline(job, model, fresh)
        samples = bench.measure_forward(
            compiled, model, fresh, job.bench, dynamo.eager_settings, baseline
        )
        if len(backend.graph_ops) != subgraphs:
            raise RuntimeError("Dynamo recompiled the forward while it was timed")
        with torch.no_grad():
            return samples, ingress.outputs(compiled(*eager.fresh_args(model, args)))

    outputs = ingress.outputs(out)
    return _checked(job, step, eager.expected, outputs, limits_enforced, measure, **extra)


class _Eager:
    """The eager reference and the state it started from, to start compiled code alike."""

    def __init__(self, expected, random, rng_state, buffers):
        self.expected = expected
        self.random = random
        self.rng_state = rng_state
        self.buffers = buffers

    @classmethod
    def run(cls, model, args) -> _Eager:
        buffers = state.snapshot_buffers(model)
        rng_state = torch.get_rng_state()
        with state.RecordRandom() as recorder:
            expected = ingress.reference(model, args)
        state.restore_buffers(model, buffers)
        return cls(expected, recorder.draws, rng_state, buffers)

    def fresh_args(self, model, args) -> list:
        """Arguments for one more call, with the buffers and RNG state eager started with."""
        cloned = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        state.restore_buffers(model, self.buffers)
        torch.set_rng_state(self.rng_state)
        return cloned


def _checked(job: Job, step: _Step, expected, outputs, limits_enforced, measure, **extra) -> Result:
    """Compare with eager; with --benchmark, time a passing kernel with `measure()`, which
    returns the samples and the outputs to check again after timing. A benchmark's further
    process (`BenchOptions.check_first` off) is only checked after timing."""
    samples, result = None, None
    phase = "check"
    if _checks_first(job):
        with step("check"):
            result = check.compare(expected, outputs, job.tolerance, job.max_tolerance)
    if job.bench is not None and (result is None or result.passed):
        phase = BENCH_PHASE
        with step(BENCH_PHASE):
            samples, outputs = measure()
            # Validation stays on: the outputs left behind by timing must still match.
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
        **extra,
    )


def _family_pipeline(job: Job, model, args, send) -> Job:
    """The job with its family's pipeline from `Job.families`, the family found in the exported
    graph as `kbd levels generate` finds it. The choice is sent before the pipeline runs, so the
    record names it even when the pipeline kills the worker. A graph that does not export
    (data-dependent shapes, a graph break) keeps the job's own pipeline: finding a family never
    changes how a kernel ends."""
    from kbd.worker import families  # only for entries that name no family

    try:
        family = families.family_of(model, args)
    except MemoryError:
        raise
    except Exception as exc:
        note = f"no family found at run time: the graph did not export ({_first_line(exc)[:160]})"
        send(PipelineChosen(f"{job.pipeline} ({note})"))
        return job
    chosen = job.families.get(family) if family else None
    if chosen is None:
        why = f"no schedule for {family}, the" if family else "no"
        send(PipelineChosen(f"{job.pipeline} ({why} {FOUND_AT_RUN_TIME})"))
        return job
    send(PipelineChosen(chosen.name))
    return msgspec.structs.replace(job, stages=chosen.stages)


LOW_PRECISION = ("bf16", "f16")


def _skipped(job: Job, step: _Step, limits_enforced: dict[str, str], why: str) -> Result:
    """A kernel that cannot run in its low-precision element type: skipped, saying why."""
    return Result(
        outcome="skipped",
        phase=step.phase,
        message=f"not run in {job.dtype}: {bench.first_line(why)}",
        times=step.times,
        limits_enforced=limits_enforced,
    )


def _second_baseline(job: Job, model, args) -> bench.Baseline | None:
    """Inductor compiled and ready to time, when the job asks for it (`--baseline inductor`)."""
    if not job.bench.inductor:
        return None
    return bench.inductor(model, args, job.bench.inductor_cache, job.bench.inductor_limit_s)


def _checks_first(job: Job) -> bool:
    """Whether the kernel is run and checked before (any) timing: all but a benchmark's further
    processes (`BenchOptions.check_first`)."""
    return job.bench is None or job.bench.check_first


def _input_names(count: int) -> list[str]:
    return [f"input {i}" for i in range(count)]


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
            # `1` for a 0-d result is how lighthouse's levels files write a loss's output (its
            # one-element buffer); kbd's own files say `scalar`
            if want.dims != got.dims and not (want.dims == (1,) and got.dims == ()):
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
