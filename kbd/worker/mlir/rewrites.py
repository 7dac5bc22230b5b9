"""All MLIR access of kbd goes through this module.

Today the bindings are the upstream MLIR Python bindings bundled in the torch-mlir wheel
(`torch_mlir.ir`, `.passmanager`, `.dialects`, `.execution_engine`); swapping them for a
standalone `mlir` package means changing the imports here and nothing else.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
import torch
from torch.export.graph_signature import InputKind, OutputKind
from torch_mlir import fx, ir, passmanager
from torch_mlir.dialects import arith, bufferization, func, linalg
from torch_mlir.dialects import math as math_dialect
from torch_mlir.dialects.transform import interpreter
from torch_mlir.execution_engine import ExecutionEngine
from torch_mlir.extras.fx_decomp_util import get_decomposition_table

from kbd.shared.protocol import Stage
from kbd.worker import decompositions, norms, runtime

ENTRY = "main"
TRANSFORM_ENTRY = "__transform_main"
CIFACE_PREFIX = "_mlir_ciface_"  # the C interface of a function with llvm.emit_c_interface
PACKED_PREFIX = "_mlir_"  # the ExecutionEngine's packed-argument wrapper of a function
BENCH_ENTRY = "__kbd_bench"  # times batches of calls to @main
NOOP_BENCH_ENTRY = "__kbd_bench_noop"  # the same loop around an empty function: the overhead


@dataclass(frozen=True)
class BufferType:
    """Shape and element type (kbd name, e.g. 'f32') of one memref argument."""

    dims: tuple[int, ...]
    dtype: str


MUTATED_INPUTS = "kbd.mutated_inputs"  # module attribute: positions of inputs the entry writes


def import_model(model, args: Sequence) -> ir.Module:
    """Import a torch module into MLIR (linalg-on-tensors) with torch-mlir's FX importer,
    applying torch-mlir's decompositions plus kbd's (see kbd.worker.decompositions)."""
    return import_program(torch.export.export(model, tuple(args), strict=False))


def import_program(program: torch.export.ExportedProgram) -> ir.Module:
    """Import an exported program with kbd's decompositions.

    torch.export functionalizes: an input (or lifted buffer) written in place becomes an extra
    leading result of the function, which callers must write back or report, never drop. The
    positions of those inputs are kept in the module (see `mutated_inputs`), so they survive
    the import cache's text round trip.
    """
    table = {**get_decomposition_table(), **decompositions.TABLE, **norms.TABLE}
    program = program.run_decompositions(table)
    signature = program.graph_signature
    user_inputs = [s.arg.name for s in signature.input_specs if s.kind == InputKind.USER_INPUT]
    mutated = []
    for spec in signature.output_specs:
        if spec.kind == OutputKind.USER_INPUT_MUTATION:
            mutated.append(user_inputs.index(spec.target))
        elif spec.kind != OutputKind.USER_OUTPUT:
            raise ValueError(f"unsupported output of the exported program: {spec.kind.name}")
    module = fx.export_and_import(program, output_type="linalg-on-tensors", decomposition_table={})
    with module.context:
        module.operation.attributes[MUTATED_INPUTS] = ir.DenseI64ArrayAttr.get(mutated)
    return module


def mutated_inputs(module: ir.Module) -> tuple[int, ...]:
    """Positions (among the tensor arguments of @main) of the inputs it writes; its first
    `len(...)` results are their new values, in this order."""
    attributes = module.operation.attributes
    if MUTATED_INPUTS not in attributes:
        return ()
    return tuple(ir.DenseI64ArrayAttr(attributes[MUTATED_INPUTS]))


def module_text(module: ir.Module) -> str:
    """The module as MLIR text, complete (no elided constants), for the import cache."""
    return module.operation.get_asm(large_elements_limit=None, enable_debug_info=False)


def module_bytecode(module: ir.Module) -> bytes:
    """The module as MLIR bytecode: about 3x faster to write than its text."""
    buffer = io.BytesIO()
    module.operation.write_bytecode(buffer)
    return buffer.getvalue()


def parse_module(text: str | bytes) -> ir.Module:
    """Parse MLIR text (e.g. an import cache entry; str or UTF-8 bytes) or bytecode into a
    module with its own context."""
    with ir.Context(), ir.Location.unknown():
        return ir.Module.parse(text)


def results_to_out_params(module: ir.Module) -> tuple[list[BufferType], list[BufferType]]:
    """Rewrite `@main(tensors) -> tensors` into `@main(out memrefs..., in memrefs...)`.

    Inputs become `bufferization.to_tensor ... restrict`, each result is written with
    `bufferization.materialize_in_destination` into its out-param, and the function gets
    `llvm.emit_c_interface` so it can be called through the packed C interface.
    Returns the (outputs, inputs) buffer types in call order.
    """
    with module.context, ir.Location.unknown():
        old = _find_function(module, ENTRY)
        inputs = list(old.type.inputs)
        results = list(old.type.results)
        for t in [*inputs, *results]:
            if not isinstance(t, ir.RankedTensorType):
                raise ValueError(f"@{ENTRY} has a non-tensor argument or result: {t}")
        memrefs = [_memref_type(t) for t in [*results, *inputs]]
        new = func.FuncOp(ENTRY + "_kbd", ir.FunctionType.get(memrefs, []), ip=_before(old))
        block = new.add_entry_block()
        old_block = old.entry_block
        with ir.InsertionPoint(block):
            for i, arg in enumerate(old_block.arguments):
                tensor = bufferization.to_tensor(
                    inputs[i], block.arguments[len(results) + i], restrict=True
                )
                arg.replace_all_uses_with(tensor)
        for op in list(old_block.operations):
            if op.name == "func.return":
                with ir.InsertionPoint(block):
                    for j, value in enumerate(op.operands):
                        bufferization.materialize_in_destination(
                            None, value, block.arguments[j], restrict=True, writable=True
                        )
                    func.ReturnOp([])
                op.erase()
            else:
                op.detach_from_parent()
                block.append(op)
        old.erase()
        new.attributes["sym_name"] = ir.StringAttr.get(ENTRY)
        new.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
        return [_buffer_type(t) for t in results], [_buffer_type(t) for t in inputs]


def add_bench_wrappers(module: ir.Module, buffers: int) -> None:
    """Emit the timing loops into a lowered (LLVM dialect) module, after the pipeline.

    `@__kbd_bench(buffer descriptors..., %ns: !llvm.ptr, %samples: i64, %batch: i64)` calls
    `@main`'s C interface `batch` times per sample and stores each sample's nanoseconds in
    `ns[i]`, read with libc's `clock_gettime(CLOCK_MONOTONIC)` (it resolves in the JIT; MLIR's
    `rtclock` lives in a library the torch-mlir wheel lacks). `@__kbd_bench_noop` is the same
    loop around an empty function with the same arguments: what it measures is the calling
    path's overhead. The callees are `noinline` (the empty one also `optnone`, or LLVM would
    delete its calls), so LLVM can neither merge nor hoist repeated calls in the loop.
    Emitting the loops after the pipeline (lighthouse emits its `__benchmark` before) keeps
    schedules from ever seeing them: a transform script may assume the module has one function.
    """
    with module.context, ir.Location.unknown():
        entry = _find_llvm_function(module, CIFACE_PREFIX + ENTRY)
        entry.attributes["no_inline"] = ir.UnitAttr.get()
        ptrs = ", ".join(["!llvm.ptr"] * buffers)
        params = ", ".join(f"%a{i}: !llvm.ptr" for i in range(buffers))
        names = ", ".join(f"%a{i}" for i in range(buffers))
        sep = ", " if buffers else ""
        # The declaration of the entry only lets the snippet parse on its own; it is not moved.
        text = f"llvm.func @{CIFACE_PREFIX}{ENTRY}({ptrs})\n" + _CLOCK
        text += f"llvm.func @__kbd_noop({params}) attributes "
        text += '{passthrough = ["noinline", "optnone"]} {\n  llvm.return\n}\n'
        for wrapper, callee in (
            (BENCH_ENTRY, CIFACE_PREFIX + ENTRY),
            (NOOP_BENCH_ENTRY, "__kbd_noop"),
        ):
            text += _BENCH_LOOP.format(
                wrapper=CIFACE_PREFIX + wrapper,
                callee=callee,
                params=params,
                names=names,
                types=ptrs,
                sep=sep,
            )
        extra = ir.Module.parse(text)
        for op in list(extra.body.operations)[1:]:
            op.detach_from_parent()
            module.body.append(op)


_CLOCK = """
llvm.func @clock_gettime(i32, !llvm.ptr) -> i32
llvm.func @__kbd_now_ns() -> i64 {
  %monotonic = llvm.mlir.constant(1 : i32) : i32
  %one = llvm.mlir.constant(1 : i64) : i64
  %giga = llvm.mlir.constant(1000000000 : i64) : i64
  %ts = llvm.alloca %one x !llvm.struct<(i64, i64)> : (i64) -> !llvm.ptr
  %rc = llvm.call @clock_gettime(%monotonic, %ts) : (i32, !llvm.ptr) -> i32
  %sec = llvm.load %ts : !llvm.ptr -> i64
  %nsec_ptr = llvm.getelementptr %ts[0, 1] : (!llvm.ptr) -> !llvm.ptr, !llvm.struct<(i64, i64)>
  %nsec = llvm.load %nsec_ptr : !llvm.ptr -> i64
  %sec_ns = llvm.mul %sec, %giga : i64
  %now = llvm.add %sec_ns, %nsec : i64
  llvm.return %now : i64
}
"""

# Loops in plain LLVM control flow: for i < samples { t0; for j < batch { call }; ns[i] = t1-t0 }
_BENCH_LOOP = """
llvm.func @{wrapper}({params}{sep}%ns: !llvm.ptr, %samples: i64, %batch: i64) {{
  %zero = llvm.mlir.constant(0 : i64) : i64
  %one = llvm.mlir.constant(1 : i64) : i64
  llvm.br ^sample(%zero : i64)
^sample(%i: i64):
  %more = llvm.icmp "slt" %i, %samples : i64
  llvm.cond_br %more, ^start, ^done
^start:
  %t0 = llvm.call @__kbd_now_ns() : () -> i64
  llvm.br ^call(%zero : i64)
^call(%j: i64):
  %again = llvm.icmp "slt" %j, %batch : i64
  llvm.cond_br %again, ^body, ^stop
^body:
  llvm.call @{callee}({names}) : ({types}) -> ()
  %next_j = llvm.add %j, %one : i64
  llvm.br ^call(%next_j : i64)
^stop:
  %t1 = llvm.call @__kbd_now_ns() : () -> i64
  %dt = llvm.sub %t1, %t0 : i64
  %slot = llvm.getelementptr %ns[%i] : (!llvm.ptr, i64) -> !llvm.ptr, i64
  llvm.store %dt, %slot : i64, !llvm.ptr
  %next_i = llvm.add %i, %one : i64
  llvm.br ^sample(%next_i : i64)
^done:
  llvm.return
}}
"""


class StageError(Exception):
    """A pipeline stage failed; the message is MLIR's first error diagnostic."""


