"""Copies between strided buffers as loops of vector loads and stores (`kbd-vector-copies`).

After bufferization, what the schedules leave as copies (a padded row into its padding, a
slice of a convolution's output, a phase of a transposed convolution into the output) are
`memref.copy` ops between buffers that are not one contiguous run each. As linalg loops,
LLVM unrolls them into single-lane loads and stores and cannot vectorize them: nothing tells
it that the two buffers do not overlap. Where both buffers' rows are contiguous, each copy
becomes here a loop nest over its rows, each row copied in whole vectors (a masked one for its
end).

A strided transposed convolution is computed one output phase at a time
(kbd.worker.transposed_convs), each phase then copied into its strided slice of the output:
along the last dim, phase r of stride s holds columns r, r + s, r + 2s, ... No vector store
writes every s-th lane, and each phase's copy brings the output's rows into the cache again.
The s copies of one row's phases, consecutive after bufferization (only views, and the
deallocations of phases already copied, between them), are merged: each step loads a vector
of every phase, interleaves them in registers (`vector.shuffle`) and stores s vectors of the
row, contiguous, once.

Copies of more than `PARALLEL_ELEMENTS` elements outside parallel loops are `scf.forall`s
over their rows (OpenMP parallel loops, as the schedules' blocks).
"""

from __future__ import annotations

import math

from torch_mlir import ir
from torch_mlir.dialects import arith, memref, scf, vector

from kbd.worker.mlir.walk import contiguous_buffer, ops_named, producer

VECTOR_BYTES = 64  # one step's vector per buffer: 16 f32 lanes (LLVM splits it on AVX2)
PARALLEL_ELEMENTS = 1 << 16
MIN_ROW = 8  # shorter rows stay scalar loops: a masked vector per few elements gains little

# Ops that may stand between the copies of a group: they define views, read and write nothing.
_VIEW_OPS = frozenset(
    {
        "memref.subview",
        "memref.cast",
        "memref.expand_shape",
        "memref.collapse_shape",
        "memref.reinterpret_cast",
        "arith.constant",
    }
)
_PARALLEL_OPS = frozenset({"scf.forall", "scf.parallel", "omp.parallel", "omp.wsloop"})


def vector_copies(module: ir.Module) -> int:
    """Rewrite the copies between buffers with contiguous rows into vector loops, the phases
    of a buffer's last dim interleaved (see the module docstring); returns how many loops."""
    made = 0
    with module.context, ir.Location.unknown():
        for block in _blocks_with_copies(module):
            for group, last, frees in _phase_groups(block):
                for free in reversed(frees):  # the merged loop reads every phase at `last`
                    free.move_after(last)
                _emit(group, last)
                made += 1
        for copy in ops_named(module, "memref.copy"):
            if _row_copy(copy.operation):
                _emit([copy.operation], copy.operation)
                made += 1
    return made


def _blocks_with_copies(module: ir.Module) -> list:
    blocks = []

    def visit(op) -> ir.WalkResult:
        if op.name == "memref.copy":
            block = op.operation.block
            if not any(block == b for b in blocks):
                blocks.append(block)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return blocks


def _layout(kind: ir.Type) -> tuple[list[int], list[int]] | None:
    """(shape, strides) of a memref type with a static shape and static strides, else None."""
    if not isinstance(kind, ir.MemRefType) or not kind.has_static_shape:
        return None
    strides, _ = kind.get_strides_and_offset()
    if any(s == ir.ShapedType.get_dynamic_stride_or_offset() for s in strides):
        return None
    return list(kind.shape), list(strides)


def _vector_lanes(kind: ir.MemRefType) -> int | None:
    element = kind.element_type
    if isinstance(element, ir.IntegerType | ir.FloatType) and element.width in (8, 16, 32, 64):
        return VECTOR_BYTES * 8 // element.width
    return None


def _row_copy(copy) -> bool:
    """Whether a copy is one `_emit` takes alone: same static shapes, rows (the last dim
    but unit ones) of at least MIN_ROW elements contiguous on both sides, the buffers not
    both one run (a memcpy then)."""
    source, target = (_layout(v.type) for v in copy.operands)
    if source is None or target is None or source[0] != target[0] or not source[0]:
        return False
    if _vector_lanes(ir.MemRefType(copy.operands[0].type)) is None:
        return False
    row = _row_dim(source[0])
    if source[0][row] < MIN_ROW or source[1][row] != 1 or target[1][row] != 1:
        return False
    return not all(contiguous_buffer(v.type) for v in copy.operands)


