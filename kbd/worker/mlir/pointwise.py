"""Pointwise convolutions as products (the `kbd-pointwise-convs-as-matmuls` stage): over one
image as matmuls, long 1-D ones as batch matmuls.

A convolution with a 1 x 1 kernel and stride 1 over one image (a MobileNet's pointwise layers
at batch 1) is a product: out = W x in, with W the kernel as [F, C] and in the image as
[C, H * W], both stored so by NCHW already. Where its rows are narrow (7 or 14 columns in a
network's last stages), the convolution schedules compute it channels last
(kbd-convs-channels-last, by `conv_widths.channels_last`), between transposes of the input, the
kernel and the result, each a copy on every call. Such a convolution becomes a `linalg.matmul`
over collapsed views instead, which the matmul schedule computes with rows of H * W columns,
and nothing is copied. Over several images it stays a convolution: channels last computes all
of their N * H * W positions as one, where one small matmul per image lost (EfficientNetB1 at
batch 10 took 1.5x as long). Wide rows stay convolutions too: conv2d.mlir computes them in
place as fast.

A size-1 convolution of stride 1 over rows of many positions (a strided dilated conv1d whose
taps kbd-strided-conv1ds-as-phases gathered as channels) is a product per image: it becomes a
`linalg.batch_matmul` of the kernel, broadcast over the images, and the images as NCW stores
them.

Runs before the product schedules (product-stages.yaml), which then tile these products as any
other. The accumulator must be a constant or a bias (`walk.channel_init`: made afresh as
[F, H * W], which the matmul schedule fuses into its blocks); a convolution accumulating onto
anything else is left to the convolution schedules.
"""

from __future__ import annotations

from torch_mlir import ir
from torch_mlir.dialects import linalg, tensor

from kbd.worker.mlir import conv_widths
from kbd.worker.mlir.rewrites import batch_matmul_maps, matmul_maps
from kbd.worker.mlir.walk import channel_init, collapsed, expanded, int_array, static_ops

ROWS = [[0, 1], [2, 3]]  # [1, C, H, W] <-> [C, H * W]
# Shorter 1-D rows stay convolutions: a product per image of a few columns gains nothing.
MIN_PRODUCT_ROW = 256


def pointwise_convs_as_matmuls(module: ir.Module) -> int:
    """Rewrite every static 1 x 1, stride-1 `linalg.conv_2d_nchw_fchw` over one image whose
    rows are narrow and whose accumulator is a constant or a bias into a `linalg.matmul`, and
    every long enough size-1 `linalg.conv_1d_ncw_fcw` into a `linalg.batch_matmul`; returns how
    many were rewritten."""
    changed = _pointwise_conv1ds(module)
    with module.context, ir.Location.unknown():
        for op, types in static_ops(module, "linalg.conv_2d_nchw_fchw"):
            n, c, h, w = types[0].shape
            f, _, kh, kw = types[1].shape
            if (n, kh, kw) != (1, 1, 1) or int_array(op, "strides") != [1, 1]:
                continue
            if not conv_widths.channels_last(w, f, h * w, input_copied=False):
                continue  # wide rows: conv2d.mlir computes them in place, as fast
            element = types[2].element_type
            image, weight, init = op.operands
            with ir.InsertionPoint(op), op.location:
                accumulator = channel_init(init, element, [f, h * w], 0)
                if accumulator is None:  # nothing was made
                    continue
                product = linalg.matmul(
                    collapsed(weight, [f, c], [[0], [1, 2, 3]]),
                    collapsed(image, [c, h * w], ROWS),
                    outs=[accumulator],
                    indexing_maps=matmul_maps((2, 1)),
                )
                result = expanded(product, [1, f, h, w], ROWS)
            op.results[0].replace_all_uses_with(result)
            op.erase()
            changed += 1
    return changed


def _pointwise_conv1ds(module: ir.Module) -> int:
    """Each static size-1 `linalg.conv_1d_ncw_fcw` of stride 1 over rows of at least
    `MIN_PRODUCT_ROW` positions as a `linalg.batch_matmul`: image n's output [F, L] is the
    kernel [F, C] times its input [C, L], as NCW stores them, onto the convolution's own
    accumulator (its layout already). The kernel is broadcast over the images (a copy of
    N * F * C elements). The conv1d schedule streams all C input rows of a tile of columns per
    step of 8 filters, where the product schedule packs them once (a strided dilated conv1d
    whose taps are gathered, level1/76, is one)."""
    changed = 0
    with module.context, ir.Location.unknown():
        for op, types in static_ops(module, "linalg.conv_1d_ncw_fcw"):
            n, c, length = types[0].shape
            f, _, kernel = types[1].shape
            if kernel != 1 or int_array(op, "strides") != [1] or length < MIN_PRODUCT_ROW:
                continue
            element = types[2].element_type
            image, weight, init = op.operands
            with ir.InsertionPoint(op), op.location:
                flat = collapsed(weight, [f, c], [[0], [1, 2]])
                shared = linalg.broadcast(
                    flat, outs=[tensor.empty([n, f, c], element)], dimensions=[0]
                )
                product = linalg.batch_matmul(
                    shared, image, outs=[init], indexing_maps=batch_matmul_maps((2, 1))
                )
            op.results[0].replace_all_uses_with(product)
            op.erase()
            changed += 1
    return changed