def apply_stage(module: ir.Module, stage: Stage, *, print_after: TextIO | None = None) -> None:
    """Run one pipeline stage on the module in place; raises StageError on a failing pass.

    With `print_after` (a text file, or sys.stderr), the module is printed there after every
    pass of a pass stage (MLIR's IR printing, whole module) and after
    a transform script, under MLIR's `// -----// IR Dump After ... //----- //` headers."""
    with _Diagnostics(module.context) as diagnostics:
        try:
            with module.context:
                if stage.kind == "pass" and stage.text in REWRITES:
                    REWRITES[stage.text](module)  # kbd's own rewrite, not an MLIR pass
                    if print_after is not None:
                        print_module(module, f"IR Dump After {stage.text}", print_after)
                    return
                if stage.kind == "pass":
                    pm = passmanager.PassManager.parse(pass_pipeline(stage))
                    if print_after is None:
                        pm.run(module.operation)
                        return
                    module.context.enable_multithreading(False)  # module scope needs it
                    pm.enable_ir_printing(print_module_scope=True)
                    with _stderr_to(print_after):  # MLIR prints to the process's stderr
                        pm.run(module.operation)
                    return
                script = ir.Module.parse(stage.script)
                entry = _find_named_sequence(script, stage.text)
                try:
                    interpreter.apply_named_sequence(module.operation, entry, script.operation)
                except ValueError as exc:  # the interpreter's failure carries its diagnostics
                    raise StageError(_transform_error(str(exc))) from None
                if print_after is not None:
                    print_module(module, f"IR Dump After transform {stage.name}", print_after)
        except ir.MLIRError as exc:
            raise StageError(diagnostics.first_error() or str(exc)) from None


