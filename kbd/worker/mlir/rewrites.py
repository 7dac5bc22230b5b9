"""kbd's own IR rewrites, each run as a `pass: kbd-...` stage (the table is
`kbd.worker.mlir.apply.REWRITES`); the bf16 dot-product ones are in `bf16_dot`."""

from __future__ import annotations

import functools

from torch_mlir import ir
from torch_mlir.dialects import arith, linalg, memref, tensor, vector
from torch_mlir.dialects import math as math_dialect

from kbd.worker.mlir.walk import contiguous_buffer, ops_named, producer

# --- kbd's own rewrites, run as `pass: kbd-...` stages ---------------------------------------
#
# For what these bindings lack: `math-polynomial-approximation` is not registered, so a vector
# `math.exp` would become one libm call per lane.

# Cephes' expf: exp(x) = 2^n * p(r), n = round(x / ln 2) (at most 127), r = x - n ln 2 (ln 2 in
# two parts), p a degree-7 polynomial: within a few ulp for x in [-88.38, 88.72]; 0 below
# (no denormals), +inf above, NaN kept.
_EXP_LOW, _EXP_HIGH = -88.3762626647949, 88.72283935546875
_LOG2E = 1.44269504088896341
_LN2_PARTS = (0.693359375, -2.12194440e-4)
_EXP_POLYNOMIAL = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                   1.6666665459e-1, 5.0000001201e-1)  # fmt: skip


def _f32_vector_ops(module: ir.Module, name: str) -> list:
    """Every op called `name` whose operand is a vector of f32 (the polynomial rewrites')."""
    return [
        op
        for op in ops_named(module, name)
        if isinstance(op.operands[0].type, ir.VectorType)
        and isinstance(op.operands[0].type.element_type, ir.F32Type)
    ]


def _splat(vector_type, value: float | int) -> ir.Value:
    """A constant vector of `vector_type` with every lane `value` (f32 or i32 lanes)."""
    element = ir.VectorType(vector_type).element_type
    if isinstance(value, float):
        attribute = ir.FloatAttr.get(element, value)
    else:
        attribute = ir.IntegerAttr.get(element, value)
    return arith.constant(vector_type, ir.DenseElementsAttr.get_splat(vector_type, attribute))


def polynomial_exp(module: ir.Module) -> int:
    """Replace each `math.exp` of an f32 vector by a polynomial in vector arithmetic (the
    `kbd-polynomial-exp` stage); returns how many were replaced."""
    with module.context, ir.Location.unknown():
        found = _f32_vector_ops(module, "math.exp")
        for op in found:
            _expand_exp(op)
    return len(found)


def _expand_exp(op) -> None:
    x = op.operands[0]
    floats = ir.VectorType(x.type)
    ints = ir.VectorType.get(floats.shape, ir.IntegerType.get_signless(32))
    with ir.InsertionPoint(op), op.location:
        const = functools.partial(_splat, floats)

        given = x
        x = arith.maximumf(arith.minimumf(x, const(_EXP_HIGH)), const(_EXP_LOW))
        n = math_dialect.floor(math_dialect.fma(x, const(_LOG2E), const(0.5)))
        n = arith.minimumf(n, const(127.0))
        r = math_dialect.fma(n, const(-_LN2_PARTS[0]), x)
        r = math_dialect.fma(n, const(-_LN2_PARTS[1]), r)
        p = const(_EXP_POLYNOMIAL[0])
        for coefficient in _EXP_POLYNOMIAL[1:]:
            p = math_dialect.fma(p, r, const(coefficient))
        p = arith.addf(math_dialect.fma(p, arith.mulf(r, r), r), const(1.0))
        exponent = arith.addi(arith.fptosi(ints, n), _splat(ints, 127))
        scale = arith.bitcast(floats, arith.shli(exponent, _splat(ints, 23)))
        overflow = arith.cmpf(arith.CmpFPredicate.OGT, given, const(_EXP_HIGH))
        result = arith.select(overflow, const(float("inf")), arith.mulf(p, scale))
    op.results[0].replace_all_uses_with(result)
    op.erase()


# erfc(a) = t exp(-a^2 + P(t)), t = 1 / (1 + a / 2), for a >= 0 (Numerical Recipes' erfcc:
# relative error below 1.2e-7 everywhere), P's coefficients from the constant term up.
_ERFC_POLYNOMIAL = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
                    -1.13520398, 1.48851587, -0.82215223, 0.17087277)  # fmt: skip


def polynomial_erf(module: ir.Module) -> int:
    """Replace each `math.erf` of an f32 vector by erf(x) = sign(x) (1 - erfc(|x|)), erfc a
    polynomial times a vector `math.exp` (the `kbd-polynomial-erf` stage, before
    `kbd-polynomial-exp`, which expands that exp); returns how many were replaced. Without it
    each lane is a call of libm's erff (GELU)."""
    with module.context, ir.Location.unknown():
        found = _f32_vector_ops(module, "math.erf")
        for op in found:
            _expand_erf(op)
    return len(found)


