"""Decompositions applied at import, for ops torch-mlir lowers to ops nothing here can compile.

torch-mlir turns `aten.cumsum` / `aten.cumprod` into `tm_tensor.scan` (which
kbd.worker.mlir.scans turns into loops after import), accumulating in the input's type: integer
and bool inputs are first converted to int64 (or the `dtype` asked for), as eager does.

Floating-point `sum` and `mean` over many elements are summed in blocks: the linalg lowering
adds the elements into one f32 accumulator in sequence, whose error grows with the count (at
2^26 elements of U(0,1)^2 it is 18%, against 2e-8 for eager's cascade sum: the running sum
outgrows the addends' precision). Reduced one dimension at a time, innermost first, and a
dimension longer than `BLOCK` split into at most `BLOCK` blocks of at most `BLOCK` (each block
summed, then the block sums), no sequential run is longer than `BLOCK` (2e-6 at 2^26). A sum
of every element is not flattened first: a reshape between the sum and the element-wise ops it
reads (a loss's squared differences) would keep them from fusing into it. The 2-norm
(`torch.norm`, `linalg.vector_norm`) is the square root of such a sum of squares.
"""

from __future__ import annotations

import math

import torch

aten = torch.ops.aten


def cumsum(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    return _scan_in(aten.cumsum.default, x, dim, dtype)


def cumprod(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    return _scan_in(aten.cumprod.default, x, dim, dtype)


def _scan_in(op, x: torch.Tensor, dim: int, dtype: torch.dtype | None):
    """The scan of x in the type eager computes it in (`dtype`, else int64 for integers and
    bools), or NotImplemented when x already has it (torch-mlir then makes the scan)."""
    target = dtype or (x.dtype if x.is_floating_point() else torch.int64)
    if x.dim() == 0:
        return x.to(target).clone()
    if target == x.dtype and dtype is None:
        return NotImplemented
    return op(x.to(target), dim)


BLOCK = 1 << 16  # the longest run of elements summed into one f32 accumulator
_FLOATS = (torch.float32, torch.float64)


def block_length(n: int) -> int | None:
    """How n > BLOCK elements are summed with no sequential run longer than BLOCK: the longest
    block b <= BLOCK that divides them into n / b <= BLOCK blocks (each block is summed, then
    the block sums). None when n <= BLOCK, or when no such block exists (n has a prime factor
    above BLOCK, or n > BLOCK**2): then they are summed in one run."""
    if n <= BLOCK or n > BLOCK * BLOCK:
        return None
    return max((b for b in _divisors(n) if b <= BLOCK and n // b <= BLOCK), default=None)


def _divisors(n: int) -> set[int]:
    """Every divisor of n, from its prime factors (trial division up to the square root of
    what is left: a few steps for the sizes of real tensors)."""
    divisors = {1}
    rest, factor = n, 2
    while factor * factor <= rest:
        while rest % factor == 0:
            rest //= factor
            divisors |= {d * factor for d in divisors}
        factor += 1
    if rest > 1:  # a prime factor above the square root
        divisors |= {d * rest for d in divisors}
    return divisors


def _sum_dim(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over `dim` (kept, size 1), in blocks when it is longer than BLOCK."""
    n = x.shape[dim]
    block = block_length(n)
    if block is None:
        return torch.sum(x, [dim], keepdim=True)  # kept as it is (see `_blocked_sum`)
    shape = list(x.shape)
    blocks = x.reshape([*shape[:dim], n // block, block, *shape[dim + 1 :]])
    return torch.sum(torch.sum(blocks, [dim + 1]), [dim], keepdim=True)


def _blocked_sum(x, dim, keepdim, dtype):
    """x summed over `dim` (None or [] for all), or NotImplemented when one sequential
    reduction is accurate enough (aten.sum then stays as it is)."""
    if x.dim() == 0 or (dtype is not None and dtype != x.dtype):
        return NotImplemented  # nothing to split; or a conversion first (rare)
    dims = sorted({d % x.dim() for d in dim} if dim else range(x.dim()))
    count = math.prod(x.shape[d] for d in dims)
    if x.dtype not in _FLOATS or count <= BLOCK:
        return NotImplemented
    if len(dims) == 1 and block_length(count) is None:
        return NotImplemented  # no blocks that fit: one sequential reduction after all
    summed = x
    for d in reversed(dims):  # innermost first: the reshapes keep outer dims in place
        summed = _sum_dim(summed, d)
    return summed if keepdim else summed.squeeze(dims)


def sum_(x, dim=None, keepdim=False, *, dtype=None):
    return _blocked_sum(x, dim, keepdim, dtype)


def sum_all(x, *, dtype=None):
    return _blocked_sum(x, None, False, dtype)


def mean(x, dim=None, keepdim=False, *, dtype=None):
    summed = _blocked_sum(x, dim, keepdim, dtype)
    if summed is NotImplemented:
        return summed
    return summed / (x.numel() // max(summed.numel(), 1))


def mean_all(x, *, dtype=None):
    return mean(x, None, False, dtype=dtype)


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """The 2-norm as the square root of a sum of squares (the sum blocked as above); other
    norms as they are."""
    if ord != 2 or dtype is not None or x.dtype not in _FLOATS:
        return NotImplemented
    return torch.sqrt(torch.sum(x * x, dim, keepdim))


def cross_entropy(x, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
    """Cross entropy of [N, C] logits against N class indices as row reductions: log-sum-exp of
    each row (its max, then the sum of exp(x - max)) minus the target's logit, then their mean
    over the targets not ignored. torch's own computes and stores the whole log-softmax first.
    Class weights, other shapes and types as torch decomposes them (not NotImplemented:
    torch-mlir has no lowering of the op itself, and torch's own decomposition, `decompose()`,
    would call this one again)."""
    if (
        weight is not None
        or label_smoothing != 0.0
        or x.dim() != 2
        or target.dim() != 1
        or target.is_floating_point()
        or x.dtype not in _FLOATS
    ):
        if label_smoothing != 0.0:
            composite = torch._C.DispatchKey.CompositeImplicitAutograd
            args = (x, target, weight, reduction, ignore_index, label_smoothing)
            return aten.cross_entropy_loss.default._op_dk(composite, *args)
        log_probabilities = torch.log_softmax(x, 0 if x.dim() == 1 else 1)
        return aten.nll_loss_nd(log_probabilities, target, weight, reduction, ignore_index)
    top = torch.amax(x, 1, keepdim=True)
    log_sum_exp = torch.log(torch.sum(torch.exp(x - top), 1)) + top.squeeze(1)
    valid = target != ignore_index
    picked = torch.gather(x, 1, torch.where(valid, target, 0).unsqueeze(1)).squeeze(1)
    losses = torch.where(valid, log_sum_exp - picked, 0.0)
    if reduction == 0:  # none
        return losses
    if reduction == 2:  # sum
        return torch.sum(losses)
    return torch.sum(losses) / torch.sum(valid)


def scaled_dot_product_attention(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    *,
    scale=None,
    enable_gqa=False,
):
    """Attention as two batched products around a softmax, the scale applied to the scores:
    softmax(Q K^T * scale) V, with K^T a transpose of the last two dims of K on the product's
    operand, which kbd-fold-transpose-into-batch-matmul folds into the product's maps (K is
    then read as stored). torch-mlir's own decomposition scales Q and a transposed copy of K
    instead, and the copy costs more than the product. Masks, dropout, causal attention and
    grouped heads are left to it (NotImplemented)."""
    if attn_mask is not None or dropout_p != 0.0 or is_causal or enable_gqa:
        return NotImplemented
    if query.dim() < 3 or query.shape[:-2] != key.shape[:-2] or key.shape[:-2] != value.shape[:-2]:
        return NotImplemented
    batch = query.shape[:-2]
    length, source, depth = query.shape[-2], key.shape[-2], query.shape[-1]
    q = query.reshape(-1, length, depth)
    k = key.reshape(-1, source, depth)
    v = value.reshape(-1, source, value.shape[-1])
    factor = scale if scale is not None else 1.0 / math.sqrt(depth)
    scores = torch.bmm(q, k.transpose(1, 2)) * factor
    weights = torch.softmax(scores, dim=-1)
    return torch.bmm(weights, v).reshape(*batch, length, value.shape[-1])


TABLE = {
    aten.scaled_dot_product_attention.default: scaled_dot_product_attention,
    aten.cumsum.default: cumsum,
    aten.cumprod.default: cumprod,
    aten.sum.default: sum_all,
    aten.sum.dim_IntList: sum_,
    aten.mean.default: mean_all,
    aten.mean.dim: mean,
    aten.linalg_vector_norm.default: vector_norm,
    aten.cross_entropy_loss.default: cross_entropy,
}
