"""Strided transposed convolutions as stride-1 ones over the output's phases, and grouped 3-D
convolutions as one convolution per group, applied at import (with kbd.worker.decompositions).

torch-mlir lowers a transposed convolution of stride s into a stride-1 convolution over the
input "zero-stuffed" (s - 1 zeros between neighbours, per spatial dim): s^d times the work, of
which all but one part in s^d multiplies zeros (8x in 3-D at stride 2). Here, per spatial dim,
a transposed convolution writes full-output position t = i * s + k * d (input i, kernel index
k, dilation d). Positions of one phase r = t mod s receive only the taps with k * d = r
(mod s): with g = gcd(d, s), the taps k0, k0 + s/g, k0 + 2 s/g, ... (k0 the first such k), at
offsets j = (k * d - r) / s = j0, j0 + d/g, ... So phase r is T_r[q] = sum_m x[q - j0 - m d/g]
w[k0 + m s/g]: a transposed convolution of stride 1, dilation d/g and kernel w[k0 :: s/g],
shifted by j0. Output position o is full position o + padding; the phases partition the
output, each one written as a strided slice (o = q * s + r - padding); a phase with no tap
(a kernel smaller than the stride, or a dilation sharing a factor with it) holds the bias alone,
so such an output starts filled with the bias and only the phases with taps are written. Each
phase is computed as an ordinary forward convolution of stride 1 (the taps reversed) over the
input zero-padded, or cut, just enough to make the phase's positions and no others, which the
conv2d and conv3d schedules take; the price is one copy of the output (each phase's result
into its slice).

torch-mlir lowers a grouped 3-D convolution to a `linalg.generic`, which no convolution
schedule matches; split into its groups (each a `linalg.conv_3d_ncdhw_fcdhw`) and concatenated
along channels, it takes the conv3d schedule. Depthwise convolutions (one input channel per
group) are left alone: a group each would be thousands of tiny convolutions.

Cases these do not cover return NotImplemented (torch-mlir's lowering then applies).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

aten = torch.ops.aten


@dataclass(frozen=True)
class Phase:
    """One phase of one spatial dim of a strided transposed convolution."""

    taps: slice  # the kernel indices it uses: k0, k0 + s/g, ...
    dilation: int  # between its taps, in input positions
    start: int  # its first output position (o = start + n * stride)
    count: int  # its output positions
    first: int  # the sub-convolution's output index of output position `start`


def phases(size: int, kernel: int, stride: int, padding: int, dilation: int, out: int):
    """The phases of one spatial dim: input size, kernel size, stride, padding and dilation of
    the transposed convolution and its output size; a phase with no tap is None."""
    common = math.gcd(dilation, stride)
    found = []
    for r in range(stride):
        first_tap = next((k for k in range(kernel) if (k * dilation - r) % stride == 0), None)
        q_start = -((r - padding) // stride)  # ceil((padding - r) / stride), never negative
        start = q_start * stride + r - padding
        count = len(range(start, out, stride))
        if first_tap is None or count == 0:
            found.append(None if count == 0 else Phase(slice(0, 0), 1, start, count, 0))
            continue
        offset = (first_tap * dilation - r) // stride  # j0: T_r[q] = sub[q - j0]
        found.append(
            Phase(
                taps=slice(first_tap, kernel, stride // common),
                dilation=dilation // common,
                start=start,
                count=count,
                first=q_start - offset,
            )
        )
    return found


def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """aten.convolution: strided transposed ones by phases, grouped 3-D ones by groups."""
    spatial = weight.dim() - 2
    if x.dim() != spatial + 2 or not x.dtype.is_floating_point or x.numel() == 0:
        return NotImplemented
    if transposed and any(s > 1 for s in stride):
        return _transposed_by_phases(
            x, weight, bias, stride, padding, dilation, output_padding, groups
        )
    if spatial == 3 and groups > 1 and x.shape[1] != groups:
        return _by_groups(
            x, weight, bias, stride, padding, dilation, transposed, output_padding, groups
        )
    return NotImplemented


class ConvArguments(NamedTuple):
    """aten.convolution's arguments between the bias and the groups, in its order."""

    stride: list[int]
    padding: list[int]
    dilation: list[int]
    transposed: bool
    output_padding: list[int]


