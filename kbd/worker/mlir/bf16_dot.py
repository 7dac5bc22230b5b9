"""bf16 products on avx512_bf16's dot products (vdpbf16ps), the rewrites of the bf16 matmul
and batch-matmul schedules (schedules/x86_64/avx512_bf16/): folding kbd's f32 widening of bf16
operands into the product (`kbd-fold-bf16-widening-into-matmul`, `...-into-batch-matmul`), then,
after the schedule's transform script packed, tiled and vectorized the products, lowering their
packed contractions to `x86.avx512.dot` (`kbd-bf16-dot-products`)."""

from __future__ import annotations

from torch_mlir import ir
from torch_mlir.dialects import linalg, vector, x86

from kbd.worker.mlir.rewrites import FOLD_TRANSPOSE_MAX_ROWS
from kbd.worker.mlir.walk import ops_named, producer


def _widened_from_bf16(value: ir.Value) -> ir.Value | None:
    """The bf16 tensor that `value` is an element-wise `arith.extf` of (a `linalg.generic` of
    identity maps whose body is the extension alone), or None."""
    generic = producer(value)
    if generic is None or generic.name != "linalg.generic" or len(generic.operands) != 2:
        return None
    source = generic.operands[0]
    if not isinstance(source.type, ir.RankedTensorType):
        return None
    if not isinstance(source.type.element_type, ir.BF16Type):
        return None
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(generic.attributes["indexing_maps"])]
    if any(str(m) != str(ir.AffineMap.get_identity(m.n_dims)) for m in maps):
        return None
    body = [op.name for op in generic.regions[0].blocks[0].operations]
    return source if body == ["arith.extf", "linalg.yield"] else None


def _epilogue(product: ir.Value) -> ir.Operation | None:
    """The element-wise `linalg.generic` that is the product's one use, reading it whole (the
    rounding to bf16 kbd's import puts after every product, or a bias added before it), or
    None. The schedule computes it per block of the product, fused."""
    uses = list(product.uses)
    if len(uses) != 1:
        return None
    generic = uses[0].owner
    generic = generic.operation if isinstance(generic, ir.OpView) else generic
    if generic.name != "linalg.generic" or len(generic.results) != 1:
        return None
    if any(
        "parallel" not in str(kind) for kind in ir.ArrayAttr(generic.attributes["iterator_types"])
    ):
        return None
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(generic.attributes["indexing_maps"])]
    identity = ir.AffineMap.get_identity(len(product.type.shape))
    reads = maps[uses[0].operand_number]
    if reads != identity or maps[-1] != identity:
        return None
    return generic


def _reads_weight_in_place(b: ir.Value, rows: int) -> bool:
    """Whether the f32 schedule will read the matmul's B in place instead: a transposed weight
    (nn.Linear) times at most `FOLD_TRANSPOSE_MAX_ROWS` rows (see fold_transpose_into_matmul),
    cheaper than copying the weight once transposed and once packed."""
    transpose = producer(b)
    return (
        transpose is not None
        and transpose.name == "linalg.transpose"
        and not ir.ShapedType.is_dynamic_size(rows)
        and rows <= FOLD_TRANSPOSE_MAX_ROWS
    )


def fold_bf16_widening_into_matmul(module: ir.Module) -> int:
    """Make each `linalg.matmul` (B stored K x N) whose A and B are bf16 tensors widened to f32
    read the bf16 tensors, accumulating in f32 (linalg.matmul widens its inputs to the output's
    type), and mark it `kbd.bf16_dot` (the `kbd-fold-bf16-widening-into-matmul` stage); returns
    how many matmuls changed.

    kbd widens bf16 products to f32 at import (worker/low_precision.py), so the product's
    inputs are f32 copies; avx512_bf16's dot products (`vdpbf16ps`) take the bf16 values, two
    along K per f32 lane. Only static shapes with an even K fold (the schedule packs K by 2),
    not a transposed weight times a few rows (`_reads_weight_in_place`), and only products
    whose one use is an element-wise epilogue (`_epilogue`, marked `kbd.bf16_dot_epilogue`)."""
    return _fold_bf16_widening(module, "linalg.matmul", linalg.matmul, ((0, 2), (2, 1), (0, 1)))


