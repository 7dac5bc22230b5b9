"""Max and average pooling as element-wise maxima or sums over their taps, without a padded
copy of the input (the `kbd-poolings-as-taps` stage).

torch-mlir imports a pooling as a `linalg.pooling_*` op (3-D max pooling as a `linalg.generic`
with the window as reduction dims; 3-D average pooling in channels-last layout between two
transposes) over a `tensor.pad` of its input, and an average as that sum divided by the window's
size. Each output element combines its window's taps, and a tap is a strided view of the input,
so a pooling is one element-wise op over those views: a depthwise convolution without weights
(depthwise.py). Padding holds the reduction's identity (-inf for a max, 0 for a sum), so a tap
that reads padding changes nothing: along each padded dim the output splits into the border
positions, whose windows reach into the padding, and the interior, whose windows lie inside the
input. Each region of that split becomes one element-wise `linalg.generic` over the taps that
stay inside the input, written into its part of the output, so no padded copy is made. A
division of the result by a constant (the average's) is folded into every generic. They carry
the attribute `kbd.pooling` (their rank), by which `pooling.mlir` tiles and vectorizes them.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

from torch_mlir import ir
from torch_mlir.dialects import arith, linalg, tensor

from kbd.worker.mlir.walk import extract, insert, int_array, is_float_constant, producer

MARKER = "kbd.pooling"
RANKS = (3, 4, 5)  # what pooling.mlir tiles: NCW, NCHW and NCDHW
# The reduction of each pooling kind, and the padding value it ignores.
IDENTITY = {"arith.maximumf": -math.inf, "arith.addf": 0.0}
_KINDS = {"max": "arith.maximumf", "sum": "arith.addf"}
_BUILD = {"arith.maximumf": arith.maximumf, "arith.addf": arith.addf}
_EPILOGUES = {"arith.divf": arith.divf, "arith.mulf": arith.mulf}


class Window(NamedTuple):
    """One dim of a pooling window: taps, stride, dilation and the input's low padding."""

    taps: int
    stride: int
    dilation: int
    pad: int = 0


class Pooling(NamedTuple):
    """A pooling op as taps over its unpadded input, in its result's layout."""

    combine: str  # arith op name: arith.maximumf or arith.addf
    data: ir.Value  # the unpadded input
    windows: list[Window]  # one per dim of `data` (1 tap for batch and channel dims)
    start: ir.Value  # the scalar each output starts from (the pooling's fill value)
    result: ir.Value  # the value the taps' output replaces
    epilogue: tuple[str, ir.Value] | None  # a division or product by a scalar, folded in


class Segment(NamedTuple):
    """Consecutive output positions of one dim whose windows have the same taps inside the
    input: `length` positions from `start`, the valid taps' indices."""

    start: int
    length: int
    taps: tuple[int, ...]


def poolings_as_taps(module: ir.Module) -> int:
    """Rewrite every max or sum pooling of static shapes into element-wise generics over its
    taps; returns how many were rewritten."""
    rewritten = 0
    with module.context, ir.Location.unknown():
        # Each one is read again just before it is rewritten, in the order of the module: a
        # pooling may read another's result (GoogLeNet's stride-2 max pool feeds an
        # inception's 3x3 one), which the earlier rewrite replaces. A rewrite erases the op it
        # replaces (the pooling or its epilogue) and what feeds only that: no later pooling.
        for op in _poolings(module):
            pooling = _pooling(op)
            if pooling is None:
                continue
            replaced = producer(pooling.result)
            with ir.InsertionPoint(replaced), replaced.location:
                value = _build(pooling)
            pooling.result.replace_all_uses_with(value)
            _erase_dead(replaced)
            rewritten += 1
    return rewritten


def _poolings(module: ir.Module) -> list:
    """The module's pooling ops (those `_pooling` takes), in order."""
    found = []

    def visit(op) -> ir.WalkResult:
        if _pooling(op) is not None:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def segments(out: int, size: int, window: Window) -> list[Segment]:
    """An output dim of `out` positions over an input dim of `size` split into segments whose
    windows keep the same taps inside the input (border positions alone, the interior whole)."""
    found: list[Segment] = []
    for o in range(out):
        base = o * window.stride - window.pad
        taps = tuple(k for k in range(window.taps) if 0 <= base + k * window.dilation < size)
        if found and found[-1].taps == taps:
            found[-1] = found[-1]._replace(length=found[-1].length + 1)
        else:
            found.append(Segment(o, 1, taps))
    return found


