"""3-D convolutions as 2-D ones (the `kbd-conv3d-as-conv2d` stage).

A 3-D convolution is a sum over its kernel's depth taps of 2-D convolutions: tap kd multiplies
the input's depths kd * dilation, kd * dilation + stride, ... (one per output depth) by the
kernel's slice kd. With the output depths folded into the batch, each tap is one
`linalg.conv_2d_nchw_fchw` over [N * OD, C, H, W], accumulating onto the previous tap's result,
so the conv2d schedule (strided, dilated and grouped forms included) computes 3-D convolutions
too. The price is a copy of the input per depth tap (its depths moved next to the batch) and
one of the output.
"""

from __future__ import annotations

from torch_mlir import ir
from torch_mlir.dialects import linalg, tensor

from kbd.worker.mlir.walk import extract, int_array, ops_named, static_operand_types

DEPTH_TO_BATCH = [0, 2, 1, 3, 4]  # [N, C, D, H, W] <-> [N, D, C, H, W]


def conv3d_as_conv2d(module: ir.Module) -> int:
    """Rewrite every `linalg.conv_3d_ncdhw_fcdhw` of static shapes into one 2-D convolution per
    depth tap; returns how many were rewritten."""
    changed = 0
    with module.context, ir.Location.unknown():
        for op in ops_named(module, "linalg.conv_3d_ncdhw_fcdhw"):
            op = op.operation
            types = static_operand_types(op)
            if types is None:
                continue
            strides, dilations = int_array(op, "strides"), int_array(op, "dilations")
            image, weight, init = op.operands
            n, c, _, h, w = types[0].shape
            f, _, kd, kh, kw = types[1].shape
            _, _, od, oh, ow = types[2].shape
            element = types[2].element_type
            with ir.InsertionPoint(op), op.location:
                result = _depths_in_batch(init, element, [n, f, od, oh, ow])
                for tap in range(kd):
                    depths = extract(
                        image,
                        element,
                        [0, 0, tap * dilations[0], 0, 0],
                        [n, c, od, h, w],
                        strides=[1, 1, strides[0], 1, 1],
                    )
                    kernel = extract(
                        weight, element, [0, 0, tap, 0, 0], [f, c, 1, kh, kw], shape=[f, c, kh, kw]
                    )
                    result = linalg.conv_2d_nchw_fchw(
                        _depths_in_batch(depths, element, [n, c, od, h, w]),
                        kernel,
                        outs=[result],
                        strides=strides[1:],
                        dilations=dilations[1:],
                    )
                moved = ir.RankedTensorType.get([n, od, f, oh, ow], element)
                expanded = tensor.expand_shape(
                    moved, result, [[0, 1], [2], [3], [4]], [], [n, od, f, oh, ow]
                )
                back = linalg.transpose(
                    expanded,
                    outs=[tensor.empty([n, f, od, oh, ow], element)],
                    permutation=DEPTH_TO_BATCH,
                )
            op.results[0].replace_all_uses_with(back.results[0])
            op.erase()
            changed += 1
    return changed


def _depths_in_batch(value: ir.Value, element, shape: list[int]) -> ir.Value:
    """[N, C, D, H, W] -> [N * D, C, H, W] (a copy: the depths moved next to the batch)."""
    n, c, d, h, w = shape
    moved = linalg.transpose(
        value, outs=[tensor.empty([n, d, c, h, w], element)], permutation=DEPTH_TO_BATCH
    )
    return tensor.collapse_shape(
        ir.RankedTensorType.get([n * d, c, h, w], element), moved, [[0, 1], [2], [3], [4]]
    )
