"""Reductions over several trailing dims made reductions over one (the
`kbd-collapse-reduction-dims` stage), for `transforms/reduction.mlir`.

A mean over a volume (`x.mean(dim=[2, 3, 4])`, a group norm's statistics) is a `linalg.generic`
whose last few iterators are reductions over the innermost, contiguous dims of its input.
reduction.mlir vectorizes reductions over one last dim; with three it leaves a scalar loop,
a pass over the whole tensor one element at a time. The trailing reduction dims are one dim of
their product, over the input reshaped to match (a `tensor.collapse_shape`, no copy): the op is
edited in place, its body kept. An operand that reads none of those dims but holds them as unit
dims read at constant 0 (a group norm's statistics, [N, C, 1, 1, 1], in a mean over the
normalized values) is reshaped to drop them too: the vectorizer takes no map with constants,
and left such a reduction's tiles scalar.
"""

from __future__ import annotations

import math

from torch_mlir import ir

from kbd.worker.mlir.walk import collapsed, ops_named


def collapse_reduction_dims(module: ir.Module) -> int:
    """Collapse the trailing reduction dims of every `linalg.generic` where each operand reads
    them all, innermost and in order, or none of them; returns how many were collapsed."""
    changed = 0
    with module.context, ir.Location.unknown():
        for op in ops_named(module, "linalg.generic"):
            if _collapse(op.operation):
                changed += 1
    return changed


def _collapse(op: ir.Operation) -> bool:
    kinds = list(ir.ArrayAttr(op.attributes["iterator_types"]))
    first = len(kinds)
    while first > 0 and "reduction" in str(kinds[first - 1]):
        first -= 1
    body = op.regions[0].blocks[0]
    if len(kinds) - first < 2 or any(o.operation.name == "linalg.index" for o in body.operations):
        return False
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    reads = [_reads_trailing(m, first) for m in maps]
    operands = list(op.operands)
    if None in reads or not any(reads):
        return False
    if not all(_static(value) for value, read in zip(operands, reads, strict=True) if read):
        return False
    new_maps = []
    with ir.InsertionPoint(op):
        for i, (value, read, old) in enumerate(zip(operands, reads, maps, strict=True)):
            results = list(old.results)
            if read:
                value_type = ir.RankedTensorType(value.type)
                kept = value_type.rank - (len(kinds) - first)
                shape = [*value_type.shape[:kept], math.prod(value_type.shape[kept:])]
                groups = [[d] for d in range(kept)] + [list(range(kept, value_type.rank))]
                op.operands[i] = collapsed(value, shape, groups)
                results = [*results[:kept], ir.AffineDimExpr.get(first)]
            elif i < len(operands) - len(op.results):  # an input: the results keep their type
                results = _without_trailing_unit_constants(op, i, value, results)
            new_maps.append(ir.AffineMap.get(first + 1, 0, results))
    op.attributes["indexing_maps"] = ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in new_maps])
    op.attributes["iterator_types"] = ir.ArrayAttr.get(kinds[: first + 1])
    return True


def _without_trailing_unit_constants(op: ir.Operation, i: int, value: ir.Value, results: list):
    """An input that reads none of the collapsed dims (a norm's mean or scale, [N, C, 1, 1, 1]
    read as (n, c, 0, 0, 0)): its trailing unit dims, read at constant 0, are folded into the
    dim before them (a `tensor.collapse_shape`, no copy), so that its map is a projected
    permutation (n, c), which the vectorizer takes (with the constants it left the op's
    tiles scalar). Returns the map's new results; `results` when there is nothing to fold."""
    value_type = value.type
    if not isinstance(value_type, ir.RankedTensorType) or not value_type.has_static_shape:
        return results
    kept = len(results)
    while kept > 1 and _unit_constant(results[kept - 1], value_type.shape[kept - 1]):
        kept -= 1
    if kept == len(results) or isinstance(results[kept - 1], ir.AffineConstantExpr):
        return results
    shape = value_type.shape
    groups = [[d] for d in range(kept - 1)] + [list(range(kept - 1, len(shape)))]
    op.operands[i] = collapsed(value, shape[:kept], groups)
    return results[:kept]


def _unit_constant(expr, size: int) -> bool:
    return size == 1 and isinstance(expr, ir.AffineConstantExpr) and expr.value == 0


def _reads_trailing(indexing: ir.AffineMap, first: int) -> bool | None:
    """Whether a map reads the trailing dims (first, first + 1, ...) as its innermost results,
    in order: True; none of them: False; any other way: None."""
    rank = indexing.n_dims
    results = list(indexing.results)
    positions = []
    for expr in results:
        if isinstance(expr, ir.AffineDimExpr):
            positions.append(expr.position)
        elif isinstance(expr, ir.AffineConstantExpr):
            positions.append(None)
        else:
            return None
    used = [p for p in positions if p is not None and p >= first]
    if not used:
        return False
    trailing = list(range(first, rank))
    innermost = positions[len(positions) - len(trailing) :] == trailing
    return True if innermost and len(used) == len(trailing) else None


def _static(value: ir.Value) -> bool:
    return isinstance(value.type, ir.RankedTensorType) and value.type.has_static_shape
