"""Scans (cumsum, cumprod) as one pass over the data, applied at import.

torch-mlir lowers `aten.cumsum` and `aten.cumprod` to `tm_tensor.scan`, which upstream
bufferization cannot handle. Each scan becomes a call of a function in upstream ops only, which
every pipeline can lower, inlined right away:

- an `scf.forall` over the dims before the scanned one, each iteration one row (the family
  schedules run it as a parallel loop, a pipeline without them as a sequential one);
- along the innermost dim, a row is scanned a register of lanes at a time: the chunk's own
  log-step scan in registers, plus the carry of the chunks before it; only the carry chains one
  chunk to the next;
- along an outer dim, each step combines the running row of the dims after it (a buffer of its
  own) with the input's, one element-wise `linalg.generic` (marked `kbd.scan`) that also writes
  the result: contiguous rows, every column its own chain.

Each element is read and written once, as eager does, and the result is written straight into
the kernel's output (slices of the tensors themselves, no reshapes in between).
"""

from __future__ import annotations

import math

from torch_mlir import ir, passmanager
from torch_mlir.dialects import func

from kbd.worker.mlir.walk import ops_named

MARKER = "kbd.scan"
LANE_BYTES = 64  # a chunk of a row scanned in registers: one AVX-512 register, two AVX2
_COMBINE = ("arith.addf", "arith.mulf", "arith.addi", "arith.muli")


def scans_as_loops(module: ir.Module) -> int:
    """Replace every inclusive `tm_tensor.scan` of static shape whose combiner is one add or
    multiply, and whose final accumulator is unused, by its loops; returns how many."""
    changed = 0
    with module.context, ir.Location.unknown():
        for op in ops_named(module, "tm_tensor.scan"):
            op = op.operation
            plan = _plan(op)
            if plan is None:
                continue
            name = f"kbd_scan_{changed}"
            _add_function(module, name, *plan)
            with ir.InsertionPoint(op), op.location:
                call = func.CallOp([op.results[0].type], name, [op.operands[0]])
            op.results[0].replace_all_uses_with(call.results[0])
            op.erase()
            changed += 1
    if changed:
        with module.context:
            passmanager.PassManager.parse("builtin.module(inline, symbol-dce)").run(
                module.operation
            )
    return changed


def _plan(op) -> tuple[ir.RankedTensorType, int, str] | None:
    """(the scan's tensor type, its dim, its combining op's name), or None to leave it."""
    if not ir.BoolAttr(op.attributes["inclusive"]).value or len(op.results) != 2:
        return None
    if any(True for _ in op.results[1].uses):
        return None
    kind = ir.RankedTensorType(op.results[0].type)
    if not kind.has_static_shape or kind.rank == 0:
        return None
    body = op.regions[0].blocks[0]
    ops = list(body.operations)
    if len(ops) != 2 or ops[0].operation.name not in _COMBINE:
        return None
    combine = ops[0].operation
    if set(combine.operands) != set(body.arguments) or ops[1].operands[0] != combine.results[0]:
        return None
    dim = ir.IntegerAttr(op.attributes["dimension"]).value
    return kind, dim, combine.name


def _add_function(module: ir.Module, name: str, kind, dim: int, combine: str) -> None:
    """Parse the scan's function and append it to the module."""
    text = _function_text(name, kind, dim, combine)
    parsed = ir.Module.parse(text)
    function = parsed.body.operations[0]
    module.body.append(function.detach_from_parent())


def _function_text(name: str, kind, dim: int, combine: str) -> str:
    """MLIR of `name(x) -> scan of x along dim`, as module-level text (the scan's initial
    output is not needed: an inclusive scan writes every element). Slices of the tensors
    themselves, no reshapes: the result is then written straight into the kernel's output."""
    shape, element = list(kind.shape), str(kind.element_type)
    outer, n, inner = shape[:dim], shape[dim], shape[dim + 1 :]
    full = _tensor(shape, element)
    # the forall's indices over the outer dims (one of a single iteration when there are none)
    ivs = [f"%i{k}" for k in range(len(outer))] or ["%only"]
    offsets = ", ".join([*ivs[: len(outer)], *["0"] * (1 + len(inner))])
    sizes = ", ".join(map(str, [*[1] * len(outer), n, *inner]))
    ones = ", ".join(["1"] * len(shape))
    in_lanes = math.prod(inner) == 1
    block = _tensor([n] if in_lanes else [n, *inner], element)
    body = _in_lanes(n, element, combine) if in_lanes else _along_rows(n, inner, element, combine)
    return f"""
func.func private @{name}(%x: {full}) -> {full} {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %cn = arith.constant {n} : index
  %into = tensor.empty() : {full}
  %scanned = scf.forall ({", ".join(ivs)}) in ({", ".join(map(str, outer or [1]))})
      shared_outs(%o = %into) -> ({full}) {{
    %xs = tensor.extract_slice %x[{offsets}] [{sizes}] [{ones}] : {full} to {block}
    %os = tensor.extract_slice %o[{offsets}] [{sizes}] [{ones}] : {full} to {block}
    {body}
    scf.forall.in_parallel {{
      tensor.parallel_insert_slice %done into %o[{offsets}] [{sizes}] [{ones}]
        : {block} into {full}
    }}
  }}
  return %scanned : {full}
}}
"""