def _expand_erf(op) -> None:
    x = op.operands[0]
    const = functools.partial(_splat, ir.VectorType(x.type))
    with ir.InsertionPoint(op), op.location:
        a = math_dialect.absf(x)
        t = arith.divf(const(1.0), math_dialect.fma(a, const(0.5), const(1.0)))
        p = const(_ERFC_POLYNOMIAL[-1])
        for coefficient in reversed(_ERFC_POLYNOMIAL[:-1]):
            p = math_dialect.fma(p, t, const(coefficient))
        erfc = arith.mulf(t, math_dialect.exp(arith.subf(p, arith.mulf(a, a))))
        result = math_dialect.copysign(arith.subf(const(1.0), erfc), x)
    op.results[0].replace_all_uses_with(result)
    op.erase()


# log(1 + m) = m - m^2/2 + m^3 P(m) for m in [sqrt(1/2) - 1, sqrt(2) - 1] (Cephes' logf, a few
# ulp), P's coefficients from the highest power down.
_LOG_POLYNOMIAL = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
                   1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
                   3.3333331174e-1)  # fmt: skip


def polynomial_log(module: ir.Module) -> int:
    """Replace each `math.log` of an f32 vector by log(2^e m) = e log 2 + log(m), m from the
    bits of x in [sqrt(1/2), sqrt(2)) and log(m) a polynomial (the `kbd-polynomial-log`
    stage); returns how many were replaced. 0 gives -inf, a negative x or NaN NaN, inf inf,
    and subnormals are scaled into the normal range first.
    Without it each lane is a call of libm's logf (Softplus, KL divergence). A vector
    `math.log1p` becomes such a log first, as log(u) (x / (u - 1)) with u = 1 + x (exact where u
    rounds to 1), which keeps log1p's precision near 0."""
    with module.context, ir.Location.unknown():
        for op in _f32_vector_ops(module, "math.log1p"):
            _log1p_as_log(op)
        found = _f32_vector_ops(module, "math.log")
        for op in found:
            _expand_log(op)
    return len(found)


def _log1p_as_log(op) -> None:
    x = op.operands[0]
    floats = ir.VectorType(x.type)
    with ir.InsertionPoint(op), op.location:
        const = functools.partial(_splat, floats)

        u = arith.addf(const(1.0), x)
        scaled = arith.mulf(math_dialect.log(u), arith.divf(x, arith.subf(u, const(1.0))))
        exact = arith.cmpf(arith.CmpFPredicate.OEQ, u, const(1.0))
        infinite = arith.cmpf(arith.CmpFPredicate.OEQ, u, const(float("inf")))
        result = arith.select(exact, x, arith.select(infinite, u, scaled))
    op.results[0].replace_all_uses_with(result)
    op.erase()


def _expand_log(op) -> None:
    x = op.operands[0]
    floats = ir.VectorType(x.type)
    ints = ir.VectorType.get(floats.shape, ir.IntegerType.get_signless(32))
    with ir.InsertionPoint(op), op.location:
        const = functools.partial(_splat, floats)

        integer = functools.partial(_splat, ints)

        # Subnormals (exponent field 0) scaled into the normal range first, 2^23 taken back.
        subnormal = arith.cmpf(arith.CmpFPredicate.OLT, x, const(1.17549435e-38))
        scaled = arith.select(subnormal, arith.mulf(x, const(2.0**23)), x)
        bits = arith.bitcast(ints, scaled)
        # x = 2^e m with m in [1/2, 1): the exponent field, then the mantissa with exponent -1
        e = arith.sitofp(floats, arith.subi(arith.shrui(bits, integer(23)), integer(126)))
        e = arith.addf(e, arith.select(subnormal, const(-23.0), const(0.0)))
        m = arith.bitcast(
            floats, arith.ori(arith.andi(bits, integer(0x007FFFFF)), integer(0x3F000000))
        )
        # m in [sqrt(1/2), sqrt(2)): below sqrt(1/2), double it and take one from e
        low = arith.cmpf(arith.CmpFPredicate.OLT, m, const(0.707106781186547524))
        e = arith.select(low, arith.subf(e, const(1.0)), e)
        m = arith.subf(arith.select(low, arith.addf(m, m), m), const(1.0))
        z = arith.mulf(m, m)
        p = const(_LOG_POLYNOMIAL[0])
        for coefficient in _LOG_POLYNOMIAL[1:]:
            p = math_dialect.fma(p, m, const(coefficient))
        y = arith.mulf(arith.mulf(p, m), z)
        y = math_dialect.fma(e, const(_LN2_PARTS[1]), y)
        y = math_dialect.fma(z, const(-0.5), y)
        result = math_dialect.fma(e, const(_LN2_PARTS[0]), arith.addf(m, y))
        zero = arith.cmpf(arith.CmpFPredicate.OEQ, x, const(0.0))
        invalid = arith.cmpf(arith.CmpFPredicate.ULT, x, const(0.0))  # negative, or NaN
        infinite = arith.cmpf(arith.CmpFPredicate.OEQ, x, const(float("inf")))
        result = arith.select(infinite, const(float("inf")), result)
        result = arith.select(zero, const(-float("inf")), result)
        result = arith.select(invalid, const(float("nan")), result)
    op.results[0].replace_all_uses_with(result)
    op.erase()


