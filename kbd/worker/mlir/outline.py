"""Repeated products and convolutions compiled once: each becomes a call of one function.

A network's graph repeats its layers: an RNN unrolled over its time steps makes the same two
matmuls hundreds of times, a DenseNet block the same 3x3 convolution dozens of times. Every copy
is scheduled, lowered and compiled on its own, and the schedules emit large unrolled register
tiles, so the pipeline and LLVM's code generation grow with the number of copies, to minutes for
level3/34 (256 steps) and level3/16 (DenseNet201).

`outline_repeated_ops` gives each op of the kinds the family schedules tile (`KINDS`), with the
producers that belong to it (`LOCAL`: its accumulator's fill or bias broadcast, its input's
padding, the empty tensors and constants they take), a private function of its own, and
replaces it by a call. Copies whose functions print the same (same op, attributes, types,
producers) share one function. The schedules then tile one function per distinct op, and the
compiler compiles each once. Ops that occur once stay where they are: a call gains nothing there.

The callee's arguments are the group's operands from outside it (the op's inputs, weights, a
bias vector); its result is the op's, allocated in the callee by bufferization. Two kinds of op
stay where they are, since a call would add copies: one that accumulates into a tensor from
outside (a slice of a running sum), and one whose result is written into part of a larger
tensor (a concatenation, a slot of a stacked input), which the caller computes in place, unless
that result is small (`SMALL_WRITTEN_INTO` elements) and the op has many copies
(`MANY_COPIES`): copying a few cached kilobytes then costs less than compiling every copy in
place, which for an RNN's steps (its activation, concatenated with the next input; its output,
stacked) is a parallel region per step in one huge function. The family schedules' rewrites
(channels last, transposes folded, padded widths) see the same local producers inside the callee
as they saw in the caller.
"""

from __future__ import annotations

import math

from torch_mlir import ir
from torch_mlir.dialects import func

from kbd.worker.mlir.walk import ops_named, producer

# Ops the family schedules tile into register blocks (`outline_repeated_ops`)
KINDS = ("linalg.matmul", "linalg.batch_matmul", "linalg.conv_", "linalg.depthwise_conv_")
# Element-wise and reduction ops, once fused with each other (`outline_repeated_generics`)
GENERICS = ("linalg.generic",)
# Producers outlined with the op: the schedules and rewrites read them through its operands
LOCAL = ("linalg.fill", "linalg.broadcast", "tensor.pad", "tensor.empty", "arith.constant")
# Ops whose operand 0 (all operands of a concat) is written into a part of a larger tensor: an op
# whose result goes there is computed in place in the caller (eliminate-empty-tensors), which a
# call returning a buffer of its own would turn into a copy.
WRITTEN_INTO = ("tensor.insert_slice", "tensor.parallel_insert_slice", "tensor.concat")
PREFIX = "kbd_outlined_"
MIN_COPIES = 2
# A result written into a larger tensor is outlined when it has at most this many elements (a
# copy in cache) and its op at least this many copies (compile time worth a copy per call)
SMALL_WRITTEN_INTO = 1 << 16
MANY_COPIES = 8


def outline_repeated_ops(module: ir.Module) -> int:
    """Move every op of `KINDS` occurring at least `MIN_COPIES` times, with its local producers,
    into a private function shared by its copies, and call it; returns how many ops now call
    an outlined function."""
    return _outline(module, KINDS)


def outline_repeated_generics(module: ir.Module) -> int:
    """The same for `linalg.generic`s (an epilogue, a norm's statistics): after the epilogue
    stages have fused them, so that no fusion is lost to a call."""
    return _outline(module, GENERICS)


def erase_unused_outlined_calls(module: ir.Module) -> int:
    """Erase the calls to outlined functions whose results nothing reads; returns how many.

    An outlined function only computes its results from its tensor arguments, but a call is
    not known to be free of side effects, so no cleanup erases one. Tiling and fusing a
    consumer of a call's result (transforms/row-chains.mlir) leaves a copy of the call in
    every tile, unused: each would compute the whole op again."""
    unused = [
        call
        for call in ops_named(module, "func.call")
        if ir.FlatSymbolRefAttr(call.attributes["callee"]).value.startswith(PREFIX)
        and not any(list(result.uses) for result in call.results)
    ]
    for call in unused:
        call.operation.erase()
    return len(unused)


def _outline(module: ir.Module, kinds: tuple[str, ...]) -> int:
    with module.context, ir.Location.unknown():
        groups = [group for group in map(_group, _candidates(module, kinds)) if group is not None]
        texts = [_function_text(group) for group in groups]
        counts: dict[str, int] = {}
        for text in texts:
            counts[text] = counts.get(text, 0) + 1
        names: dict[str, str] = {}
        # An outlined op's result -> its call's: a later group may take it (a chain of
        # products). The ops are erased only at the end, so no group holds an erased value.
        replaced: dict = {}
        outlined = []
        # copies alike that are written into larger tensors need many for any to be outlined
        needed: dict[str, int] = {}
        for group, text in zip(groups, texts, strict=True):
            copies = MANY_COPIES if _written_into(group.op) else MIN_COPIES
            needed[text] = max(needed.get(text, 0), copies)
        for group, text in zip(groups, texts, strict=True):
            if counts[text] < needed[text]:
                continue
            # its op now takes those calls' results
            group.inputs = [replaced.get(value, value) for value in group.inputs]
            if text not in names:
                names[text] = _free_name(module)
                _build(group, names[text], ir.InsertionPoint(module.body))
            _call(group, names[text], replaced)
            outlined.append(group)
        for group in reversed(outlined):
            _erase(group)
    return len(outlined)