def _by_groups(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """One convolution per group, concatenated along channels (`_channels`)."""
    arguments = ConvArguments(stride, padding, dilation, transposed, output_padding)
    return _channels(_group_parts(x, weight, bias, arguments, groups))


def _group_parts(x, weight, bias, arguments: ConvArguments, groups, pads=None):
    """Each group's convolution, its slice of the input zero-padded by `pads` (F.pad's order)
    first if given."""
    inputs = x.shape[1] // groups
    # The weight is [out, in / groups, ...], or [in, out / groups, ...] when transposed.
    per_weight = weight.shape[0] // groups
    outputs = weight.shape[1] if arguments.transposed else per_weight
    parts = []
    for g in range(groups):
        part = x[:, g * inputs : (g + 1) * inputs]
        if pads is not None and any(pads):
            part = torch.nn.functional.pad(part, pads)
        parts.append(
            aten.convolution(
                part,
                weight[g * per_weight : (g + 1) * per_weight],
                None if bias is None else bias[g * outputs : (g + 1) * outputs],
                *arguments,
                1,
            )
        )
    return parts


def _transposed_by_phases(x, weight, bias, stride, padding, dilation, output_padding, groups):
    spatial = weight.dim() - 2
    sizes = x.shape[2:]
    kernels = weight.shape[2:]
    outs = [
        (n - 1) * s - 2 * p + d * (k - 1) + op + 1
        for n, s, p, d, k, op in zip(
            sizes, stride, padding, dilation, kernels, output_padding, strict=True
        )
    ]
    if any(o <= 0 for o in outs):
        return NotImplemented
    per_dim = [
        phases(n, k, s, p, d, o)
        for n, k, s, p, d, o in zip(sizes, kernels, stride, padding, dilation, outs, strict=True)
    ]
    channels = weight.shape[1] * groups
    combinations = [
        combination
        for combination in itertools.product(*per_dim)
        if not any(phase is None for phase in combination)  # None: no output position
    ]
    tapped = [c for c in combinations if not any(_no_tap(phase) for phase in c)]
    shape = [x.shape[0], channels, *outs]
    if len(tapped) == len(combinations):
        result = x.new_empty(shape)
    else:
        # Phases without a tap hold the bias alone: fill the whole output with it at once
        # (contiguous) and write only the others, instead of each as a strided scatter.
        result = x.new_zeros(shape)
        if bias is not None:
            result = result + bias.reshape(channels, *[1] * spatial)
    # Every phase is computed before any is written, the last dim's phases written one after
    # another: their copies then stand next to each other for kbd-vector-copies, which
    # writes them as one interleaved loop.
    parts = [_phase(x, weight, bias, combination, groups) for combination in tapped]
    for combination, part in zip(tapped, parts, strict=True):
        result = _scatter(result, part, combination, stride, spatial)
    return result


def _channels(parts):
    """`parts` concatenated along channels, each written into its slice of one new tensor
    (not `torch.cat`): each part's producer (the conv3d rewrite's transpose of its result)
    then writes straight into its slice, where a concatenation would copy every part."""
    first = parts[0]
    result = first.new_empty([first.shape[0], sum(p.shape[1] for p in parts), *first.shape[2:]])
    start = 0
    for part in parts:
        result = aten.slice_scatter(result, part, 1, start, start + part.shape[1])
        start += part.shape[1]
    return result


def _no_tap(phase: Phase) -> bool:
    """Whether no kernel tap writes this phase of its dim (it holds the bias alone)."""
    return phase.taps.stop == phase.taps.start


def _phase(x, weight, bias, combination, groups):
    """One phase's output [N, channels, count...], for a phase with taps in every dim: a
    forward convolution with the phase's taps reversed, over the input zero-padded (or cut) so
    that it makes exactly the phase's `count` positions per dim. (Written as a stride-1
    transposed convolution, it would make every position its taps reach, n + d (k' - 1) per
    dim, of which the phase's would be cut out: more work, at widths the schedules pad
    further.) A 3-D one is made a group at a time, padding each group's input itself: the
    conv3d rewrite folds such a padding into its input copy, not one of a slice."""
    spatial = len(combination)
    taps = weight[(slice(None), slice(None), *(phase.taps for phase in combination))]
    inputs, outputs = taps.shape[0] // groups, taps.shape[1]
    # [in, out / groups, k'...] (transposed) as [out, in / groups, k'...], taps reversed
    forward = taps.reshape(groups, inputs, outputs, *taps.shape[2:]).transpose(1, 2)
    forward = forward.reshape(groups * outputs, inputs, *taps.shape[2:])
    forward = forward.flip(list(range(2, 2 + spatial)))
    cut = x
    pads = []
    for dim, (phase, size, kernel) in enumerate(
        zip(combination, x.shape[2:], taps.shape[2:], strict=True), start=2
    ):
        # output q reads inputs q + first - d (k' - 1) .. q + first
        low = phase.dilation * (kernel - 1) - phase.first
        high = phase.first + phase.count - size
        if low < 0 or high < 0:
            cut = cut.narrow(dim, max(0, -low), size - max(0, -low) - max(0, -high))
        pads = [max(0, low), max(0, high), *pads]
    dilation = [phase.dilation for phase in combination]
    ones, zeros = [1] * spatial, [0] * spatial
    if spatial != 3 or groups == 1:
        padded = torch.nn.functional.pad(cut, pads) if any(pads) else cut
        return aten.convolution(padded, forward, bias, ones, zeros, dilation, False, zeros, groups)
    # Concatenated, not written into slices of one tensor (`_channels`): bufferization would
    # then compute each group's part straight into its strided slice of the output, a lane
    # at a time, instead of copying whole phases there, interleaved (kbd-vector-copies).
    arguments = ConvArguments(ones, zeros, dilation, False, zeros)
    return torch.cat(_group_parts(cut, forward, bias, arguments, groups, pads), 1)


def _scatter(result, part, combination, stride, spatial):
    """`result` with `part` written at its phase's positions (a strided slice per dim)."""

    def write(target, value, dim):
        phase = combination[dim - 2]
        end = phase.start + (phase.count - 1) * stride[dim - 2] + 1
        if dim == spatial + 1:
            inner = value
        else:
            view = aten.slice(target, dim, phase.start, end, stride[dim - 2])
            inner = write(view, value, dim + 1)
        return aten.slice_scatter(target, inner, dim, phase.start, end, stride[dim - 2])

    return write(result, part, 2)


TABLE = {aten.convolution.default: convolution}