def _build(pooling: Pooling) -> ir.Value:
    """The pooling's result. A window strided along the input's contiguous dim is computed in
    two steps, as max and sum are separable: its outer dims' taps first, over whole rows of the
    input (contiguous vector loads), then the strided taps along the rows of that smaller
    tensor; else every tap at once."""
    out_type = ir.RankedTensorType(pooling.result.type)
    last = len(pooling.windows) - 1
    inner, outer = pooling.windows[last], pooling.windows[:last]
    if inner.stride == 1 or all(w.taps == 1 for w in outer):
        return _taps(pooling, out_type)
    element = out_type.element_type
    width = ir.RankedTensorType(pooling.data.type).shape[last]
    rows_type = ir.RankedTensorType.get([*out_type.shape[:last], width], element)
    start = arith.ConstantOp(element, ir.FloatAttr.get(element, IDENTITY[pooling.combine])).result
    rows = pooling._replace(windows=[*outer, Window(1, 1, 1)], start=start, epilogue=None)
    across = pooling._replace(
        data=_taps(rows, rows_type), windows=[Window(1, 1, 1)] * last + [inner]
    )
    return _taps(across, out_type)


def _taps(pooling: Pooling, out_type: ir.RankedTensorType) -> ir.Value:
    """The pooling's result (of `out_type`), built region by region into a new tensor."""
    data_shape = ir.RankedTensorType(pooling.data.type).shape
    element = out_type.element_type
    shapes = zip(out_type.shape, data_shape, pooling.windows, strict=True)
    dims = [segments(out, size, window) for out, size, window in shapes]
    result = tensor.empty(list(out_type.shape), element)
    for region in itertools.product(*dims):
        offsets = [s.start for s in region]
        sizes = [s.length for s in region]
        views = []
        for tap in itertools.product(*(s.taps for s in region)):
            first = [
                s.start * w.stride + k * w.dilation - w.pad
                for s, w, k in zip(region, pooling.windows, tap, strict=True)
            ]
            strides = [w.stride for w in pooling.windows]
            views.append(extract(pooling.data, element, first, sizes, strides=strides))
        part = _combine(views, extract(result, element, offsets, sizes), pooling)
        result = insert(part, result, offsets, sizes)
    return result


def _combine(views: list, out: ir.Value, pooling: Pooling) -> ir.Value:
    """linalg.generic: out = epilogue(start (+) views[0] (+) views[1] ...), all parallel."""
    out_type = ir.RankedTensorType(out.type)
    rank = out_type.rank
    identity = ir.AffineMapAttr.get(ir.AffineMap.get_identity(rank))
    parallel = ir.Attribute.parse("#linalg.iterator_type<parallel>")
    generic = linalg.GenericOp(
        [out_type],
        views,
        [out],
        ir.ArrayAttr.get([identity] * (len(views) + 1)),
        ir.ArrayAttr.get([parallel] * rank),
    )
    generic.operation.attributes[MARKER] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), rank)
    element = out_type.element_type
    block = generic.regions[0].blocks.append(*([element] * (len(views) + 1)))
    with ir.InsertionPoint(block):
        acc = pooling.start
        for x in list(block.arguments)[:-1]:
            acc = _BUILD[pooling.combine](acc, x)
        if pooling.epilogue is not None:
            name, scalar = pooling.epilogue
            acc = _EPILOGUES[name](acc, scalar)
        linalg.YieldOp([acc])
    return generic.results[0]


def _pooling(op) -> Pooling | None:
    """The pooling `op` is (a named pooling op, or a generic of the same form), or None."""
    found = _named(op) or _generic(op)
    if found is None:
        return None
    combine, source, windows, init = found
    fill = producer(init)
    if fill is None or fill.name != "linalg.fill":
        return None
    types = [ir.RankedTensorType(v.type) for v in (*op.operands, *op.results)]
    if not all(t.has_static_shape for t in types):
        return None
    data, order, pads = _unpadded(source, combine)
    result = _result_in_layout(op.results[0], order)
    if result is None:
        return None
    # Dim t of `data` (and of the result) is dim order.index(t) of the pooling op.
    windows = [windows[order.index(t)]._replace(pad=pads[t]) for t in range(len(order))]
    result, epilogue = _epilogue(result)
    pooling = Pooling(combine, data, windows, fill.operands[0], result, epilogue)
    pooling = _without_unit_dims(pooling)
    return pooling if len(pooling.windows) in RANKS else None