def openmp_guided_schedule(module: ir.Module) -> int:
    """Give each `omp.wsloop` a guided schedule (the `kbd-openmp-guided-schedule` stage;
    `convert-scf-to-openmp` has no option for it); returns how many loops it changed.

    Without a schedule each thread gets a fixed share of the iterations, so a parallel loop
    lasts as long as its slowest thread: when another process takes one of the cores for a
    while, the other thread finishes its share and waits. Under a guided schedule a thread that
    is done takes the next chunk, chunks shrinking from half a thread's share down to one
    iteration: a handful of takes per thread even for a loop of a million iterations, where a
    dynamic schedule would take them one by one."""
    with module.context:
        found = [
            op for op in ops_named(module, "omp.wsloop") if "schedule_kind" not in op.attributes
        ]
        guided = ir.Attribute.parse("#omp<schedulekind guided>")
        for op in found:
            op.attributes["schedule_kind"] = guided
    return len(found)


# Ops whose memref results are views of their memref operand: the same buffer.
_VIEWS = frozenset({
    "memref.subview", "memref.cast", "memref.reinterpret_cast", "memref.expand_shape",
    "memref.collapse_shape", "memref.view", "memref.transpose", "memref.memory_space_cast",
    "memref.assume_alignment", "memref.extract_strided_metadata", "vector.type_cast",
})  # fmt: skip
# Ops through which a buffer may be freed, or reached later by address.
_ESCAPES = frozenset({
    "memref.dealloc", "bufferization.dealloc", "memref.extract_aligned_pointer_as_index",
    "func.call", "func.call_indirect",
})  # fmt: skip


_MEMREF_TYPES = (ir.MemRefType, ir.UnrankedMemRefType)


def _buffer_users(buffer: ir.Value, ignore: tuple = ()) -> list | None:
    """The ops that use `buffer` or a view of it (views and the ops in `ignore` excluded), or
    None when an alias may escape: yielded or returned (a terminator), passed to a call or a
    free, turned into an address, or a result of an op that is not a known view."""
    users, pending = [], [buffer]
    while pending:
        for use in pending.pop().uses:
            op = use.owner.operation
            if op in ignore:
                continue
            if op.name in _VIEWS:
                pending.extend(r for r in op.results if isinstance(r.type, ir.MemRefType))
                continue
            if (
                op.name in _ESCAPES
                or op.has_trait(ir.IsTerminatorTrait)
                or any(isinstance(r.type, _MEMREF_TYPES) for r in op.results)
            ):
                return None
            users.append(op)
    return users


def _ancestor_in(op: ir.Operation, block: ir.Block) -> ir.Operation | None:
    """`op`, or the op holding it in its regions, that sits directly in `block`."""
    while op is not None and op.block != block:
        op = op.parent
    return op


def deallocs_after_last_use(module: ir.Module) -> int:
    """Move each `memref.dealloc` of a buffer allocated in the same block up to just after the
    last op of that block that uses the buffer or a view of it (the `kbd-dealloc-after-last-use`
    stage); returns how many moved.

    MLIR's ownership-based deallocation frees a buffer at the end of its block, so a function
    holds every intermediate buffer until it returns: level1/89_cumsum at 4096x32768 (15 steps
    of shifted adds) held 16 buffers of 512 MiB where two are live at a time. A buffer with an
    alias that may escape (see `_buffer_users`) keeps its dealloc where it is."""
    moved = 0
    for dealloc in (op.operation for op in ops_named(module, "memref.dealloc")):
        buffer = dealloc.operands[0]
        alloc = buffer.owner
        if not isinstance(alloc, ir.Operation | ir.OpView):
            continue  # a block argument
        alloc = alloc.operation
        block = dealloc.block
        if alloc.name != "memref.alloc" or alloc.block != block:
            continue
        users = _buffer_users(buffer, ignore=(dealloc,))
        if users is None:
            continue
        last = alloc
        for user in users:
            ancestor = _ancestor_in(user, block)
            if ancestor is None:
                break
            if last.is_before_in_block(ancestor):
                last = ancestor
        else:
            if last.is_before_in_block(dealloc):
                dealloc.move_after(last)
                moved += 1
    return moved


