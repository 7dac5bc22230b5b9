"""Marking the element-wise work a family's transform scripts left over (the
`kbd-mark-parallel-generics` stage), for `transforms/parallel-generics.mlir` to vectorize.

After a convolution's schedule, its epilogue (bias, activations, scaling), the copies around it
(kbd-conv3d-as-conv2d's transposes) and the fills of its output are `linalg.generic` ops at the
top of the function, which the loop lowering would run as scalar loops on one thread, with a
libm call per element for erf or exp. Each such op whose iterators are all parallel, on static
tensors, gets `kbd.rank` (its loop count): the script, which needs its tile sizes spelled out,
has a sequence per rank. Ops inside loops (tiles a script made) are not marked. Element-wise
ops with math functions that a reduction reads, directly or through other element-wise ops, are
vectorized on their own first (`kbd-mark-reduction-inputs`), so that fusion does not move them
into the reduction, which stays a scalar loop.
"""

from __future__ import annotations

from torch_mlir import ir

from kbd.worker.mlir.walk import iterator_types, ops_named, reaches

RANK = "kbd.rank"
MAX_RANK = 6  # the ranks parallel-generics.mlir has a sequence for
# A copy that swaps its last two dims (a transposed weight, a head split's K^T) gets
# `kbd.transpose` (its rank) instead: tiles of TILE x TILE, each read along its input's rows
# and transposed in registers, instead of rows of the output gathered lane by lane from as many
# rows of the input.
TRANSPOSE = "kbd.transpose"
TRANSPOSE_RANKS = (2, 3)  # the ranks parallel-generics.mlir has a transpose sequence for
TILE = 16


def mark_parallel_generics(module: ir.Module) -> int:
    """Mark every top-level all-parallel `linalg.generic` of static tensors with its rank;
    returns how many were marked."""
    return _mark(module, lambda op: True)


def mark_reduction_inputs(module: ir.Module) -> int:
    """Mark, as `mark_parallel_generics` does, only the generics that compute a math function
    (erf, exp, tanh, ...) and whose result a reduction reads (a generic with a reduction
    iterator), directly or through element-wise generics; returns how many were marked.

    Vectorized before `linalg-fuse-elementwise-ops`, they are loops it cannot fuse into the
    reduction, which the loop lowering would run as scalar code, with a libm call per element.
    Cheaper ops (a copy, a scaling) are left to fuse: a pass of their own over memory would
    cost more than their scalar arithmetic in the reduction's loop."""
    return _mark(module, lambda op: _computes_math(op) and _feeds_a_reduction(op))


def _mark(module: ir.Module, wanted) -> int:
    marked = 0
    with module.context:
        i64 = ir.IntegerType.get_signless(64)
        for function in module.body.operations:
            if function.operation.name != "func.func":
                continue
            for block in function.regions[0].blocks:
                for op in block.operations:
                    rank = _parallel_rank(op.operation)
                    if rank is not None and wanted(op.operation):
                        mark = TRANSPOSE if _last_dims_transpose(op.operation) else RANK
                        op.operation.attributes[mark] = ir.IntegerAttr.get(i64, rank)
                        marked += 1
    return marked


def _last_dims_transpose(op: ir.Operation) -> bool:
    """Whether a generic only copies its one input with the last two dims swapped (leading
    dims in place), over dims that are whole tiles."""
    if len(op.operands) != 2 or len(iterator_types(op)) not in TRANSPOSE_RANKS:
        return False
    body = list(op.regions[0].blocks[0].operations)
    arguments = list(op.regions[0].blocks[0].arguments)
    if len(body) != 1 or list(body[0].operation.operands) != arguments[:1]:
        return False
    rank = len(iterator_types(op))
    dims = [ir.AffineDimExpr.get(d) for d in range(rank)]
    swapped = ir.AffineMap.get(rank, 0, [*dims[:-2], dims[-1], dims[-2]])
    identity = ir.AffineMap.get_identity(rank)
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    shape = ir.RankedTensorType(op.results[0].type).shape
    return maps == [swapped, identity] and shape[-1] % TILE == 0 and shape[-2] % TILE == 0


def _computes_math(op: ir.Operation) -> bool:
    body = op.regions[0].blocks[0]
    return any(inner.operation.name.startswith("math.") for inner in body.operations)


def _feeds_a_reduction(op: ir.Operation) -> bool:
    """Whether a reduction reads the op's result, directly or through element-wise generics
    (conv, tanh, a scaling, a bias, then a max pooling): fusion would pull the whole chain,
    math included, into the reduction's scalar loop."""
    return reaches(
        op,
        found=lambda user: any("reduction" in kind for kind in iterator_types(user)),
        follow=lambda user: bool(iterator_types(user)),
    )


def _parallel_rank(op: ir.Operation) -> int | None:
    iterators = iterator_types(op)
    if not iterators or len(iterators) > MAX_RANK or any("parallel" not in i for i in iterators):
        return None
    for value in [*op.operands, *op.results]:
        if isinstance(value.type, ir.RankedTensorType):
            if not value.type.has_static_shape:
                return None
        elif isinstance(value.type, ir.ShapedType):
            return None  # memrefs, unranked tensors
    return len(iterators)


def drop_generic_asserts(module: ir.Module) -> int:
    """Erase the `cf.assert`s inside `linalg.generic` bodies; returns how many were erased.

    torch-mlir's reciprocal checks its operand `!= 0` per element with one (as torch's batch
    norm decomposition used it, `1 / sqrt(var + eps)`): eager checks nothing (it divides,
    giving inf), and an op with an assert in its body cannot be vectorized,
    so the whole fused epilogue around it would stay a scalar loop."""
    erased = 0
    with module.context:
        for generic in ops_named(module, "linalg.generic"):
            for block in generic.operation.regions[0].blocks:
                for op in list(block.operations):
                    if op.operation.name == "cf.assert":
                        op.operation.erase()
                        erased += 1
    return erased
