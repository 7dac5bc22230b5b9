"""bf16 and f16 kernels accumulate in f32, as eager does, applied at import.

PyTorch's CPU kernels for bf16 and f16 compute reductions, products, norms, softmax and scans
in f32 and round the result once; element-wise ops round after each op. torch-mlir lowers the
same ops with an accumulator of the input's type, so a sum over 1024 bf16 values keeps 8 bits
of mantissa for the whole run and ends far from eager. Each op in `ACCUMULATING` therefore gets
a decomposition that widens its bf16 or f16 tensor arguments to f32, applies the op (with kbd's
and torch-mlir's decompositions for f32), and rounds its floating results back to the type it
was given: the graph computes those ops as eager does, and a low-precision schedule can match
the `extf`, f32 op, `truncf` pattern. So do activations that torch-mlir decomposes into chains
(sigmoid, GELU, ...), which eager computes in f32 and rounds once. Single element-wise ops are
left in the low type: LLVM promotes each to f32 and rounds after it, as eager does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils import _pytree as pytree

aten = torch.ops.aten
LOW = (torch.bfloat16, torch.float16)

ACCUMULATING = (
    aten.sum.default,
    aten.sum.dim_IntList,
    aten.mean.default,
    aten.mean.dim,
    aten.var.correction,
    aten.std.correction,
    aten.prod.default,
    aten.prod.dim_int,
    aten.logsumexp.default,
    aten.linalg_vector_norm.default,
    aten.norm.ScalarOpt_dim,
    aten.norm.Scalar,
    aten.cumsum.default,
    aten.cumprod.default,
    aten.mm.default,
    aten.bmm.default,
    aten.addmm.default,
    aten.baddbmm.default,
    aten.mv.default,
    aten.convolution.default,
    aten._softmax.default,
    aten._log_softmax.default,
    aten.layer_norm.default,
    aten.native_layer_norm.default,
    aten.group_norm.default,
    aten.native_group_norm.default,
    aten.batch_norm.default,
    aten.instance_norm.default,
    aten._native_batch_norm_legit_no_training.default,
    aten.nll_loss_forward.default,
    # Activations eager computes in f32 and rounds once, which torch-mlir decomposes into
    # chains of ops that would each round (sigmoid: neg, exp, add, div).
    aten.sigmoid.default,
    aten.tanh.default,
    aten.gelu.default,
    aten.silu.default,
    aten.mish.default,
    aten.softplus.default,
    aten.elu.default,
    aten.selu.default,
    aten.log_sigmoid_forward.default,
    aten.hardsigmoid.default,
    aten.hardswish.default,
    aten.erf.default,
)


# Norms that may update running statistics in place: the widened copies would take the update.
_UPDATES_STATS = {aten.batch_norm.default: 5, aten.instance_norm.default: 5}  # training arg


def _updates_stats(op, args, kwargs) -> bool:
    position = _UPDATES_STATS.get(op)
    if position is None:
        return False
    training = args[position] if len(args) > position else kwargs.get("training", False)
    running = args[3] if len(args) > 3 else kwargs.get("running_mean")
    return bool(training) and running is not None


def _low_type(values) -> torch.dtype | None:
    """The low-precision type of the floating tensors among `values`, if any."""
    for value in pytree.tree_leaves(values):
        if isinstance(value, torch.Tensor) and value.dtype in LOW:
            return value.dtype
    return None


def in_f32(op, inner: Callable | None) -> Callable:
    """The decomposition of `op`: on low-precision tensors, widen, apply, round back; on
    others, `inner` (the decomposition it had), or none."""

    def decomposition(*args, **kwargs):
        low = _low_type((args, kwargs))
        if low is None:
            return NotImplemented if inner is None else inner(*args, **kwargs)
        if kwargs.get("dtype") is not None or _updates_stats(op, args, kwargs):
            return NotImplemented  # an explicit result type says how it accumulates
        widened = pytree.tree_map(
            lambda v: v.float() if isinstance(v, torch.Tensor) and v.dtype == low else v,
            (args, kwargs),
        )
        result = op(*widened[0], **widened[1])
        return pytree.tree_map(
            lambda v: v.to(low) if isinstance(v, torch.Tensor) and v.dtype == torch.float32 else v,
            result,
        )

    return decomposition


def wrap(table: dict) -> dict:
    """`table` with every op of ACCUMULATING computed in f32 on low-precision tensors."""
    return {**table, **{op: in_f32(op, table.get(op)) for op in ACCUMULATING}}