def fold_bf16_widening_into_batch_matmul(module: ir.Module) -> int:
    """`fold_bf16_widening_into_matmul` for `linalg.batch_matmul` (the
    `kbd-fold-bf16-widening-into-batch-matmul` stage): each schedule folds the products it
    packs, so that no bf16 product is left to a schedule that does not."""
    maps = ((0, 1, 3), (0, 3, 2), (0, 1, 2))
    return _fold_bf16_widening(module, "linalg.batch_matmul", linalg.batch_matmul, maps)


def _fold_bf16_widening(module: ir.Module, name: str, build, dims) -> int:
    changed = 0
    with module.context, ir.Location.unknown():
        default = [
            ir.AffineMap.get(len(dims[0]) + 1, 0, [ir.AffineDimExpr.get(d) for d in m])
            for m in dims
        ]
        for product in ops_named(module, name):
            product = product.operation
            a, b, c = product.operands
            narrow_a, narrow_b = _widened_from_bf16(a), _widened_from_bf16(b)
            maps = (
                [
                    ir.AffineMapAttr(m).value
                    for m in ir.ArrayAttr(product.attributes["indexing_maps"])
                ]
                if "indexing_maps" in product.attributes
                else default
            )
            if (
                narrow_a is None
                or narrow_b is None
                or maps != default
                or not c.type.has_static_shape
                or not a.type.has_static_shape
                or a.type.shape[-1] % 2
                or (name == "linalg.matmul" and _reads_weight_in_place(narrow_b, a.type.shape[0]))
            ):
                continue
            epilogue = _epilogue(product.results[0])
            if epilogue is None:
                continue
            with ir.InsertionPoint(product), product.location:
                folded = build(narrow_a, narrow_b, outs=[c])
            folded.owner.attributes["kbd.bf16_dot"] = ir.UnitAttr.get()
            epilogue.attributes["kbd.bf16_dot_epilogue"] = ir.UnitAttr.get()
            product.results[0].replace_all_uses_with(folded)
            product.erase()
            changed += 1
            for widened in (a,) if a == b else (a, b):
                generic = producer(widened)
                if generic is not None and not list(widened.uses):
                    generic.erase()
    return changed


_DOT_LANES = 16  # f32 lanes of one vdpbf16ps (zmm)


def _packed_bf16_contraction(op) -> tuple[int, int] | None:
    """(rows, columns) of a `vector.contract` that `bf16_dot_products` can lower, or None: bf16
    A and B, an f32 accumulator C, summing over a last dimension of two (the pair) shared by
    A and B and otherwise only over unit dimensions; besides unit dimensions, A is rows x 2,
    B columns x 2 and C rows x columns, columns a multiple of 16. (`matmul-bf16-dot.mlir`
    leaves A[m, k/2, pair] * B[panel, k/2, column, pair] into C[m, panel, column].)"""
    types = [v.type for v in op.operands[:3]]
    if (
        str(op.attributes["kind"]) != "#vector.kind<add>"
        or op.parent.name == "vector.mask"
        or not all(isinstance(t, ir.VectorType) and not t.scalable for t in types)
        or not isinstance(types[0].element_type, ir.BF16Type)
        or not isinstance(types[1].element_type, ir.BF16Type)
        or not isinstance(types[2].element_type, ir.F32Type)
    ):
        return None
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    if any(not isinstance(e, ir.AffineDimExpr) for m in maps for e in m.results):
        return None
    dims = [[ir.AffineDimExpr(e).position for e in m.results] for m in maps]
    size = {
        d: n for ds, t in zip(dims, types, strict=True) for d, n in zip(ds, t.shape, strict=True)
    }
    reduction = {
        i
        for i, kind in enumerate(ir.ArrayAttr(op.attributes["iterator_types"]))
        if "reduction" in str(kind)
    }
    pair = dims[0][-1]
    if dims[1][-1] != pair or size[pair] != 2 or any(size[d] != 1 for d in reduction - {pair}):
        return None
    lhs, rhs, acc = ([d for d in ds if size[d] != 1 and d != pair] for ds in dims)
    if len(lhs) > 1 or len(rhs) != 1 or acc != lhs + rhs or size[rhs[0]] % _DOT_LANES:
        return None
    return (size[lhs[0]] if lhs else 1), size[rhs[0]]