def _row_dim(shape: list[int]) -> int:
    """The dim a copy's rows run along: the last one, unit dims after it aside."""
    return max((d for d, size in enumerate(shape) if size != 1), default=len(shape) - 1)


def _without_trailing_unit_dims(value: ir.Value) -> ir.Value:
    """`value` with the unit dims after its row dim collapsed into it (vector loads and
    stores run along the last dim)."""
    shape = list(ir.MemRefType(value.type).shape)
    row = _row_dim(shape)
    if row == len(shape) - 1:
        return value
    groups = [[d] for d in range(row)] + [list(range(row, len(shape)))]
    return memref.collapse_shape(_collapsed_type(value, row), value, groups)


def _collapsed_type(value: ir.Value, row: int) -> ir.MemRefType:
    kind = ir.MemRefType(value.type)
    strides, offset = kind.get_strides_and_offset()
    shape, strides = list(kind.shape)[: row + 1], strides[: row + 1]
    row_major = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
    if offset == 0 and strides == row_major:  # MLIR's type for it: no layout
        return ir.MemRefType.get(shape, kind.element_type)
    layout = ir.StridedLayoutAttr.get(offset, strides)
    return ir.MemRefType.get(shape, kind.element_type, layout)


def _phase_groups(block) -> list[tuple[list, ir.Operation, list]]:
    """Runs of consecutive copies in `block` (only view ops and deallocations between them)
    that write the s phases of one buffer's last dim: (the copies in phase order, the last in
    the block, the deallocations among them: a phase's source freed after its copy, which
    must wait until the merged loop has read it)."""
    groups, run, frees = [], [], []  # run: (copy, its _phase_target)
    for op in block.operations:
        op = op.operation
        if op.name == "memref.copy":
            run.append((op, _phase_target(op)))
            while run and not _may_start_group([target for _, target in run]):
                run = run[1:]
            frees = [free for free in frees if run and run[0][0].is_before_in_block(free)]
            if run and len(run) == run[0][1][3][-1]:
                in_phase_order = sorted(run, key=lambda pair: pair[1][1][-1])
                groups.append(([copy for copy, _ in in_phase_order], op, frees))
                run, frees = [], []
        elif op.name == "memref.dealloc" and run:
            frees.append(op)
        elif op.name not in _VIEW_OPS:
            run, frees = [], []
    return groups


def _phase_target(copy) -> tuple | None:
    """(the viewed buffer, offsets, sizes, strides) of a copy into one phase of a buffer's
    last dim: its target a static subview of stride s (a power of 2) in the last dim, of a
    buffer whose rows are contiguous; its source of the same shape, rows contiguous, not
    a view of the same buffer. Else None."""
    view = producer(copy.operands[1])
    if view is None or view.name != "memref.subview" or len(view.operands) != 1:
        return None
    offsets, sizes, strides = (
        list(ir.DenseI64ArrayAttr(view.attributes[name]))
        for name in ("static_offsets", "static_sizes", "static_strides")
    )
    if min(offsets + sizes + strides) < 0 or strides[-1] < 2 or strides[-1] & (strides[-1] - 1):
        return None  # dynamic, not phases, or phases the shuffle tree does not interleave
    source, viewed = _layout(copy.operands[0].type), _layout(view.operands[0].type)
    if source is None or viewed is None or source[0] != sizes or len(viewed[0]) != len(sizes):
        return None  # rank-reducing views included
    if source[1][-1] != 1 or viewed[1][-1] != 1 or sizes[-1] < MIN_ROW:
        return None
    if _vector_lanes(ir.MemRefType(copy.operands[0].type)) is None:
        return None
    if _root(copy.operands[0]) == _root(view.operands[0]):
        return None  # it reads the buffer it writes
    return view.operands[0], offsets, sizes, strides


def _root(value: ir.Value) -> ir.Value:
    """The buffer a view is of (following views back to an allocation or an argument)."""
    while True:
        op = producer(value)
        if op is None or op.name not in _VIEW_OPS or not op.operands:
            return value
        value = op.operands[0]


def _may_start_group(targets: list) -> bool:
    """Whether copies with these `_phase_target`s can still grow into a group: into distinct
    phases of the last dim of one buffer, with the same sizes and strides and the same other
    offsets."""
    if any(t is None for t in targets):
        return False
    viewed, offsets, sizes, strides = targets[0]
    lasts = set()
    for other_viewed, other_offsets, other_sizes, other_strides in targets:
        if other_viewed != viewed or other_sizes != sizes or other_strides != strides:
            return False
        if other_offsets[:-1] != offsets[:-1] or other_offsets[-1] in lasts:
            return False
        lasts.add(other_offsets[-1])
    return len(targets) <= strides[-1] and max(lasts) - min(lasts) < strides[-1]