_DIAGNOSTIC = re.compile(r"Diagnostic message at loc\(.*?\): (.*)")


def _transform_error(text: str) -> str:
    """`error: <first diagnostic>` of a failed transform sequence, else its first line."""
    match = _DIAGNOSTIC.search(text)
    if match:
        return f"error: {match.group(1).strip()}"
    return text.strip().splitlines()[0] if text.strip() else "the transform script failed"


def pass_pipeline(stage: Stage) -> str:
    """A pass stage as a full pass pipeline (what `--pass-pipeline=` of an opt tool takes)."""
    return f"builtin.module({stage.text})"


def print_module(module: ir.Module, title: str, stream: TextIO) -> None:
    """The whole module, complete, under a `// -----// TITLE //----- //` header."""
    stream.write(f"// -----// {title} //----- //\n{module_text(module)}\n")
    stream.flush()


@contextlib.contextmanager
def _stderr_to(stream: TextIO):
    """Point file descriptor 2 at `stream` for a while (MLIR writes to llvm::errs())."""
    sys.stderr.flush()
    stream.flush()
    if stream.fileno() == 2:
        yield
        return
    saved = os.dup(2)
    try:
        os.dup2(stream.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


class _Diagnostics:
    """Collects a context's error diagnostics while active; each is also printed to the log."""

    def __init__(self, context: ir.Context):
        self._context = context
        self.errors: list[str] = []

    def __enter__(self) -> _Diagnostics:
        self._handler = self._context.attach_diagnostic_handler(self._handle)
        return self

    def __exit__(self, *exc) -> None:
        self._handler.detach()

    def _handle(self, diagnostic) -> bool:
        print(f"{diagnostic.location}: {diagnostic.message}", file=sys.stderr, flush=True)
        if diagnostic.severity == ir.DiagnosticSeverity.ERROR:
            self.errors.append(f"error: {diagnostic.message}")
        return True

    def first_error(self) -> str | None:
        return self.errors[0] if self.errors else None


# --- kbd's own rewrites, run as `pass: kbd-...` stages ---------------------------------------
#
# For what these bindings lack: `math-polynomial-approximation` is not registered, so a vector
# `math.exp` would become one libm call per lane.

# Cephes' expf: exp(x) = 2^n * p(r), n = round(x / ln 2) (at most 127), r = x - n ln 2 (ln 2 in
# two parts), p a degree-7 polynomial: within a few ulp for x in [-88.38, 88.72]; 0 below
# (no denormals), +inf above, NaN kept.
_EXP_LOW, _EXP_HIGH = -88.3762626647949, 88.72283935546875
_LOG2E = 1.44269504088896341
_LN2_PARTS = (0.693359375, -2.12194440e-4)
_EXP_POLYNOMIAL = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                   1.6666665459e-1, 5.0000001201e-1)  # fmt: skip


