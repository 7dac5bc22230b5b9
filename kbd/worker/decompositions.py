"""Decompositions applied at import, for ops torch-mlir lowers to ops nothing here can compile.

torch-mlir turns `aten.cumsum` / `aten.cumprod` into `tm_tensor.scan`, which the upstream
bufferization cannot handle ("op was not bufferized"). Expressed as a log-step (Hillis-Steele)
scan of shifted adds, they become plain linalg: log2(n) elementwise steps instead of one
sequential loop. The summation order differs from eager's, well within the check's tolerance.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def _scan(x: torch.Tensor, dim: int, combine, identity: float) -> torch.Tensor:
    if x.dim() == 0:
        return x.clone()
    dim = dim % x.dim()
    n = x.shape[dim]
    step = 1
    while step < n:
        pad_shape = list(x.shape)
        pad_shape[dim] = step
        pad = torch.full(pad_shape, identity, dtype=x.dtype, device=x.device)
        shifted = torch.cat([pad, x.narrow(dim, 0, n - step)], dim)
        x = combine(x, shifted)
        step *= 2
    return x


def cumsum(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    if dtype is not None:
        x = x.to(dtype)
    elif not x.is_floating_point():
        x = x.to(torch.int64)  # like eager: integer and bool sums accumulate in int64
    return _scan(x, dim, torch.add, 0)


def cumprod(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    if dtype is not None:
        x = x.to(dtype)
    elif not x.is_floating_point():
        x = x.to(torch.int64)
    return _scan(x, dim, torch.mul, 1)


TABLE = {aten.cumsum.default: cumsum, aten.cumprod.default: cumprod}