def _named(op) -> tuple[str, ir.Value, list[Window], ir.Value] | None:
    """(combine, input, windows, init) of a `linalg.pooling_<layout>_<max|sum>` op."""
    prefix, _, rest = op.name.partition("_")
    layout, _, kind = rest.partition("_")
    if prefix != "linalg.pooling" or kind not in _KINDS or len(op.operands) != 3:
        return None
    spatial = [i for i, letter in enumerate(layout) if letter in "dhw"]
    shape = ir.RankedTensorType(op.operands[1].type).shape
    strides, dilations = int_array(op, "strides"), int_array(op, "dilations")
    windows = [Window(1, 1, 1)] * len(layout)
    for k, i in enumerate(spatial):
        windows[i] = Window(shape[k], strides[k], dilations[k])
    return _KINDS[kind], op.operands[0], windows, op.operands[2]


def _generic(op) -> tuple[str, ir.Value, list[Window], ir.Value] | None:
    """(combine, input, windows, init) of a `linalg.generic` pooling: inputs the padded tensor
    (indexed by out * stride + tap * dilation) and the window's shape, the window's dims
    reductions after the output's parallel dims, a body of one max or add."""
    if op.name != "linalg.generic" or len(op.operands) != 3 or len(op.results) != 1:
        return None
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    iterators = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    rank = ir.RankedTensorType(op.results[0].type).rank
    reductions = list(range(rank, len(iterators)))
    if (
        not all("parallel" in it for it in iterators[:rank])
        or not all("reduction" in it for it in iterators[rank:])
        or _dims(maps[2]) != list(range(rank))
        or _dims(maps[1]) != reductions
        or _body(op) is None
    ):
        return None
    shape = ir.RankedTensorType(op.operands[1].type).shape
    windows = []
    for i, expr in enumerate(maps[0].results):
        terms = _terms(expr)
        stride = None if terms is None else terms.pop(i, None)
        if stride is None or len(terms) > 1:
            return None
        if not terms:
            windows.append(Window(1, stride, 1))
            continue
        ((tap, dilation),) = terms.items()
        if tap not in reductions:
            return None
        windows.append(Window(shape[reductions.index(tap)], stride, dilation))
    if any(w.taps == 1 and w.stride != 1 for w in windows):
        return None
    return _body(op), op.operands[0], windows, op.operands[2]


def _dims(map_: ir.AffineMap) -> list[int] | None:
    """The dims of a map whose results are plain dims, else None."""
    results = list(map_.results)
    if not all(isinstance(e, ir.AffineDimExpr) for e in results):
        return None
    return [e.position for e in results]


def _terms(expr) -> dict[int, int] | None:
    """{dim: coefficient} of a sum of dims times constants, else None."""
    if isinstance(expr, ir.AffineDimExpr):
        return {expr.position: 1}
    if isinstance(expr, ir.AffineMulExpr):
        lhs, rhs = expr.lhs, expr.rhs
        if isinstance(lhs, ir.AffineConstantExpr):
            lhs, rhs = rhs, lhs
        if isinstance(lhs, ir.AffineDimExpr) and isinstance(rhs, ir.AffineConstantExpr):
            return {lhs.position: rhs.value}
        return None
    if isinstance(expr, ir.AffineAddExpr):
        lhs, rhs = _terms(expr.lhs), _terms(expr.rhs)
        if lhs is None or rhs is None or lhs.keys() & rhs.keys():
            return None
        return lhs | rhs
    return None


def _body(op) -> str | None:
    """The combining op's name of a generic whose body is one max or add of its first input
    and its output, else None."""
    block = op.regions[0].blocks[0]
    body = list(block.operations)
    if len(body) != 2 or body[0].name not in IDENTITY:
        return None
    args = block.arguments
    operands = list(body[0].operands)
    if sorted(map(_arg_index(args), operands)) != [0, 2]:
        return None
    if body[1].operands[0] != body[0].results[0]:
        return None
    return body[0].name


def _arg_index(args):
    def index(value) -> int:
        for i, arg in enumerate(args):
            if value == arg:
                return i
        return -1

    return index


def _unpadded(source: ir.Value, combine: str) -> tuple[ir.Value, list[int], list[int]]:
    """(data, order, low padding): the pooling's input seen through a transpose (dim i of the
    input is dim order[i] of data) and a static padding by the reduction's identity."""
    rank = ir.RankedTensorType(source.type).rank
    order = list(range(rank))
    made = producer(source)
    if made is not None and made.name == "linalg.transpose":
        order = list(ir.DenseI64ArrayAttr(made.attributes["permutation"]))
        source = made.operands[0]
    pads = [0] * rank
    made = producer(source)
    if made is not None and made.name == "tensor.pad" and _pads_with(made, IDENTITY[combine]):
        pads = list(ir.DenseI64ArrayAttr(made.attributes["static_low"]))
        source = made.operands[0]
    return source, order, pads


