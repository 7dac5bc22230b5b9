"""2-D convolutions computed channels last where their rows are narrow (the
`kbd-convs-channels-last` stage), for conv2d-nhwc.mlir.

conv2d.mlir vectorizes a convolution along its output rows: a row of 7 or 14 columns (a
ResNet's last stages) fills 7 or 14 of 16 lanes, and rows of 20 take a 16-wide step and a 4-wide
one. When the filters fill whole vectors, vectors along the filters waste nothing: such a
convolution (`conv_widths.channels_last` decides) becomes a `linalg.conv_2d_nhwc_hwcf` over its
input transposed to [N, H, W, C], with its kernel as [KH, KW, C, F] (a copy of the parameter,
small) and its result transposed back to [N, F, OH, OW] (a copy that the epilogue it feeds
fuses). Strides and dilations are kept: conv2d-nhwc.mlir broadcasts each output column's input
value, strided or not, so a strided convolution needs no phases.
"""

from __future__ import annotations

from torch_mlir import ir
from torch_mlir.dialects import linalg

from kbd.worker.mlir import conv_widths
from kbd.worker.mlir.walk import (
    channel_init,
    int_array,
    static_ops,
    transposed,
)

TO_CHANNELS_LAST = [0, 2, 3, 1]  # [N, C, H, W] -> [N, H, W, C]
TO_CHANNELS_FIRST = [0, 3, 1, 2]  # [N, H, W, C] -> [N, C, H, W]
KERNEL_TO_HWCF = [2, 3, 1, 0]  # [F, C, KH, KW] -> [KH, KW, C, F]


def convs_channels_last(module: ir.Module) -> int:
    """Rewrite every static `linalg.conv_2d_nchw_fchw` that `conv_widths.channels_last` picks
    into a channels-last one between transposes; returns how many were rewritten."""
    changed = 0
    with module.context, ir.Location.unknown():
        for op, types in static_ops(module, "linalg.conv_2d_nchw_fchw"):
            n, f, oh, ow = types[2].shape
            image, weight, init = op.operands
            copied = conv_widths.input_is_copy(image)  # a conv3d's: its layout chosen already
            if not conv_widths.channels_last(ow, f, n * oh * ow, input_copied=copied):
                continue
            element = types[2].element_type
            with ir.InsertionPoint(op), op.location:
                conv = linalg.conv_2d_nhwc_hwcf(
                    transposed(image, TO_CHANNELS_LAST),
                    transposed(weight, KERNEL_TO_HWCF),
                    outs=[
                        channel_init(init, element, [n, oh, ow, f], 3)
                        or transposed(init, TO_CHANNELS_LAST)
                    ],
                    strides=int_array(op, "strides"),
                    dilations=int_array(op, "dilations"),
                )
                result = transposed(conv, TO_CHANNELS_FIRST)
            op.results[0].replace_all_uses_with(result)
            op.erase()
            changed += 1
    return changed