def _ops_named(module: ir.Module, name: str) -> list:
    """Every op called `name` in the module, in walk order (collected first: the rewrites then
    change or move them, which a walk in progress must not see)."""
    found = []

    def visit(op) -> ir.WalkResult:
        if op.name == name:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def polynomial_exp(module: ir.Module) -> int:
    """Replace each `math.exp` of an f32 vector by a polynomial in vector arithmetic (the
    `kbd-polynomial-exp` stage); returns how many were replaced."""
    with module.context, ir.Location.unknown():
        found = [
            op
            for op in _ops_named(module, "math.exp")
            if isinstance(op.operands[0].type, ir.VectorType)
            and isinstance(op.operands[0].type.element_type, ir.F32Type)
        ]
        for op in found:
            _expand_exp(op)
    return len(found)


def _expand_exp(op) -> None:
    x = op.operands[0]
    floats = ir.VectorType(x.type)
    ints = ir.VectorType.get(floats.shape, ir.IntegerType.get_signless(32))
    with ir.InsertionPoint(op), op.location:

        def splat(vector_type, attribute):
            return arith.constant(
                vector_type, ir.DenseElementsAttr.get_splat(vector_type, attribute)
            )

        def const(value: float):
            return splat(floats, ir.FloatAttr.get(ir.F32Type.get(), value))

        given = x
        x = arith.maximumf(arith.minimumf(x, const(_EXP_HIGH)), const(_EXP_LOW))
        n = math_dialect.floor(math_dialect.fma(x, const(_LOG2E), const(0.5)))
        n = arith.minimumf(n, const(127.0))
        r = math_dialect.fma(n, const(-_LN2_PARTS[0]), x)
        r = math_dialect.fma(n, const(-_LN2_PARTS[1]), r)
        p = const(_EXP_POLYNOMIAL[0])
        for coefficient in _EXP_POLYNOMIAL[1:]:
            p = math_dialect.fma(p, r, const(coefficient))
        p = arith.addf(math_dialect.fma(p, arith.mulf(r, r), r), const(1.0))
        i32 = ir.IntegerType.get_signless(32)
        exponent = arith.addi(arith.fptosi(ints, n), splat(ints, ir.IntegerAttr.get(i32, 127)))
        scale = arith.bitcast(
            floats, arith.shli(exponent, splat(ints, ir.IntegerAttr.get(i32, 23)))
        )
        overflow = arith.cmpf(arith.CmpFPredicate.OGT, given, const(_EXP_HIGH))
        result = arith.select(overflow, const(float("inf")), arith.mulf(p, scale))
    op.results[0].replace_all_uses_with(result)
    op.erase()