def _free_name(module: ir.Module) -> str:
    """The first `PREFIX<n>` no function of the module has (an earlier stage may have some)."""
    taken = {
        ir.StringAttr(op.attributes["sym_name"]).value
        for op in module.body.operations
        if op.operation.name == "func.func"
    }
    return next(f"{PREFIX}{n}" for n in range(len(taken) + 1) if f"{PREFIX}{n}" not in taken)


class _Group:
    """An op to outline with its local producers (in order) and the values it takes from
    outside (the callee's arguments, in order of first use)."""

    def __init__(self, op: ir.Operation, ops: list[ir.Operation], inputs: list[ir.Value]):
        self.op = op
        self.ops = ops
        self.inputs = inputs


def _candidates(module: ir.Module, kinds: tuple[str, ...]) -> list[ir.Operation]:
    """Ops of `kinds` directly in a function's body (not in loops), with one static tensor
    result, not written into a larger tensor unless small, in walk order."""
    found = []
    for function in module.body.operations:
        if function.operation.name != "func.func":
            continue
        name = ir.StringAttr(function.attributes["sym_name"]).value
        if name.startswith(PREFIX) or not function.regions[0].blocks:
            continue
        for op in function.regions[0].blocks[0].operations:
            op = op.operation
            if not op.name.startswith(kinds) or len(op.results) != 1:
                continue
            kind = op.results[0].type
            if not (isinstance(kind, ir.RankedTensorType) and kind.has_static_shape):
                continue
            if math.prod(kind.shape) <= SMALL_WRITTEN_INTO or not _written_into(op):
                found.append(op)
    return found


def _written_into(op: ir.Operation) -> bool:
    """Whether a use of `op`'s result copies it into part of a larger tensor."""
    return any(_copies_into(use) for use in op.results[0].uses)


def _copies_into(use) -> bool:
    """Whether a use of a value copies it into part of a larger tensor (`WRITTEN_INTO`)."""
    owner = use.owner.operation
    if owner.name == "tensor.concat":
        return True
    return owner.name in WRITTEN_INTO and use.operand_number == 0


def _group(op: ir.Operation) -> _Group | None:
    """`op` and the producers of its operands that are local (`LOCAL`, transitively), in an
    order that defines each value before its use; None when its accumulator is not made
    locally (it accumulates into a tensor from outside: the callee would have to copy that in
    and out) or an operand is not a tensor or a scalar (the callee could not take it)."""
    init = producer(op.operands[len(op.operands) - 1])
    if init is None or init.name not in LOCAL:
        return None
    ops: list[ir.Operation] = []
    inputs: list[ir.Value] = []

    def visit(current: ir.Operation) -> None:
        for value in _used_values(current):
            source = producer(value)
            if source is not None and source.name in LOCAL:
                if source not in ops:
                    visit(source)
                    ops.append(source)
            elif value not in inputs:
                inputs.append(value)

    visit(op)
    ops.append(op)
    for value in inputs:
        if not isinstance(value.type, ir.RankedTensorType | ir.FloatType | ir.IntegerType):
            return None
    return _Group(op, ops, inputs)


def _used_values(op: ir.Operation) -> list[ir.Value]:
    """The values `op` uses, its regions' ops included, that are defined outside it (a
    padding's value, a generic body's constant), in order of first use."""
    inside: set = set()
    used: list[ir.Value] = []

    def visit(nested) -> ir.WalkResult:
        nested = nested.operation
        for region in nested.regions:
            for block in region.blocks:
                inside.update(block.arguments)
        if nested != op:
            inside.update(nested.results)
        for value in nested.operands:
            if value not in used:
                used.append(value)
        return ir.WalkResult.ADVANCE

    op.walk(visit, ir.WalkOrder.PRE_ORDER)
    return [value for value in used if value not in inside]


def _remap(op: ir.Operation, mapping: dict) -> None:
    """Replace, in `op` and the ops of its regions, every operand that `mapping` maps."""

    def visit(nested) -> ir.WalkResult:
        nested = nested.operation
        for i, operand in enumerate(nested.operands):
            if operand in mapping:
                nested.operands[i] = mapping[operand]
        return ir.WalkResult.ADVANCE

    op.walk(visit)


def _build(group: _Group, name: str, ip: ir.InsertionPoint) -> func.FuncOp:
    """The group's function, inserted at `ip`: its ops cloned, their operands remapped."""
    result = group.op.results[0].type
    function = func.FuncOp(name, ([v.type for v in group.inputs], [result]), ip=ip)
    function.attributes["sym_visibility"] = ir.StringAttr.get("private")
    block = function.add_entry_block()
    mapping = {value: block.arguments[i] for i, value in enumerate(group.inputs)}
    with ir.InsertionPoint(block):
        for op in group.ops:
            clone = op.clone()
            _remap(clone, mapping)
            for old, new in zip(op.results, clone.results, strict=True):
                mapping[old] = new
        func.ReturnOp([mapping[group.op.results[0]]])
    return function


def _function_text(group: _Group) -> str:
    """The group's function as text, built in a module of its own: what makes two copies share
    one."""
    scratch = ir.Module.create()
    return str(_build(group, "f", ir.InsertionPoint(scratch.body)))


def _call(group: _Group, name: str, replaced: dict) -> None:
    """Make every use of the group's op use a call of `name` instead."""
    op = group.op
    with ir.InsertionPoint(op), op.location:
        call = func.CallOp([op.results[0].type], name, group.inputs)
    op.results[0].replace_all_uses_with(call.results[0])
    replaced[op.results[0]] = call.results[0]


def _erase(group: _Group) -> None:
    """Erase the group's op, now unused, and the producers nothing else uses."""
    group.op.erase()
    for source in reversed(group.ops[:-1]):
        if all(not any(True for _ in r.uses) for r in source.results):
            source.erase()