def outputs_in_place(module: ir.Module) -> int:
    """Compute a result in its out-param instead of copying it there (the
    `kbd-outputs-in-place` stage); returns how many copies went.

    A result computed through a reshape of its buffer (an element-wise chain flattened to 1-D,
    a scan's or a product's view) does not bufferize in place: the function allocates a buffer,
    computes into it, copies it whole into the out-param and frees it, an extra pass over the
    output. When the out-param is used by that copy only, and the buffer (an `memref.alloc` in
    the same block, reached from the copy's source through `memref.expand_shape` and
    `collapse_shape` views) is used by nothing after the copy, the buffer becomes the
    out-param seen through the inverse reshapes."""
    changed = 0
    with module.context, ir.Location.unknown():
        for copy in [op.operation for op in ops_named(module, "memref.copy")]:
            source, target = copy.operands
            views, alloc = _reshapes_from(source, copy.block)
            if (
                not isinstance(target, ir.BlockArgument)
                or target.owner != copy.block
                or len(list(target.uses)) != 1
                or alloc is None
                or not _identity_layout(target.type)
            ):
                continue
            deallocs = [
                use.owner.operation
                for use in alloc.results[0].uses
                if use.owner.operation.name == "memref.dealloc"
            ]
            users = _buffer_users(alloc.results[0], ignore=(copy, *deallocs))
            if users is None or any(
                not _ancestor_in(user, copy.block).is_before_in_block(copy) for user in users
            ):
                continue
            with ir.InsertionPoint(alloc), alloc.location:
                value = target
                for view in views:  # from the copy's source back to the buffer: undo each
                    value = _inverse_reshape(view, value)
            alloc.results[0].replace_all_uses_with(value)
            for dealloc in deallocs:
                dealloc.erase()
            copy.erase()
            alloc.erase()
            changed += 1
    return changed


def _reshapes_from(value: ir.Value, block: ir.Block) -> tuple[list, ir.Operation | None]:
    """The `expand_shape`/`collapse_shape` views from `value` back to the `memref.alloc` (of
    static shape, in `block`) they view, and that alloc; (.., None) when there is none."""
    views = []
    op = producer(value)
    while op is not None and op.name in ("memref.expand_shape", "memref.collapse_shape"):
        views.append(op)
        op = producer(op.operands[0])
    if op is None or op.name != "memref.alloc" or op.block != block or list(op.operands):
        return views, None
    return views, op


def _identity_layout(kind) -> bool:
    """A static memref type laid out row-major without offset."""
    buffer = ir.MemRefType(kind)
    layout = buffer.layout
    if not buffer.has_static_shape or not isinstance(layout, ir.AffineMapAttr):
        return False
    layout_map = ir.AffineMapAttr(layout).value
    return layout_map == ir.AffineMap.get_identity(layout_map.n_dims)


def _inverse_reshape(view: ir.Operation, value: ir.Value) -> ir.Value:
    """`value` (of `view`'s result type) reshaped back into `view`'s operand type."""
    source_type = ir.MemRefType(view.operands[0].type)
    reassociation = view.attributes["reassociation"]
    if view.name == "memref.collapse_shape":
        return memref.ExpandShapeOp(
            source_type, value, reassociation, [], list(source_type.shape)
        ).result
    return memref.CollapseShapeOp(source_type, value, reassociation).result


# Loops, ops that run a region at most once, and the ops that bound an alloca's lifetime (the
# function; in an `omp.parallel` region, each thread's own stack).
_LOOPS = frozenset({
    "scf.for", "scf.while", "scf.parallel", "affine.for", "affine.parallel", "omp.loop_nest",
    "omp.wsloop", "omp.simd",
})  # fmt: skip
_ONCE = frozenset({"scf.if", "scf.execute_region", "scf.index_switch", "affine.if"})
_STACK_SCOPES = frozenset({"func.func", "omp.parallel"})


def hoist_allocas(module: ir.Module) -> int:
    """Move each fixed-size `memref.alloca` inside a loop to the start of its function, or of
    the `omp.parallel` region that runs it (the `kbd-hoist-allocas` stage); returns how many
    moved.

    convert-vector-to-scf unrolls an N-d vector transfer through a stack buffer, allocated at
    the start of the innermost scf.for body when that loop sits in an OpenMP loop, and the LLVM
    lowering frees an alloca only when its function returns: in the matvec schedule the stack
    grew by 576 bytes per step of the reduction loop, and level1/4's rows of 262144 (16384
    steps) overflowed it. The buffer is scratch within one iteration; one per function (or
    thread) does. An alloca with an alias that may escape (see `_buffer_users`) stays."""
    allocas = [op.operation for op in ops_named(module, "memref.alloca") if not list(op.operands)]
    moved = 0
    for alloca in allocas:
        scope, in_loop = alloca.parent, False
        while scope is not None and scope.name not in _STACK_SCOPES:
            if scope.name in _LOOPS:
                in_loop = True
            elif scope.name not in _ONCE:
                scope = None
                break
            scope = scope.parent
        if scope is None or not in_loop or _buffer_users(alloca.results[0]) is None:
            continue
        entry = scope.regions[0].blocks[0]
        alloca.move_before(entry.operations[0])
        moved += 1
    return moved