def openmp_guided_schedule(module: ir.Module) -> int:
    """Give each `omp.wsloop` a guided schedule (the `kbd-openmp-guided-schedule` stage;
    `convert-scf-to-openmp` has no option for it); returns how many loops it changed.

    Without a schedule each thread gets a fixed share of the iterations, so a parallel loop
    lasts as long as its slowest thread: when another process takes one of the cores for a
    while, the other thread finishes its share and waits. Under a guided schedule a thread that
    is done takes the next chunk, chunks shrinking from half a thread's share down to one
    iteration: a handful of takes per thread even for a loop of a million iterations, where a
    dynamic schedule would take them one by one."""
    with module.context:
        found = [
            op for op in _ops_named(module, "omp.wsloop") if "schedule_kind" not in op.attributes
        ]
        guided = ir.Attribute.parse("#omp<schedulekind guided>")
        for op in found:
            op.attributes["schedule_kind"] = guided
    return len(found)


# Ops whose memref results are views of their memref operand: the same buffer.
_VIEWS = frozenset({
    "memref.subview", "memref.cast", "memref.reinterpret_cast", "memref.expand_shape",
    "memref.collapse_shape", "memref.view", "memref.transpose", "memref.memory_space_cast",
    "memref.assume_alignment", "memref.extract_strided_metadata", "vector.type_cast",
})  # fmt: skip
# Ops through which a buffer may be freed, or reached later by address.
_ESCAPES = frozenset({
    "memref.dealloc", "bufferization.dealloc", "memref.extract_aligned_pointer_as_index",
    "func.call", "func.call_indirect",
})  # fmt: skip


_MEMREF_TYPES = (ir.MemRefType, ir.UnrankedMemRefType)


def _buffer_users(buffer: ir.Value, ignore: ir.Operation | None = None) -> list | None:
    """The ops that use `buffer` or a view of it (views excluded), or None when an alias may
    escape: yielded or returned (a terminator), passed to a call or a free, turned into an
    address, or a result of an op that is not a known view."""
    users, pending = [], [buffer]
    while pending:
        for use in pending.pop().uses:
            op = use.owner.operation
            if ignore is not None and op == ignore:
                continue
            if op.name in _VIEWS:
                pending.extend(r for r in op.results if isinstance(r.type, ir.MemRefType))
                continue
            if (
                op.name in _ESCAPES
                or op.has_trait(ir.IsTerminatorTrait)
                or any(isinstance(r.type, _MEMREF_TYPES) for r in op.results)
            ):
                return None
            users.append(op)
    return users


def _ancestor_in(op: ir.Operation, block: ir.Block) -> ir.Operation | None:
    """`op`, or the op holding it in its regions, that sits directly in `block`."""
    while op is not None and op.block != block:
        op = op.parent
    return op


def deallocs_after_last_use(module: ir.Module) -> int:
    """Move each `memref.dealloc` of a buffer allocated in the same block up to just after the
    last op of that block that uses the buffer or a view of it (the `kbd-dealloc-after-last-use`
    stage); returns how many moved.

    MLIR's ownership-based deallocation frees a buffer at the end of its block, so a function
    holds every intermediate buffer until it returns: level1/89_cumsum at 4096x32768 (15 steps
    of shifted adds) held 16 buffers of 512 MiB where two are live at a time. A buffer with an
    alias that may escape (see `_buffer_users`) keeps its dealloc where it is."""
    moved = 0
    for dealloc in (op.operation for op in _ops_named(module, "memref.dealloc")):
        buffer = dealloc.operands[0]
        alloc = buffer.owner
        if not isinstance(alloc, ir.Operation | ir.OpView):
            continue  # a block argument
        alloc = alloc.operation
        block = dealloc.block
        if alloc.name != "memref.alloc" or alloc.block != block:
            continue
        users = _buffer_users(buffer, ignore=dealloc)
        if users is None:
            continue
        last = alloc
        for user in users:
            ancestor = _ancestor_in(user, block)
            if ancestor is None:
                break
            if last.is_before_in_block(ancestor):
                last = ancestor
        else:
            if last.is_before_in_block(dealloc):
                dealloc.move_after(last)
                moved += 1
    return moved