def _in_lanes(n: int, element: str, combine: str) -> str:
    """A row (%xs into %os, 1-D) scanned a register of lanes at a time: the chunk's own scan in
    log2(lanes) steps of a shifted copy (the identity shifted in), then the previous chunks'
    total (the carry, in every lane) combined in, and the last lane broadcast as the next
    carry. Only the carry chains one chunk to the next; a partial last chunk reads the
    identity beyond the row's end and writes only within it."""
    lanes = LANE_BYTES * 8 // _bits(element)
    vector, row = f"vector<{lanes}x{element}>", f"tensor<{n}x{element}>"
    lines = [
        f"%pad = arith.constant {_identity(combine, element)} : {element}",
        f"%ident = vector.broadcast %pad : {element} to {vector}",
        f"%lanes = arith.constant {lanes} : index",
        f"%done, %last = scf.for %j = %c0 to %cn step %lanes"
        f" iter_args(%acc = %os, %carry = %ident) -> ({row}, {vector}) {{",
        f"  %v0 = vector.transfer_read %xs[%j], %pad : {row}, {vector}",
    ]
    shift, step = 1, 0
    while shift < lanes:
        order = ", ".join(str(lanes + i) if i < shift else str(i - shift) for i in range(lanes))
        lines += [
            f"  %s{step} = vector.shuffle %v{step}, %ident [{order}] : {vector}, {vector}",
            f"  %v{step + 1} = {combine} %v{step}, %s{step} : {vector}",
        ]
        shift, step = shift * 2, step + 1
    top = ", ".join([str(lanes - 1)] * lanes)
    lines += [
        f"  %r = {combine} %v{step}, %carry : {vector}",
        f"  %w = vector.transfer_write %r, %acc[%j] : {vector}, {row}",
        f"  %next = vector.shuffle %r, %r [{top}] : {vector}, {vector}",
        f"  scf.yield %w, %next : {row}, {vector}",
        "}",
    ]
    return "\n    ".join(lines)


def _along_rows(n: int, inner: list[int], element: str, combine: str) -> str:
    """A block [n, *inner] (%xs into %os) scanned along its first dim: each row of `inner`
    combined with the running row (the carry, a buffer of its own) by one element-wise
    generic that also writes the result's row. Rows are contiguous, every column is its own
    chain, and nothing is read from the result while it is written (bufferization would copy
    it)."""
    rank = len(inner)
    row, block = _tensor(inner, element), _tensor([n, *inner], element)
    zeros, sizes = ", ".join(["0"] * rank), ", ".join(map(str, inner))
    ones = ", ".join(["1"] * (rank + 1))
    at = f"[1, {sizes}] [{ones}]"
    dims = ", ".join(f"d{k}" for k in range(rank))
    identity = f"affine_map<({dims}) -> ({dims})>"
    parallel = ", ".join(['"parallel"'] * rank)

    def maps(count: int) -> str:
        return f"indexing_maps = [{', '.join([identity] * count)}], iterator_types = [{parallel}]"

    return f"""%x0 = tensor.extract_slice %xs[0, {zeros}] {at} : {block} to {row}
    %d0 = tensor.extract_slice %os[0, {zeros}] {at} : {block} to {row}
    %empty = tensor.empty() : {row}
    %first:2 = linalg.generic {{{maps(3)}}} ins(%x0 : {row}) outs(%empty, %d0 : {row}, {row}) {{
    ^bb0(%a: {element}, %unused: {element}, %unused2: {element}):
      linalg.yield %a, %a : {element}, {element}
    }} -> ({row}, {row})
    %o0 = tensor.insert_slice %first#1 into %os[0, {zeros}] {at} : {row} into {block}
    %done, %last = scf.for %j = %c1 to %cn step %c1 iter_args(%acc = %o0, %carry = %first#0)
        -> ({block}, {row}) {{
      %cur = tensor.extract_slice %xs[%j, {zeros}] {at} : {block} to {row}
      %dest = tensor.extract_slice %acc[%j, {zeros}] {at} : {block} to {row}
      %next:2 = linalg.generic {{{maps(4)}}}
          ins(%carry, %cur : {row}, {row}) outs(%carry, %dest : {row}, {row})
          attrs = {{{MARKER}}} {{
      ^bb0(%a: {element}, %b: {element}, %unused: {element}, %unused2: {element}):
        %v = {combine} %a, %b : {element}
        linalg.yield %v, %v : {element}, {element}
      }} -> ({row}, {row})
      %written = tensor.insert_slice %next#1 into %acc[%j, {zeros}] {at} : {row} into {block}
      scf.yield %written, %next#0 : {block}, {row}
    }}"""


def _bits(element: str) -> int:
    """The width of an integer or float element type's name (i64, f32, bf16)."""
    return int(element.lstrip("bfi"))


def _identity(combine: str, element: str) -> str:
    """The combining op's identity as an MLIR constant of `element`."""
    one = combine in ("arith.mulf", "arith.muli")
    if element.startswith(("f", "bf")):
        return "1.0" if one else "0.0"
    return "1" if one else "0"


def _tensor(shape: list[int], element: str) -> str:
    return f"tensor<{'x'.join(map(str, shape))}x{element}>" if shape else f"tensor<{element}>"