# A matmul with at most this many rows of A reads B in its stored (N x K) order instead of a
# transposed copy: with few rows the copy (a strided pass over all of B) weighs as much as the
# product or more, and the product streams B's rows along K, the rows of A staying in cache.
# With many rows the product dominates, and the matmul schedule's micro-kernel wants B's rows
# along N. (level2/37, 128 rows of 1024 times W of 4096 x 1024, at bench shapes: 1.41x eager
# folded, 0.70x with the transposed copy.)
FOLD_TRANSPOSE_MAX_ROWS = 128


def matmul_maps(b_dims: tuple[int, int]) -> list[ir.AffineMap]:
    """Indexing maps over (m, n, k) of C[m, n] += A[m, k] * B[b_dims]."""
    return _product_maps(b_dims, batched=False)


def batch_matmul_maps(b_dims: tuple[int, int]) -> list[ir.AffineMap]:
    """Indexing maps over (batch, m, n, k) of C[b, m, n] += A[b, m, k] * B[b, b_dims]."""
    return _product_maps(b_dims, batched=True)


def _product_maps(b_dims: tuple[int, int], *, batched: bool) -> list[ir.AffineMap]:
    """Indexing maps over ([batch,] m, n, k) of C[m, n] += A[m, k] * B[b_dims], each operand
    led by the batch dim when `batched`."""
    lead = (0,) if batched else ()
    shift = len(lead)
    return [
        ir.AffineMap.get(3 + shift, 0, [ir.AffineDimExpr.get(d) for d in (*lead, *dims)])
        for dims in ((shift, shift + 2), tuple(d + shift for d in b_dims), (shift, shift + 1))
    ]


def fold_transpose_into_matmul(module: ir.Module) -> int:
    """Make each `linalg.matmul` of at most `FOLD_TRANSPOSE_MAX_ROWS` (static) rows whose B is
    a `linalg.transpose` read the transpose's input through transposed indexing maps,
    `C[m, n] += A[m, k] * W[n, k]`, and erase the transpose once unused (the
    `kbd-fold-transpose-into-matmul` stage); returns how many matmuls changed.

    torch-mlir imports `nn.Linear` (y = x W^T) as a transpose of the whole weight into a new
    tensor, then a matmul: for x of 8 rows and W of 8192 x 8192, a 256 MiB strided copy per
    call, slower than the product itself. The matmul schedules tell the folded matmul from the
    plain one by its maps."""
    return _fold_transposes(module, "linalg.matmul", linalg.matmul, batched=False)


def fold_transpose_into_batch_matmul(module: ir.Module) -> int:
    """The same for `linalg.batch_matmul` whose B is a transpose of its last two dims,
    `C[b, m, n] += A[b, m, k] * K[b, n, k]`, with at most `FOLD_TRANSPOSE_MAX_ROWS` rows per
    matrix (the `kbd-fold-transpose-into-batch-matmul` stage): attention's scores Q K^T, which
    kbd's decomposition writes as a product with a transposed K."""
    return _fold_transposes(module, "linalg.batch_matmul", linalg.batch_matmul, batched=True)


def _fold_transposes(module: ir.Module, name: str, build, *, batched: bool) -> int:
    changed = 0
    swap = [0, 2, 1] if batched else [1, 0]
    with module.context, ir.Location.unknown():
        plain = [ir.AffineMapAttr.get(m) for m in _product_maps((2, 1), batched=batched)]
        for product in ops_named(module, name):
            product = product.operation
            a, b, c = product.operands
            transpose = producer(b)
            rows = ir.ShapedType(a.type).shape[-2]
            if (
                transpose is None
                or transpose.name != "linalg.transpose"
                or list(ir.DenseI64ArrayAttr(transpose.attributes["permutation"])) != swap
                or list(ir.ArrayAttr(product.attributes["indexing_maps"])) != plain
                or ir.ShapedType.is_dynamic_size(rows)
                or rows > FOLD_TRANSPOSE_MAX_ROWS
            ):
                continue
            maps = _product_maps((1, 2), batched=batched)
            with ir.InsertionPoint(product), product.location:
                folded = build(a, transpose.operands[0], outs=[c], indexing_maps=maps)
            product.results[0].replace_all_uses_with(folded)
            product.erase()
            changed += 1
            if not list(transpose.result.uses):
                init = producer(transpose.operands[1])
                transpose.erase()
                if init is not None and init.name == "tensor.empty" and not list(init.result.uses):
                    init.erase()
    return changed


def _whole_tensor_transfer(op) -> ir.RankedTensorType | None:
    """The tensor type of a `vector.transfer_read` or `vector.transfer_write` (unmasked, at
    zero indices) that moves a whole static tensor of rank 2 or more as a vector of the same
    shape, or None."""
    is_read = op.name == "vector.transfer_read"
    tensor_operand, vector_value = (0, op.results[0]) if is_read else (1, op.operands[0])
    shape = list(vector_value.type.shape)
    indices = op.operands[tensor_operand + 1 : tensor_operand + 1 + len(shape)]
    tensor_type = op.operands[tensor_operand].type
    expected_operands = len(shape) + 2  # + source and padding, or value and destination
    if (
        len(shape) < 2
        or not isinstance(tensor_type, ir.RankedTensorType)
        or list(tensor_type.shape) != shape
        or len(op.operands) != expected_operands
        or not all(
            producer(i) is not None
            and producer(i).name == "arith.constant"
            and ir.IntegerAttr(producer(i).attributes["value"]).value == 0
            for i in indices
        )
        or not _contiguous(op.operands[tensor_operand])
    ):
        return None
    return tensor_type