# Loops, ops that run a region at most once, and the ops that bound an alloca's lifetime (the
# function; in an `omp.parallel` region, each thread's own stack).
_LOOPS = frozenset({
    "scf.for", "scf.while", "scf.parallel", "affine.for", "affine.parallel", "omp.loop_nest",
    "omp.wsloop", "omp.simd",
})  # fmt: skip
_ONCE = frozenset({"scf.if", "scf.execute_region", "scf.index_switch", "affine.if"})
_STACK_SCOPES = frozenset({"func.func", "omp.parallel"})


def hoist_allocas(module: ir.Module) -> int:
    """Move each fixed-size `memref.alloca` inside a loop to the start of its function, or of
    the `omp.parallel` region that runs it (the `kbd-hoist-allocas` stage); returns how many
    moved.

    convert-vector-to-scf unrolls an N-d vector transfer through a stack buffer, allocated at
    the start of the innermost scf.for body when that loop sits in an OpenMP loop, and the LLVM
    lowering frees an alloca only when its function returns: in the matvec schedule the stack
    grew by 576 bytes per step of the reduction loop, and level1/4's rows of 262144 (16384
    steps) overflowed it. The buffer is scratch within one iteration; one per function (or
    thread) does. An alloca with an alias that may escape (see `_buffer_users`) stays."""
    allocas = [op.operation for op in _ops_named(module, "memref.alloca") if not list(op.operands)]
    moved = 0
    for alloca in allocas:
        scope, in_loop = alloca.parent, False
        while scope is not None and scope.name not in _STACK_SCOPES:
            if scope.name in _LOOPS:
                in_loop = True
            elif scope.name not in _ONCE:
                scope = None
                break
            scope = scope.parent
        if scope is None or not in_loop or _buffer_users(alloca.results[0]) is None:
            continue
        entry = scope.regions[0].blocks[0]
        alloca.move_before(entry.operations[0])
        moved += 1
    return moved


# A matmul with at most this many rows of A reads B in its stored (N x K) order instead of a
# transposed copy: with few rows the copy (a strided pass over all of B) weighs as much as the
# product or more, and the product streams B's rows along K, the rows of A staying in cache.
# With many rows the product dominates, and the matmul schedule's micro-kernel wants B's rows
# along N. (level2/37, 128 rows of 1024 times W of 4096 x 1024, at bench shapes: 1.41x eager
# folded, 0.70x with the transposed copy.)
_FOLD_TRANSPOSE_MAX_ROWS = 128


def _matmul_maps(b_dims: tuple[int, int]) -> list[ir.AffineMap]:
    """Indexing maps over (m, n, k) of C[m, n] += A[m, k] * B[b_dims]."""
    return [
        ir.AffineMap.get(3, 0, [ir.AffineDimExpr.get(d) for d in dims])
        for dims in ((0, 2), b_dims, (0, 1))
    ]


