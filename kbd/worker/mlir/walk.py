"""Finding ops in a module: the helpers kbd's rewrites share."""

from __future__ import annotations

from torch_mlir import ir
from torch_mlir.dialects import linalg, tensor


def ops_named(module: ir.Module, name: str) -> list:
    """Every op called `name` in the module, in walk order (collected first: the rewrites then
    change or move them, which a walk in progress must not see)."""
    found = []

    def visit(op) -> ir.WalkResult:
        if op.name == name:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def producer(value: ir.Value) -> ir.Operation | None:
    """The op whose result `value` is (None for a block argument)."""
    owner = value.owner
    return owner.operation if isinstance(owner, ir.Operation | ir.OpView) else None


def reaches(op: ir.Operation, found, follow) -> bool:
    """Whether an op that `found` accepts reads `op`'s result, directly or through ops that
    `follow` accepts (each user visited once)."""
    visited: list[ir.Operation] = []
    pending = [op]
    while pending:
        current = pending.pop()
        for result in current.results:
            for use in result.uses:
                user = use.owner
                if user in visited:
                    continue
                visited.append(user)
                if found(user):
                    return True
                if follow(user):
                    pending.append(user)
    return False


def iterator_types(op: ir.Operation) -> list[str]:
    """A `linalg.generic`'s iterator types ("#linalg.iterator_type<parallel>", ...); [] for
    any other op."""
    if op.name != "linalg.generic" or "iterator_types" not in op.attributes:
        return []
    return [str(kind) for kind in ir.ArrayAttr(op.attributes["iterator_types"])]


def int_array(op, name: str) -> list[int]:
    """An op's integer elements attribute `name` (a convolution's strides, dilations) as ints."""
    return [int(v) for v in ir.DenseIntElementsAttr(op.attributes[name])]


def static_operand_types(op) -> list[ir.RankedTensorType] | None:
    """The ranked tensor types of an op's operands, or None when one of them is not static."""
    types = [ir.RankedTensorType(v.type) for v in op.operands]
    return types if all(t.has_static_shape for t in types) else None


def is_float_constant(value: ir.Value, number: float) -> bool:
    """Whether `value` is an `arith.constant` float equal to `number`."""
    constant = producer(value)
    if constant is None or constant.name != "arith.constant":
        return False
    attribute = constant.attributes["value"]
    return isinstance(attribute, ir.FloatAttr) and ir.FloatAttr(attribute).value == number


def static_ops(module: ir.Module, name: str) -> list[tuple[ir.Operation, list]]:
    """Every op called `name` whose operands are all static tensors, with their types (the
    convolution rewrites take no other), in walk order."""
    found = []
    for op in ops_named(module, name):
        types = static_operand_types(op.operation)
        if types is not None:
            found.append((op.operation, types))
    return found


def extract(value: ir.Value, element, offsets, sizes, *, strides=None, shape=None) -> ir.Value:
    """A static `tensor.extract_slice` of `value`: `sizes` at `offsets` (with `strides`, 1 by
    default), of type `shape` (default `sizes`; fewer dims for a rank-reducing slice)."""
    result = ir.RankedTensorType.get(list(shape or sizes), element)
    strides = strides or [1] * len(sizes)
    return tensor.extract_slice(result, value, [], [], [], offsets, sizes, strides)


def insert(value: ir.Value, into: ir.Value, offsets, sizes) -> ir.Value:
    """A static `tensor.insert_slice` of `value` into `into`: `sizes` at `offsets`."""
    return tensor.InsertSliceOp(value, into, [], [], [], offsets, sizes, [1] * len(sizes)).result


def channel_init(init: ir.Value, element, shape: list[int], channel_dim: int) -> ir.Value | None:
    """A convolution's accumulator `init` (channels in dim 1) made afresh at `shape` (channels in
    `channel_dim`), when it is a constant (`linalg.fill`) or a bias (`linalg.broadcast` of a
    vector along the channels): the rewrites then need no copy of it (transposed, padded), and
    the conv schedules compute it in registers. None for any other init."""
    source = producer(init)
    if source is None or source.name not in ("linalg.fill", "linalg.broadcast"):
        return None
    if source.name == "linalg.fill":
        return linalg.fill(source.operands[0], outs=[tensor.empty(shape, element)])
    bias = source.operands[0]
    rank = ir.RankedTensorType(init.type).rank
    dimensions = list(ir.DenseI64ArrayAttr(source.attributes["dimensions"]))
    if ir.RankedTensorType(bias.type).shape != [shape[channel_dim]] or dimensions != [
        d for d in range(rank) if d != 1
    ]:
        return None
    broadcast = [d for d in range(len(shape)) if d != channel_dim]
    return linalg.broadcast(bias, outs=[tensor.empty(shape, element)], dimensions=broadcast)


def collapsed(value: ir.Value, shape: list[int], groups: list[list[int]]) -> ir.Value:
    """`value` collapsed to `shape` by `groups` (a view: the grouped dims are contiguous)."""
    element = ir.RankedTensorType(value.type).element_type
    return tensor.collapse_shape(ir.RankedTensorType.get(shape, element), value, groups)


def expanded(value: ir.Value, shape: list[int], groups: list[list[int]]) -> ir.Value:
    """`value` expanded to the static `shape` by `groups` (a view, `collapsed`'s inverse)."""
    element = ir.RankedTensorType(value.type).element_type
    return tensor.expand_shape(ir.RankedTensorType.get(shape, element), value, groups, [], shape)


def transposed(value: ir.Value, permutation: list[int]) -> ir.Value:
    """A `linalg.transpose` of `value` into a new tensor: result dim i is `value`'s dim
    permutation[i]."""
    value_type = ir.RankedTensorType(value.type)
    shape = [value_type.shape[p] for p in permutation]
    empty = tensor.empty(shape, value_type.element_type)
    return linalg.transpose(value, outs=[empty], permutation=permutation).results[0]


def contiguous_buffer(kind) -> bool:
    """Whether a memref type is one contiguous row-major run (unit dims aside)."""
    if not isinstance(kind, ir.MemRefType) or not kind.has_static_shape:
        return False
    strides, _ = kind.get_strides_and_offset()
    expected = 1
    for size, stride in reversed(list(zip(kind.shape, strides, strict=True))):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True