def _contiguous(value: ir.Value) -> bool:
    """Whether the static tensor `value` will be one contiguous run of memory once bufferized:
    followed up through `tensor.extract_slice` ops (unit strides, same rank) and loop-carried
    tensors to the tensor it is part of, its extents must be 1 up to its outermost larger one
    and that tensor's whole extents after it (a 1 x 16 x 2 slice of 32 x 2 is; a 8 x 1 x 32
    slice of 256 x 4 x 32 is not). Function arguments bufferize with identity layouts."""
    sizes = list(value.type.shape)
    while True:
        op = producer(value)
        if op is None:
            if ir.BlockArgument(value).owner.owner.operation.name == "func.func":
                break  # bufferized with an identity layout
            value = _loop_init(value)
            if value is None:
                return False
        elif op.name == "tensor.extract_slice":
            source = op.operands[0]
            strides = list(ir.DenseI64ArrayAttr(op.attributes["static_strides"]))
            if len(source.type.shape) != len(sizes) or any(s != 1 for s in strides):
                return False
            value = source
        else:
            break
    whole = list(value.type.shape)
    if ir.ShapedType.is_dynamic_size(min(whole, default=0)) or any(
        ir.ShapedType.is_dynamic_size(n) for n in whole
    ):
        return False
    outer = next((d for d, n in enumerate(sizes) if n != 1), len(sizes))
    return sizes[outer + 1 :] == whole[outer + 1 :]


def _loop_init(value: ir.Value) -> ir.Value | None:
    """The tensor an `scf.for` iteration argument or `scf.forall` shared output starts from,
    or None for another block argument."""
    argument = ir.BlockArgument(value)
    loop = argument.owner.owner.operation
    carried = len(loop.results)
    first = len(argument.owner.arguments) - carried  # induction variables come first
    if loop.name not in ("scf.for", "scf.forall") or argument.arg_number < first:
        return None
    return loop.operands[len(loop.operands) - carried + argument.arg_number - first]


def flatten_whole_tensor_transfers(module: ir.Module) -> int:
    """Make each whole-tensor `vector.transfer_read` and `vector.transfer_write` (see
    `_whole_tensor_transfer`) a 1-d transfer of the collapsed tensor (the
    `kbd-flatten-whole-tensor-transfers` stage); returns how many changed.

    Lowered as they are, such transfers move their innermost dimension at a time: a 16 x 2
    tile of bf16 pairs (matmul-bf16-dot.mlir's packed B) becomes 16 moves of 4 bytes. The
    upstream flattening patterns apply to memrefs only, after kbd's schedules have run."""
    changed = 0
    with module.context, ir.Location.unknown():
        for name in ("vector.transfer_read", "vector.transfer_write"):
            for op in ops_named(module, name):
                op = op.operation
                tensor_type = _whole_tensor_transfer(op)
                if tensor_type is None:
                    continue
                shape = list(tensor_type.shape)
                size = 1
                for extent in shape:
                    size *= extent
                element = tensor_type.element_type
                flat_tensor = ir.RankedTensorType.get([size], element)
                reassociation = [list(range(len(shape)))]
                identity = ir.AffineMapAttr.get(ir.AffineMap.get_identity(1))
                with ir.InsertionPoint(op), op.location:
                    if name == "vector.transfer_read":
                        source, index, padding = op.operands[0], op.operands[1], op.operands[-1]
                        flat = vector.transfer_read(
                            ir.VectorType.get([size], element),
                            tensor.collapse_shape(flat_tensor, source, reassociation),
                            [index],
                            identity,
                            padding,
                            in_bounds=[True],
                        )
                        new = vector.shape_cast(op.results[0].type, flat)
                    else:
                        value, dest, index = op.operands[0], op.operands[1], op.operands[2]
                        written = vector.transfer_write(
                            flat_tensor,
                            vector.shape_cast(ir.VectorType.get([size], element), value),
                            tensor.collapse_shape(flat_tensor, dest, reassociation),
                            [index],
                            identity,
                            in_bounds=[True],
                        )
                        new = tensor.expand_shape(tensor_type, written, reassociation, [], shape)
                op.results[0].replace_all_uses_with(new)
                op.erase()
                changed += 1
    return changed


def _unit_dims_reassociation(shape: list[int]) -> list[list[int]]:
    """The reassociation that collapses `shape`'s unit dims into their neighbours: each unit dim
    joins the group of the next dim that is not one (the last group when none follows)."""
    groups: list[list[int]] = []
    pending: list[int] = []
    for dim, extent in enumerate(shape):
        pending.append(dim)
        if extent != 1:
            groups.append(pending)
            pending = []
    if pending:
        groups[-1].extend(pending)
    return groups