def fold_transpose_into_matmul(module: ir.Module) -> int:
    """Make each `linalg.matmul` of at most `_FOLD_TRANSPOSE_MAX_ROWS` (static) rows whose B is
    a `linalg.transpose` read the transpose's input through transposed indexing maps,
    `C[m, n] += A[m, k] * W[n, k]`, and erase the transpose once unused (the
    `kbd-fold-transpose-into-matmul` stage); returns how many matmuls changed.

    torch-mlir imports `nn.Linear` (y = x W^T) as a transpose of the whole weight into a new
    tensor, then a matmul: for x of 8 rows and W of 8192 x 8192, a 256 MiB strided copy per
    call, slower than the product itself. The matmul schedules tell the folded matmul from the
    plain one by its maps."""
    changed = 0
    with module.context, ir.Location.unknown():
        plain = [ir.AffineMapAttr.get(m) for m in _matmul_maps((2, 1))]
        for matmul in _ops_named(module, "linalg.matmul"):
            matmul = matmul.operation
            a, b, c = matmul.operands
            transpose = _producer(b)
            rows = ir.ShapedType(a.type).shape[0]
            if (
                transpose is None
                or transpose.name != "linalg.transpose"
                or list(ir.DenseI64ArrayAttr(transpose.attributes["permutation"])) != [1, 0]
                or list(ir.ArrayAttr(matmul.attributes["indexing_maps"])) != plain
                or ir.ShapedType.is_dynamic_size(rows)
                or rows > _FOLD_TRANSPOSE_MAX_ROWS
            ):
                continue
            with ir.InsertionPoint(matmul), matmul.location:
                folded = linalg.matmul(
                    a, transpose.operands[0], outs=[c], indexing_maps=_matmul_maps((1, 2))
                )
            matmul.results[0].replace_all_uses_with(folded)
            matmul.erase()
            changed += 1
            if not list(transpose.result.uses):
                init = _producer(transpose.operands[1])
                transpose.erase()
                if init is not None and init.name == "tensor.empty" and not list(init.result.uses):
                    init.erase()
    return changed


def _producer(value: ir.Value) -> ir.Operation | None:
    """The op whose result `value` is (None for a block argument)."""
    owner = value.owner
    return owner.operation if isinstance(owner, ir.Operation | ir.OpView) else None


REWRITES = {
    "kbd-fold-transpose-into-matmul": fold_transpose_into_matmul,
    "kbd-polynomial-exp": polynomial_exp,
    "kbd-openmp-guided-schedule": openmp_guided_schedule,
    "kbd-dealloc-after-last-use": deallocs_after_last_use,
    "kbd-hoist-allocas": hoist_allocas,
}


def set_target_features(module: ir.Module, features: Sequence[str]) -> None:
    """Generate code for these CPU features (LLVM names, e.g. `+avx512f`) rather than only the
    host's: sets `target_features` on every `llvm.func` of a module lowered to LLVM. Code built
    for features the host lacks can be compiled and written out, but not run."""
    with module.context:
        attribute = ir.Attribute.parse(
            "#llvm.target_features<[" + ", ".join(f'"{f}"' for f in features) + "]>"
        )
        for op in module.body.operations:
            if op.operation.name == "llvm.func":
                op.attributes["target_features"] = attribute


class Compiled:
    """Compiled code whose entry takes (outputs..., inputs...) as memrefs: JIT-compiled by the
    ExecutionEngine, or loaded from a shared library built from the JIT's object code
    (`from_library`, see kbd.worker.library)."""

    def __init__(self, module: ir.Module, opt_level: int, *, openmp: bool = False):
        """`openmp`: load the OpenMP runtime (the module has parallel loops lowered to it)."""
        libraries = runtime.openmp_libraries() if openmp else []
        self._engine = ExecutionEngine(module, opt_level=opt_level, shared_libs=libraries)
        runtime.register(self._engine)
        self._address = lambda name: self._engine.raw_lookup(CIFACE_PREFIX + name)
        self._entry = self._function(ENTRY)  # forces compilation now, not at first call

    @classmethod
    def from_library(cls, path: Path, *, openmp: bool = False) -> Compiled:
        """Load a library `kbd.worker.library.link` built; raises OSError when it does not load
        (e.g. a symbol the process lacks)."""
        if openmp:
            runtime.openmp_libraries()  # its __kmpc_* symbols resolve the library's calls
        library = ctypes.CDLL(str(path))  # RTLD_LOCAL: its symbols stay its own

        def address(name: str) -> int | None:
            symbol = getattr(library, PACKED_PREFIX + CIFACE_PREFIX + name, None)
            return ctypes.cast(symbol, ctypes.c_void_p).value if symbol is not None else None

        self = cls.__new__(cls)
        self._library = library
        self._address = address
        self._entry = self._function(ENTRY)
        return self

    def write_object(self, path: Path) -> None:
        """Write the JIT-compiled machine code as an object file (e.g. for objdump -d)."""
        self._engine.dump_to_object_file(str(path))

    def __call__(self, buffers: Sequence[np.ndarray]) -> None:
        self._entry(_Packed(buffers).array)

    def timer(self, buffers: Sequence[np.ndarray], *, noop: bool = False) -> BenchTimer:
        """The module's timing loop (see `add_bench_wrappers`) bound to these buffers."""
        return BenchTimer(self._function(NOOP_BENCH_ENTRY if noop else BENCH_ENTRY), buffers)

    def _function(self, name: str):
        """The packed-interface wrapper of function `name` (emitted with a C interface)."""
        address = self._address(name)
        if not address:
            raise RuntimeError(f"the compiled code has no function {name}")
        return ctypes.CFUNCTYPE(None, ctypes.c_void_p)(address)