def bf16_dot_products(module: ir.Module) -> int:
    """Lower each packed bf16 `vector.contract` (see `_packed_bf16_contraction`) to avx512_bf16
    dot products (the `kbd-bf16-dot-products` stage): per row m of A, its pair (A[m, 0, :], as
    one 32-bit lane) broadcast to 16 lanes, times each 16 columns of B's pairs, into 16 f32
    accumulators of C (`x86.avx512.dot`, vdpbf16ps). Returns how many contractions changed.

    Upstream's x86 pattern (`vector_contract_to_packed_type_dot_product`) takes one row of 16
    columns per contraction; this takes a whole register tile, so that the tile's accumulator
    stays one vector the K loop carries. Other contractions are left to the generic lowering."""
    changed = 0
    with module.context, ir.Location.unknown():
        bf16, f32, i32 = ir.BF16Type.get(), ir.F32Type.get(), ir.IntegerType.get_signless(32)
        for op in ops_named(module, "vector.contract"):
            op = op.operation
            shape = _packed_bf16_contraction(op)
            if shape is None:
                continue
            rows, columns = shape
            lhs, rhs, acc_nd = op.operands
            with ir.InsertionPoint(op), op.location:
                acc = vector.shape_cast(ir.VectorType.get([rows, columns], f32), acc_nd)
                pairs = vector.bitcast(
                    ir.VectorType.get([rows, 1], i32),
                    vector.shape_cast(ir.VectorType.get([rows, 2], bf16), lhs),
                )
                flat_b = vector.shape_cast(ir.VectorType.get([columns * 2], bf16), rhs)
                lanes = 2 * _DOT_LANES
                b_chunks = [
                    vector.extract_strided_slice(
                        ir.VectorType.get([lanes], bf16), flat_b, [lanes * j], [lanes], [1]
                    )
                    for j in range(columns // _DOT_LANES)
                ]
                result = acc
                for i in range(rows):
                    pair = vector.extract(pairs, [], [i])
                    a = vector.bitcast(
                        ir.VectorType.get([lanes], bf16),
                        vector.broadcast(ir.VectorType.get([_DOT_LANES], i32), pair),
                    )
                    row = vector.extract(acc, [], [i])
                    for j, b in enumerate(b_chunks):
                        c = vector.extract_strided_slice(
                            ir.VectorType.get([_DOT_LANES], f32),
                            row,
                            [_DOT_LANES * j],
                            [_DOT_LANES],
                            [1],
                        )
                        dot = x86.avx512_dot(c, a, b)
                        row = vector.insert_strided_slice(dot, row, [_DOT_LANES * j], [1])
                    result = vector.insert(row, result, [], [i])
                result = vector.shape_cast(acc_nd.type, result)
            op.results[0].replace_all_uses_with(result)
            op.erase()
            changed += 1
        if changed:
            _drop_copies_into_empty(module)
    return changed


def _drop_copies_into_empty(module: ir.Module) -> None:
    """Replace each `linalg.copy` of a tensor into a `tensor.empty` (or a slice of one) by the
    tensor it copies: unpacking C (`lower_unpack`) copies each block of the product into a new
    tensor, which bufferization would keep."""
    for copy in ops_named(module, "linalg.copy"):
        copy = copy.operation
        if len(copy.operands) != 2 or not isinstance(copy.operands[0].type, ir.RankedTensorType):
            continue
        init = producer(copy.operands[1])
        while init is not None and init.name == "tensor.extract_slice":
            init = producer(init.operands[0])
        if (
            init is None
            or init.name != "tensor.empty"
            or copy.operands[0].type != copy.results[0].type
        ):
            continue
        copy.results[0].replace_all_uses_with(copy.operands[0])
        copy.erase()
