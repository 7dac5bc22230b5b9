"""Softmax-like chains left between a family's products, one row at a time (the
`kbd-mark-row-chains` stage), for `transforms/row-chains.mlir`.

Attention computes softmax(Q K^T) V: between its two products, a max over each row of the
scores, the row minus it, its exp, the sum of those and the division by it. As separate
epilogue ops, each is a pass over the whole score matrix (tens of MiB at bench shapes), the
reductions and the element-wise ops in loops of their own. Computed one row at a time, the row
stays in the first-level cache from its max to its division: the scores are read once and the
probabilities written once.

The op that ends such a chain is marked `kbd.row_chain` (its rank): an all-parallel
`linalg.generic` at the top of a function, on static tensors, that reads the result of a
reduction over the last dim of the same iteration space (through reshapes: torch-mlir's
keepdim), and whose result no later op of the chain reads. The script tiles it by single rows
and fuses its producers into each row (the reductions, the exp, their fills), stopping at the
products' own blocks; `transforms/reduction.mlir` vectorizes the ops of each row. A layer or
RMS norm in the middle of a network ends the same way and is fused the same way.
"""

from __future__ import annotations

from torch_mlir import ir
from torch_mlir.dialects import linalg, tensor

from kbd.worker.mlir.walk import iterator_types, producer, reaches

MARK = "kbd.row_chain"
RANKS = (2, 3, 4)  # the ranks row-chains.mlir has a sequence for
# Rows of a multiple of reduction.mlir's widest step vectorize without masks. A masked
# transfer of a row's 3-D or 4-D vectors stays n-D, and its lowering inside the parallel loop
# (a memref.alloca_scope around loops) does not convert to LLVM.
ROW_MULTIPLE = 64
_RESHAPES = ("tensor.expand_shape", "tensor.collapse_shape")


def mark_row_chains(module: ir.Module) -> int:
    """Mark the last op of every softmax-like chain with its rank; returns how many were
    marked."""
    marked = 0
    with module.context, ir.Location.unknown():
        i64 = ir.IntegerType.get_signless(64)
        for function in module.body.operations:
            if function.operation.name != "func.func":
                continue
            for block in function.regions[0].blocks:
                ends = [
                    op.operation
                    for op in block.operations
                    if reads_row_reduction(op.operation) and not _feeds_chain(op.operation)
                ]
                reductions: list[ir.Operation] = []  # chains may share one: rebuilt once
                for end in ends:
                    end.attributes[MARK] = ir.IntegerAttr.get(i64, len(iterator_types(end)))
                    reductions += [r for r in chain_reductions(end) if r not in reductions]
                for reduction in reductions:
                    drop_kept_dim(reduction)
                marked += len(ends)
    return marked


def chain_reductions(end: ir.Operation) -> list[ir.Operation]:
    """The last-dim reductions over the chain's loop ranges that the chain ending at `end`
    reads, directly or through its other ops."""
    ranges = loop_ranges(end)
    return [
        source
        for source in chain_sources(end)
        if loop_ranges(source) == ranges and _last_dim_reduction(source)
    ]


def chain_sources(end: ir.Operation) -> list[ir.Operation]:
    """Every op whose result the chain ending at `end` reads, through reshapes and through its
    ops over the same loop ranges (the chain's own ops, and the ops just outside it)."""
    ranges = loop_ranges(end)
    visited: list[ir.Operation] = []
    pending = [end]
    while pending:
        current = pending.pop()
        for value in current.operands:
            source = through_reshapes(value)
            if source is None or source in visited:
                continue
            visited.append(source)
            if loop_ranges(source) == ranges:
                pending.append(source)
    return visited