def _emit(group: list, last) -> None:
    """Replace the copies of `group` (one, or the s phases of a row in phase order) by a
    vector loop nest, at the place of `last`, the last of them in their block."""
    phases = len(group)
    with ir.InsertionPoint(last):
        if phases == 1:
            sources = [_without_trailing_unit_dims(group[0].operands[0])]
            target = _without_trailing_unit_dims(group[0].operands[1])
        else:
            sources = [copy.operands[0] for copy in group]
            viewed, offsets, sizes, strides = _phase_target(group[0])
            target = memref.subview(
                viewed,
                offsets,
                [*sizes[:-1], sizes[-1] * phases],
                [*strides[:-1], 1],
            )
        shape, _ = _layout(sources[0].type)
        outer = shape[:-1]
        if outer and math.prod(shape) >= PARALLEL_ELEMENTS and not _in_parallel_loop(last):
            loop = scf.ForallOp([0] * len(outer), outer, [1] * len(outer))
            with ir.InsertionPoint(loop.body):
                _rows(sources, target, list(loop.induction_variables), shape[-1])
                scf.InParallelOp()
        else:
            _nested_rows(sources, target, outer, [], shape[-1])
    for copy in group:
        copy.erase()


def _nested_rows(sources, target, outer: list[int], ivs: list, row: int) -> None:
    if len(ivs) == len(outer):
        _rows(sources, target, ivs, row)
        return
    loop = scf.ForOp(_index(0), _index(outer[len(ivs)]), _index(1))
    with ir.InsertionPoint(loop.body):
        _nested_rows(sources, target, outer, [*ivs, loop.induction_variable], row)
        scf.YieldOp([])


def _rows(sources, target, ivs: list, row: int) -> None:
    """One row of every source (`ivs` its outer indices) into the target's row, interleaved."""
    lanes = _vector_lanes(ir.MemRefType(sources[0].type))
    element = ir.MemRefType(sources[0].type).element_type
    phases = len(sources)
    whole = row // lanes * lanes
    if whole:
        loop = scf.ForOp(_index(0), _index(whole), _index(lanes))
        with ir.InsertionPoint(loop.body):
            column = loop.induction_variable
            kind = ir.VectorType.get([lanes], element)
            values = [vector.load(kind, source, [*ivs, column]) for source in sources]
            at = arith.muli(column, _index(phases)) if phases > 1 else column
            vector.store(_interleaved(values), target, [*ivs, at])
            scf.YieldOp([])
    if row > whole:
        kind = ir.VectorType.get([lanes], element)
        mask = _mask(lanes, row - whole)
        zeros = arith.constant(kind, ir.DenseElementsAttr.get_splat(kind, _zero(element)))
        values = [
            vector.maskedload(kind, source, [*ivs, _index(whole)], mask, zeros)
            for source in sources
        ]
        vector.maskedstore(
            target,
            [*ivs, _index(whole * phases)],
            _mask(lanes * phases, (row - whole) * phases),
            _interleaved(values),
        )


def _interleaved(values: list) -> ir.Value:
    """Lane i of values[r] at lane i * len(values) + r (len(values) a power of 2)."""
    if len(values) == 1:
        return values[0]
    even, odd = _interleaved(values[0::2]), _interleaved(values[1::2])
    lanes = ir.VectorType(even.type).shape[0]
    return vector.shuffle(even, odd, [i // 2 + (lanes if i % 2 else 0) for i in range(2 * lanes)])


def _mask(lanes: int, count: int) -> ir.Value:
    kind = ir.VectorType.get([lanes], ir.IntegerType.get_signless(1))
    return vector.create_mask(kind, [_index(count)])


def _zero(element) -> ir.Attribute:
    if isinstance(element, ir.FloatType):
        return ir.FloatAttr.get(element, 0.0)
    return ir.IntegerAttr.get(element, 0)


def _index(value: int) -> ir.Value:
    return arith.constant(ir.IndexType.get(), value)


def _in_parallel_loop(op) -> bool:
    parent = op.parent
    while parent is not None:
        if parent.name in _PARALLEL_OPS:
            return True
        parent = parent.parent
    return False