def _pads_with(pad, value: float) -> bool:
    """Whether a tensor.pad has static sizes and yields the constant `value`."""
    if len(pad.operands) != 1:  # dynamic low or high sizes
        return False
    yielded = list(pad.regions[0].blocks[0].operations)[-1].operands[0]
    return is_float_constant(yielded, value)


def _result_in_layout(result: ir.Value, order: list[int]) -> ir.Value | None:
    """The pooling's result in its input's layout: itself, or the one transpose that undoes
    `order` (None when there is none)."""
    if order == sorted(order):
        return result
    users = [use.owner for use in result.uses]
    if len(users) != 1 or users[0].name != "linalg.transpose":
        return None
    back = list(ir.DenseI64ArrayAttr(users[0].attributes["permutation"]))
    if [order[b] for b in back] != list(range(len(order))):
        return None
    return users[0].results[0]


def _epilogue(result: ir.Value) -> tuple[ir.Value, tuple[str, ir.Value] | None]:
    """(result, epilogue): the one element-wise user dividing or multiplying `result` by a
    scalar from outside it (an average's division), with that op, else `result` alone."""
    users = [use.owner for use in result.uses]
    if len(users) != 1 or users[0].name != "linalg.generic" or len(users[0].operands) != 2:
        return result, None
    user = users[0]
    maps = list(ir.ArrayAttr(user.attributes["indexing_maps"]))
    rank = ir.RankedTensorType(result.type).rank
    identity = ir.AffineMapAttr.get(ir.AffineMap.get_identity(rank))
    block = user.regions[0].blocks[0]
    body = list(block.operations)
    if (
        user.operands[0] != result
        or any(m != identity for m in maps)
        or user.results[0].type != result.type
        or len(body) != 2
        or body[0].name not in _EPILOGUES
        or body[0].operands[0] != block.arguments[0]
        or producer(body[0].operands[1]) is None  # a block argument
        or body[1].operands[0] != body[0].results[0]
    ):
        return result, None
    return user.results[0], (body[0].name, body[0].operands[1])


def _without_unit_dims(pooling: Pooling) -> Pooling:
    """The pooling without the unit dims an expand_shape added to its input and a
    collapse_shape drops from its result (torch-mlir's 1-D pooling as a 2-D one of height 1),
    else as it is: the result is then written in place, not copied out of the taller one."""
    expand = producer(pooling.data)
    users = [use.owner for use in pooling.result.uses]
    if (
        expand is None
        or expand.name != "tensor.expand_shape"
        or len(users) != 1
        or users[0].name != "tensor.collapse_shape"
    ):
        return pooling
    dropped = _unit_dims(expand, ir.RankedTensorType(pooling.data.type).shape)
    if (
        dropped is None
        or dropped != _unit_dims(users[0], ir.RankedTensorType(pooling.result.type).shape)
        or any(pooling.windows[d] != Window(1, 1, 1) for d in dropped)
    ):
        return pooling
    return pooling._replace(
        data=expand.operands[0],
        windows=[w for d, w in enumerate(pooling.windows) if d not in dropped],
        result=users[0].results[0],
    )


def _unit_dims(reshape, shape: list[int]) -> set[int] | None:
    """The dims of `shape` an expand_shape adds or a collapse_shape drops: the unit dims of
    each reassociation group but one (its one dim that is not a unit, else its last); None
    when it merges or splits dims that are not units."""
    dropped = set()
    for group in ir.ArrayAttr(reshape.attributes["reassociation"]):
        group = [ir.IntegerAttr(d).value for d in ir.ArrayAttr(group)]
        wide = [d for d in group if shape[d] != 1] or group[-1:]
        if len(wide) > 1:
            return None
        dropped |= set(group) - set(wide)
    return dropped


def _erase_dead(op) -> None:
    """Erase `op` and, as far as they go, the ops feeding it that nothing else uses."""
    pending = [op]
    while pending:
        op = pending.pop()
        if any(list(r.uses) for r in op.results):
            continue
        feeding = [producer(v) for v in op.operands]
        op.erase()
        for f in feeding:  # once each: an op may feed several of them
            if f is not None and not any(f == p for p in pending):
                pending.append(f)