def drop_kept_dim(op: ir.Operation) -> None:
    """Make a reduction that keeps its reduced dim (torch's keepdim: the result indexed by a
    constant 0, [R, 1]) one that drops it ([R]) followed by a reshape: tiling needs each
    result indexed by loop dims. Other reductions are left as they are."""
    generic = op.opview
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    inputs, outputs = list(generic.inputs), list(generic.outputs)
    output_maps = maps[len(inputs) :]
    kept = [
        isinstance(m.results[-1], ir.AffineConstantExpr) and ir.RankedTensorType(v.type).rank > 1
        for v, m in zip(outputs, output_maps, strict=True)
    ]
    if not any(kept):
        return
    new_outputs, new_maps, groups = [], maps[: len(inputs)], []
    with ir.InsertionPoint(op):
        for value, indexing, keeps in zip(outputs, output_maps, kept, strict=True):
            kind = ir.RankedTensorType(value.type)
            group = [[d] for d in range(kind.rank - 2)] + [[kind.rank - 2, kind.rank - 1]]
            groups.append(group if keeps else None)
            if keeps:
                dropped = ir.RankedTensorType.get(list(kind.shape[:-1]), kind.element_type)
                value = tensor.collapse_shape(dropped, value, group)
                indexing = ir.AffineMap.get(indexing.n_dims, 0, list(indexing.results)[:-1])
            new_outputs.append(value)
            new_maps.append(indexing)
        rebuilt = linalg.GenericOp(
            [value.type for value in new_outputs],
            inputs,
            new_outputs,
            ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in new_maps]),
            op.attributes["iterator_types"],
        )
        op.regions[0].blocks[0].append_to(rebuilt.regions[0])
        for old, new, group in zip(op.results, rebuilt.results, groups, strict=True):
            if group is not None:
                kind = ir.RankedTensorType(old.type)
                new = tensor.expand_shape(kind, new, group, [], list(kind.shape))
            old.replace_all_uses_with(new)
    op.erase()


def loop_ranges(op: ir.Operation) -> list[int] | None:
    """The static loop ranges of a generic whose loops are parallel but for maybe the last
    one, read from an operand indexed by the identity map; None for any other op."""
    iterators = iterator_types(op)
    if len(iterators) not in RANKS or any("parallel" not in k for k in iterators[:-1]):
        return None
    if not all(_static(value) for value in op.operands):
        return None
    identity = ir.AffineMap.get_identity(len(iterators))
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    for value, indexing in zip(op.operands, maps, strict=True):
        if indexing == identity:
            return list(ir.RankedTensorType(value.type).shape)
    return None


def _static(value: ir.Value) -> bool:
    return isinstance(value.type, ir.RankedTensorType) and value.type.has_static_shape


def _last_dim_reduction(op: ir.Operation) -> bool:
    iterators = iterator_types(op)
    return bool(iterators) and "reduction" in iterators[-1] and loop_ranges(op) is not None


def _all_parallel(op: ir.Operation) -> bool:
    iterators = iterator_types(op)
    return bool(iterators) and "parallel" in iterators[-1] and loop_ranges(op) is not None


def reads_row_reduction(op: ir.Operation) -> bool:
    """Whether an all-parallel generic reads a last-dim reduction over its own loop ranges."""
    if not _all_parallel(op) or loop_ranges(op)[-1] % ROW_MULTIPLE:
        return False
    sources = [through_reshapes(value) for value in op.operands]
    return any(
        source is not None
        and _last_dim_reduction(source)
        and loop_ranges(source) == loop_ranges(op)
        for source in sources
    )


def _feeds_chain(op: ir.Operation) -> bool:
    """Whether a later op of the chain (over the same loop ranges, through reshapes) reads
    this op's result and a row reduction."""
    domain = loop_ranges(op)

    def in_chain(user: ir.Operation) -> bool:
        return user.name not in _RESHAPES and loop_ranges(user) == domain

    return reaches(
        op,
        found=lambda user: in_chain(user) and reads_row_reduction(user),
        follow=lambda user: user.name in _RESHAPES or in_chain(user),
    )


def through_reshapes(value: ir.Value) -> ir.Operation | None:
    """The op that produced a value, looking through expand_shape and collapse_shape."""
    op = producer(value)
    while op is not None and op.name in _RESHAPES:
        op = producer(op.operands[0])
    return op