def _without_batch(value: ir.Value, batched: ir.RankedTensorType) -> ir.Value:
    """`value` (of type `batched`, one batch) without its batch dim: the source of the
    expand_shape that added it, a new fill of a new empty tensor for a fill of an empty one (so
    the schedules still find the matmul's fill as its init's producer), else a collapse_shape."""
    target = ir.RankedTensorType.get(batched.shape[1:], batched.element_type)
    made = producer(value)
    if made is not None and made.name == "tensor.expand_shape" and made.operands[0].type == target:
        return made.operands[0]
    refilled = _refilled(value, target)
    return refilled if refilled is not None else tensor.collapse_shape(target, value, [[0, 1], [2]])


def _refilled(value: ir.Value, target: ir.RankedTensorType) -> ir.Value | None:
    """A new fill of a new empty tensor of type `target` when `value` is a fill of an empty
    tensor (so the schedules still find a matmul's fill as its init's producer), else None."""
    made = producer(value)
    if made is None or made.name != "linalg.fill":
        return None
    init = producer(made.operands[1])
    if init is None or init.name != "tensor.empty":
        return None
    return linalg.fill(made.operands[0], outs=[tensor.empty(target.shape, target.element_type)])


def unit_dims_as_reshapes(module: ir.Module) -> int:
    """Make each `linalg.batch_matmul` of one batch a `linalg.matmul` between reshapes, and each
    `linalg.transpose` that only moves unit dims a reshape (the `kbd-unit-dims-as-reshapes`
    stage); returns how many ops changed.

    torch-mlir imports an einsum such as `bijl,lk->bijk` as a batch matmul of one batch over
    the collapsed operands, then moves a unit dim of the result with a transpose: the matmul
    schedules match `linalg.matmul` only, so the product fell to the loop lowering, and the
    transpose copied the whole result."""
    changed = 0
    with module.context, ir.Location.unknown():
        # C[b, m, n] += A[b, m, k] * B[b, k, n]
        plain = [ir.AffineMapAttr.get(m) for m in _product_maps((2, 1), batched=True)]
        for op in ops_named(module, "linalg.batch_matmul"):
            op = op.operation
            types = [ir.RankedTensorType(v.type) for v in op.operands]
            if (
                list(ir.ArrayAttr(op.attributes["indexing_maps"])) != plain
                or len(types) != 3
                or not all(t.has_static_shape and t.shape[0] == 1 for t in types)
            ):
                continue
            batch = [[0, 1], [2]]
            with ir.InsertionPoint(op), op.location:
                a, b, c = (_without_batch(v, t) for t, v in zip(types, op.operands, strict=True))
                product = linalg.matmul(a, b, outs=[c], indexing_maps=matmul_maps((2, 1)))
                result = tensor.expand_shape(types[2], product, batch, [], types[2].shape)
            op.results[0].replace_all_uses_with(result)
            op.erase()
            changed += 1
        for op in ops_named(module, "linalg.transpose"):
            op = op.operation
            source = ir.RankedTensorType(op.operands[0].type)
            target = ir.RankedTensorType(op.results[0].type)
            permutation = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
            moved = [d for d in permutation if source.shape[d] != 1]
            if (
                not source.has_static_shape
                or moved != sorted(moved)
                or moved == permutation
                or not moved
            ):
                continue
            with ir.InsertionPoint(op), op.location:
                rank_reduced = ir.RankedTensorType.get(
                    [source.shape[d] for d in moved], source.element_type
                )
                collapsed = tensor.collapse_shape(
                    rank_reduced, op.operands[0], _unit_dims_reassociation(list(source.shape))
                )
                result = tensor.expand_shape(
                    target,
                    collapsed,
                    _unit_dims_reassociation(list(target.shape)),
                    [],
                    list(target.shape),
                )
            op.results[0].replace_all_uses_with(result)
            op.erase()
            changed += 1
    return changed


_CONTRACTIBLE = frozenset({"arith.addf", "arith.subf", "arith.mulf"})


def contract_float_arithmetic(module: ir.Module) -> int:
    """Allow LLVM to fuse each float multiply with the add or subtract that uses it into one
    fused multiply-add (the `contract` fast-math flag on every `arith.addf`, `arith.subf` and
    `arith.mulf`; the `kbd-contract-float-arithmetic` stage); returns how many ops changed.

    The schedules' partial products (a matmul over rows of W, a conv's taps) and the polynomial
    exp and erf are multiplies feeding adds; without the flag LLVM keeps them two instructions
    and two roundings (fused: one, never less accurate). Nothing else is relaxed: no
    reassociation, no assumptions about NaN or infinity."""
    changed = 0
    with module.context:
        for name in sorted(_CONTRACTIBLE):
            for op in ops_named(module, name):
                op = op.operation
                flags = str(op.attributes["fastmath"]) if "fastmath" in op.attributes else ""
                kept = flags.removeprefix("#arith.fastmath<").removesuffix(">").split(",")
                kept = [f.strip() for f in kept if f.strip() and f.strip() != "none"]
                if "contract" in kept or "fast" in kept:
                    continue
                op.attributes["fastmath"] = ir.Attribute.parse(
                    f"#arith.fastmath<{','.join([*kept, 'contract'])}>"
                )
                changed += 1
    return changed


