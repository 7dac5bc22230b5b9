"""The calling convention of compiled code: `@main` rewritten to take its results as
out-params (memrefs, through the packed C interface), and the timing loops emitted around it."""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir.dialects import arith, bufferization, func, linalg, tensor

ENTRY = "main"
CIFACE_PREFIX = "_mlir_ciface_"  # the C interface of a function with llvm.emit_c_interface
PACKED_PREFIX = "_mlir_"  # the ExecutionEngine's packed-argument wrapper of a function
BENCH_ENTRY = "__kbd_bench"  # times batches of calls to @main
NOOP_BENCH_ENTRY = "__kbd_bench_noop"  # the same loop around an empty function: the overhead


@dataclass(frozen=True)
class BufferType:
    """Shape and element type (kbd name, e.g. 'f32') of one memref argument."""

    dims: tuple[int, ...]
    dtype: str


def results_to_out_params(module: ir.Module) -> tuple[list[BufferType], list[BufferType]]:
    """Rewrite `@main(tensors) -> tensors` into `@main(out memrefs..., in memrefs...)`.

    Inputs become `bufferization.to_tensor ... restrict`, each result is written with
    `bufferization.materialize_in_destination` into its out-param, and the function gets
    `llvm.emit_c_interface` so it can be called through the packed C interface.
    Returns the (outputs, inputs) buffer types in call order.

    A bool tensor's buffer is `i8`, one byte per element as numpy and torch store it, converted
    to and from `i1` inside: in memory LLVM packs a vector of i1 into bits, so a vectorized
    read of an i1 buffer would take 16 bools from 2 bytes.
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
                stored = _tensor_type(memrefs[len(results) + i])
                tensor = bufferization.to_tensor(
                    stored, block.arguments[len(results) + i], restrict=True
                )
                arg.replace_all_uses_with(_converted(tensor, inputs[i]))
        for op in list(old_block.operations):
            if op.name == "func.return":
                with ir.InsertionPoint(block):
                    for j, value in enumerate(op.operands):
                        stored = _converted(value, _tensor_type(memrefs[j]))
                        bufferization.materialize_in_destination(
                            None, stored, block.arguments[j], restrict=True, writable=True
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


def _before(op) -> ir.InsertionPoint:
    return ir.InsertionPoint(op)


def _memref_type(tensor_type) -> ir.MemRefType:
    """The buffer of a tensor: of its element type, bytes for bools."""
    t = ir.RankedTensorType(tensor_type)
    element = t.element_type
    if isinstance(element, ir.IntegerType) and ir.IntegerType(element).width == 1:
        element = ir.IntegerType.get_signless(8)
    return ir.MemRefType.get(t.shape, element)


def _tensor_type(memref_type) -> ir.RankedTensorType:
    m = ir.MemRefType(memref_type)
    return ir.RankedTensorType.get(m.shape, m.element_type)


def _converted(value: ir.Value, to_type) -> ir.Value:
    """`value` as a tensor of `to_type`'s element type: itself when it has it, else i1 <-> i8
    element by element (a bool byte is 0 or 1)."""
    to_type = ir.RankedTensorType(to_type)
    from_type = ir.RankedTensorType(value.type)
    if from_type.element_type == to_type.element_type:
        return value
    rank = from_type.rank
    identity = ir.AffineMapAttr.get(ir.AffineMap.get_identity(rank))
    parallel = ir.Attribute.parse("#linalg.iterator_type<parallel>")
    init = tensor.empty(to_type.shape, to_type.element_type)
    generic = linalg.GenericOp(
        [to_type],
        [value],
        [init],
        ir.ArrayAttr.get([identity, identity]),
        ir.ArrayAttr.get([parallel] * rank),
    )
    body = generic.regions[0].blocks.append(from_type.element_type, to_type.element_type)
    with ir.InsertionPoint(body):
        element = body.arguments[0]
        if ir.IntegerType(to_type.element_type).width == 1:
            converted = arith.trunci(to_type.element_type, element)
        else:
            converted = arith.extui(to_type.element_type, element)
        linalg.YieldOp([converted])
    return generic.results[0]


def _buffer_type(tensor_type) -> BufferType:
    t = ir.RankedTensorType(tensor_type)
    return BufferType(tuple(t.shape), str(t.element_type))
