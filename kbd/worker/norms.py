"""Decompositions of layer, group and instance norm into plain f32 reductions and one
element-wise pass, and of inference batch norm into that pass alone, applied at import (with
kbd.worker.decompositions; the norm family's schedule, `transforms/norm.mlir`, expects them).

torch's own decompositions compute the variance in f64: the whole input is widened into an f64
copy, summed, centred, squared and summed again, and the mean is summed a second time in f32:
six passes over the input and two tensors of twice its size. Here each norm is, for its rows
(the elements one mean and one variance describe):

1. the mean: a sum of the row in f32, in blocks of at most `decompositions.BLOCK` elements when
   the row is longer (each block summed on its own, then the block sums; blocks as
   `decompositions.block_length` finds them for kbd's blocked `sum`);
2. the variance: the sum of squared deviations from that mean (two passes are exact where
   one-pass sums of x and x^2 lose the variance to cancellation), in the same blocks;
3. the result: `(x - mean) * scale + bias` in the input's shape, where `scale = rstd * weight`
   for group and instance norm is a small tensor (one value per batch and channel) and layer
   norm's weight and bias apply after it: the last pass is one element-wise op with broadcast
   operands.

Ops, dtypes or options these do not cover return NotImplemented (torch's decomposition then
applies): other than f32/f64 inputs, empty inputs, norms that update running statistics.
"""

from __future__ import annotations

import math

import torch

from kbd.worker.decompositions import block_length

aten = torch.ops.aten
_FLOATS = (torch.float32, torch.float64)


def _moments(rows: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and 1/sqrt(variance + eps) of each row of a [R, n] tensor, as [R] tensors."""
    count, n = rows.shape
    block = block_length(n)
    # [R, n/block, block]: each run of at most BLOCK elements has its own sum.
    blocks = rows.reshape(count, n // block, block) if block else rows.reshape(count, 1, n)
    mean = blocks.sum(-1).sum(-1) / n
    deviation = blocks - mean.reshape(count, 1, 1)
    variance = (deviation * deviation).sum(-1).sum(-1) / n
    return mean, torch.rsqrt(variance + eps)


def _covered(x: torch.Tensor) -> bool:
    return x.dtype in _FLOATS and x.numel() > 0


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    inner = math.prod(normalized_shape)
    if not _covered(x) or len(normalized_shape) > x.dim():
        return NotImplemented
    count = x.numel() // inner
    mean, rstd = _moments(x.reshape(count, inner), eps)
    kept = [*x.shape[: x.dim() - len(normalized_shape)], *[1] * len(normalized_shape)]
    y = (x - mean.reshape(kept)) * rstd.reshape(kept)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def _channel_affine(x, mean, rstd, groups: int, weight, bias):
    """(x - mean) * scale + bias with one mean and scale per (batch, channel): the statistics
    of `groups` groups of channels, the scale times the channel's weight."""
    batch, channels = x.shape[0], x.shape[1]
    per_group = channels // groups
    kept = [batch, channels, *[1] * (x.dim() - 2)]
    mean = mean.reshape(batch, groups, 1).expand(batch, groups, per_group).reshape(kept)
    scale = rstd.reshape(batch, groups, 1).expand(batch, groups, per_group)
    if weight is not None:
        scale = scale * weight.reshape(1, groups, per_group)
    y = (x - mean) * scale.reshape(kept)
    if bias is not None:
        y = y + bias.reshape(kept[1:])
    return y


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    if x.dim() < 2 or not _covered(x) or x.shape[1] % num_groups:
        return NotImplemented
    count = x.shape[0] * num_groups
    mean, rstd = _moments(x.reshape(count, x.numel() // count), eps)
    return _channel_affine(x, mean, rstd, num_groups, weight, bias)


def instance_norm(
    x,
    weight,
    bias,
    running_mean,
    running_var,
    use_input_stats,
    momentum,
    eps,
    cudnn_enabled,
):
    if not use_input_stats or running_mean is not None or running_var is not None:
        return NotImplemented  # running statistics: updated in place, left to torch
    if x.dim() < 3 or not _covered(x):
        return NotImplemented
    count = x.shape[0] * x.shape[1]
    mean, rstd = _moments(x.reshape(count, x.numel() // count), eps)
    return _channel_affine(x, mean, rstd, x.shape[1], weight, bias)


def batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled):
    """Inference batch norm (running statistics): one element-wise pass with a scale and
    shift per channel. (torch-mlir's lowering adds a runtime check of the variance to every
    element, which keeps the pass from being vectorized.) Training updates the running
    statistics in place: left to torch."""
    if training or running_mean is None or running_var is None:
        return NotImplemented
    if x.dim() < 2 or not _covered(x):
        return NotImplemented
    kept = [x.shape[1], *[1] * (x.dim() - 2)]
    scale = torch.rsqrt(running_var + eps)
    if weight is not None:
        scale = scale * weight
    y = (x - running_mean.reshape(kept)) * scale.reshape(kept)
    if bias is not None:
        y = y + bias.reshape(kept)
    return y


def batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    """aten._native_batch_norm_legit_no_training, what torch.export makes of an inference
    batch norm: `batch_norm`'s one pass, and the empty saved statistics torch's own CPU
    decomposition returns. (That decomposition divides by a square root per channel, which
    torch-mlir lowers with an assert in the body of every element's op.)"""
    y = batch_norm(x, weight, bias, running_mean, running_var, False, momentum, eps, False)
    if y is NotImplemented:
        return NotImplemented
    return y, x.new_zeros((0,)), x.new_zeros((0,))


TABLE = {
    aten.batch_norm.default: batch_norm,
    aten._native_batch_norm_legit_no_training.default: batch_norm_no_training,
    aten.layer_norm.default: layer_norm,
    aten.group_norm.default: group_norm,
    aten.instance_norm.default: instance_norm,
}