def _broadcast_source(value: ir.Value) -> ir.Value | None:
    """The [K, N] matrix that `value` ([batch, K, N]) repeats in every batch, when `value` is a
    `linalg.generic` that only copies it along a new leading dim; else None."""
    made = producer(value)
    if made is None or made.name != "linalg.generic" or len(made.operands) != 2:
        return None
    source = made.operands[0]
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(made.attributes["indexing_maps"])]
    body = made.regions[0].blocks[0]
    terminator = list(body.operations)[-1]
    if (
        len(list(body.operations)) != 1
        or list(terminator.operands) != [body.arguments[0]]
        or str(maps[0]) != "(d0, d1, d2) -> (d1, d2)"
        or str(maps[1]) != "(d0, d1, d2) -> (d0, d1, d2)"
    ):
        return None
    return source


def shared_b_batch_matmuls_as_matmuls(module: ir.Module) -> int:
    """Make each `linalg.batch_matmul` (static) whose B is one matrix repeated in every batch a
    `linalg.matmul` of the batches' rows stacked, `[batch * M, K] x [K, N]`, between reshapes
    (the `kbd-shared-b-batch-matmuls-as-matmuls` stage); returns how many changed.

    torch-mlir imports `x @ W` for a 3-D x (an RNN's input projection over all its steps) as a
    copy of W per batch, then a batch matmul: the copies are written on every call, and no
    matmul schedule took the product, so it fell to the loop lowering. As one matmul, W is read
    once, and `kbd-fold-transpose-into-matmul` can then fold W's transpose (`nn.Linear`)."""
    changed = 0
    with module.context, ir.Location.unknown():
        # C[b, m, n] += A[b, m, k] * B[b, k, n]
        plain = [ir.AffineMapAttr.get(m) for m in _product_maps((2, 1), batched=True)]
        for op in ops_named(module, "linalg.batch_matmul"):
            op = op.operation
            types = [ir.RankedTensorType(v.type) for v in op.operands]
            source = _broadcast_source(op.operands[1])
            if (
                source is None
                or list(ir.ArrayAttr(op.attributes["indexing_maps"])) != plain
                or len(types) != 3
                or not all(t.has_static_shape for t in types)
            ):
                continue
            batch, rows, _ = types[2].shape
            stacked = [[0, 1], [2]]
            with ir.InsertionPoint(op), op.location:
                rows_a = [batch * rows, types[0].shape[2]]
                a = tensor.collapse_shape(
                    ir.RankedTensorType.get(rows_a, types[0].element_type), op.operands[0], stacked
                )
                c = _stacked_init(op.operands[2], types[2])
                product = linalg.matmul(a, source, outs=[c], indexing_maps=matmul_maps((2, 1)))
                result = tensor.expand_shape(types[2], product, stacked, [], types[2].shape)
            copies, init = producer(op.operands[1]), producer(op.operands[2])
            op.results[0].replace_all_uses_with(result)
            op.erase()
            for dead in (copies, init):  # W's copies and the batched fill, once unused
                if dead is not None and not list(dead.results[0].uses):
                    empty = producer(dead.operands[-1])
                    dead.erase()
                    if (
                        empty is not None
                        and empty.name == "tensor.empty"
                        and not list(empty.results[0].uses)
                    ):
                        empty.erase()
            changed += 1
    return changed


def _stacked_init(value: ir.Value, batched: ir.RankedTensorType) -> ir.Value:
    """`value` (of type `batched`) with its batch dim folded into its rows: a fill made afresh
    (`_refilled`), else a collapse_shape."""
    batch, rows, columns = batched.shape
    target = ir.RankedTensorType.get([batch * rows, columns], batched.element_type)
    refilled = _refilled(value, target)
    return refilled if refilled is not None else tensor.collapse_shape(target, value, [[0, 1], [2]])


def strided_copies_as_loops(module: ir.Module) -> int:
    """Turn every `memref.copy` between buffers that are not both one contiguous run into a
    `linalg.copy`, for the loop lowering; returns how many.

    MLIR lowers such a copy to a call of `memrefCopy`, a runtime function that copies element
    by element through generic index arithmetic (padded rows, slices of transposes); as loops,
    the innermost contiguous dim is a plain loop LLVM vectorizes."""
    changed = 0
    with module.context, ir.Location.unknown():
        for op in ops_named(module, "memref.copy"):
            op = op.operation
            source, target = op.operands
            if contiguous_buffer(source.type) and contiguous_buffer(target.type):
                continue
            with ir.InsertionPoint(op):
                linalg.copy(source, outs=[target])
            op.erase()
            changed += 1
    return changed