def external_functions(module: ir.Module) -> set[str]:
    """Names of the functions a module lowered to LLVM declares without defining them."""
    names = set()
    for op in module.body.operations:
        if op.operation.name == "llvm.func" and not op.regions[0].blocks:
            names.add(ir.StringAttr(op.attributes["sym_name"]).value)
    return names


class _Packed:
    """The packed-interface argument array for memref buffers, plus optional index scalars.

    Holds every ctypes object it points to, so the array stays valid while this object lives.
    """

    def __init__(self, buffers: Sequence[np.ndarray], extra: Sequence[object] = ()):
        self._keep = [ctypes.pointer(_descriptor(b)) for b in buffers]
        self._keep += list(extra)
        self.array = (ctypes.c_void_p * len(self._keep))()
        for i, obj in enumerate(self._keep):
            self.array[i] = ctypes.cast(ctypes.pointer(obj), ctypes.c_void_p)


@functools.cache
def _descriptor_type(rank: int) -> type[ctypes.Structure]:
    """The C layout of a ranked memref descriptor: allocated and aligned pointers, offset, then
    sizes and strides (in elements) for rank > 0. One class per rank, made once: compile mode
    calls compiled subgraphs on every forward, and making a ctypes class costs ~100 us."""
    fields = [
        ("allocated", ctypes.c_void_p),
        ("aligned", ctypes.c_void_p),
        ("offset", ctypes.c_int64),
    ]
    if rank:
        fields += [("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    return type(f"MemRefDescriptor{rank}", (ctypes.Structure,), {"_fields_": fields})


def _descriptor(array: np.ndarray) -> ctypes.Structure:
    """The memref descriptor of a numpy array (which must outlive it)."""
    descriptor = _descriptor_type(array.ndim)()
    descriptor.allocated = descriptor.aligned = array.ctypes.data
    if array.ndim:
        descriptor.sizes[:] = array.shape
        descriptor.strides[:] = [stride // array.itemsize for stride in array.strides]
    return descriptor


class BenchTimer:
    """Calls a compiled timing loop: `timer(samples, batch)` -> nanoseconds of each sample."""

    def __init__(self, function, buffers: Sequence[np.ndarray]):
        self._function = function
        self._buffers = list(buffers)

    def __call__(self, samples: int, batch: int) -> np.ndarray:
        ns = np.zeros(samples, np.int64)
        scalars = [ctypes.c_void_p(ns.ctypes.data), ctypes.c_int64(samples), ctypes.c_int64(batch)]
        packed = _Packed(self._buffers, scalars)
        self._function(packed.array)
        return ns


def _find_function(module: ir.Module, name: str) -> func.FuncOp:
    for op in module.body.operations:
        if isinstance(op.opview, func.FuncOp) and op.opview.sym_name.value == name:
            return op.opview
    raise ValueError(f"the imported module has no function @{name}")


def _find_llvm_function(module: ir.Module, name: str):
    for op in module.body.operations:
        is_function = op.operation.name == "llvm.func"
        if is_function and ir.StringAttr(op.attributes["sym_name"]).value == name:
            return op
    raise ValueError(f"the lowered module has no llvm.func @{name}")


def _find_named_sequence(script: ir.Module, path: str):
    for op in script.body.operations:
        if op.operation.name != "transform.named_sequence":
            continue
        if ir.StringAttr(op.attributes["sym_name"]).value == TRANSFORM_ENTRY:
            return op
    raise ValueError(f"{path}: no transform.named_sequence @{TRANSFORM_ENTRY}")


def _before(op) -> ir.InsertionPoint:
    return ir.InsertionPoint(op)


def _memref_type(tensor_type) -> ir.MemRefType:
    t = ir.RankedTensorType(tensor_type)
    return ir.MemRefType.get(t.shape, t.element_type)


def _buffer_type(tensor_type) -> BufferType:
    t = ir.RankedTensorType(tensor_type)
    return BufferType(tuple(t.shape), str(t.element_type))
