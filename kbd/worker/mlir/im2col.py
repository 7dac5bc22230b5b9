"""Convolutions with narrow output rows as products over their gathered taps (the
`kbd-narrow-convs-as-matmuls` stage): im2col, then a matmul the product schedule computes.

conv2d.mlir vectorizes a convolution along its output rows. A network's last stages have rows
of 7 or 4 columns (a ResNet at 112 pixels), which fill 7 or 4 of a vector's 16 lanes: the
convolution runs at a quarter of the machine or less. Channels last (vectors along the filters,
kbd-convs-channels-last) copies the kernel into the [KH, KW, C, F] layout on every call; with
few output positions per weight that copy costs more than the lanes win, and
`conv_widths.channels_last` refuses it, leaving the narrow rows.

Such a convolution is a product instead: out[f, (n, y, x)] = sum over (c, i, j) of
w[f, (c, i, j)] * col[(c, i, j), (n, y, x)], where w is the kernel as NCHW stores it (a view,
nothing copied) and col holds, for each tap, the input values it reads:
col[c, i, j, n, y, x] = in[n, c, y * sh + i * dh, x * sw + j * dw] (one element-wise
`linalg.generic`, a copy KH x KW times the size of the output's positions per channel, small
where rows are narrow). The matmul's columns are all N x OH x OW output positions, so its
vectors are full; the result [F, N, OH, OW] is transposed to NCHW (a reshape over one image).
Strides and dilations are only the gather's indexing: no phases.

Runs with the products (in product-stages.yaml, after kbd-pointwise-convs-as-matmuls), so the
matmul schedule tiles the new products. A convolution is rewritten when `conv_widths.as_product`
says its rows are narrow, its positions fill vectors, and channels last is refused or would
copy more (its kernel copy, C x KH x KW x F elements, against the gather's C x KH x KW x
N x OH x OW), and its accumulator is a constant or a bias (`walk.channel_init`).
"""

from __future__ import annotations

from torch_mlir import ir
from torch_mlir.dialects import linalg, tensor

from kbd.worker.mlir import conv_widths
from kbd.worker.mlir.rewrites import matmul_maps
from kbd.worker.mlir.walk import (
    channel_init,
    collapsed,
    expanded,
    int_array,
    static_ops,
    transposed,
)

TAPS_FIRST = [[0, 1, 2], [3, 4, 5]]  # [C, KH, KW, N, OH, OW] <-> [C * KH * KW, N * OH * OW]


def narrow_convs_as_matmuls(module: ir.Module) -> int:
    """Rewrite every static `linalg.conv_2d_nchw_fchw` that `conv_widths.as_product` picks and
    whose accumulator is a constant or a bias into an im2col gather and a `linalg.matmul`;
    returns how many were rewritten."""
    changed = 0
    with module.context, ir.Location.unknown():
        for op, types in static_ops(module, "linalg.conv_2d_nchw_fchw"):
            n, c, _, _ = types[0].shape
            f, _, kh, kw = types[1].shape
            _, _, oh, ow = types[2].shape
            if not conv_widths.as_product(ow, f, n * oh * ow, c * kh * kw):
                continue
            element = types[2].element_type
            image, weight, init = op.operands
            positions = n * oh * ow
            with ir.InsertionPoint(op), op.location:
                accumulator = channel_init(init, element, [f, positions], 0)
                if accumulator is None:  # nothing was made
                    continue
                taps = _gathered_taps(
                    image,
                    [c, kh, kw, n, oh, ow],
                    element,
                    int_array(op, "strides"),
                    int_array(op, "dilations"),
                )
                product = linalg.matmul(
                    collapsed(weight, [f, c * kh * kw], [[0], [1, 2, 3]]),
                    collapsed(taps, [c * kh * kw, positions], TAPS_FIRST),
                    outs=[accumulator],
                    indexing_maps=matmul_maps((2, 1)),
                )
                result = _as_nchw(product, [f, n, oh, ow])
            op.results[0].replace_all_uses_with(result)
            op.erase()
            changed += 1
    return changed


def _gathered_taps(image: ir.Value, shape: list[int], element, strides, dilations) -> ir.Value:
    """col[c, i, j, n, y, x] = image[n, c, y * sh + i * dh, x * sw + j * dw], as one
    all-parallel `linalg.generic` over `shape` [C, KH, KW, N, OH, OW]."""
    c, i, j, n, y, x = (ir.AffineDimExpr.get(d) for d in range(6))
    row = y * strides[0] + i * dilations[0]
    column = x * strides[1] + j * dilations[1]
    maps = [ir.AffineMap.get(6, 0, [n, c, row, column]), ir.AffineMap.get_identity(6)]
    parallel = ir.Attribute.parse("#linalg.iterator_type<parallel>")
    generic = linalg.GenericOp(
        [ir.RankedTensorType.get(shape, element)],
        [image],
        [tensor.empty(shape, element)],
        ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]),
        ir.ArrayAttr.get([parallel] * 6),
    )
    block = generic.regions[0].blocks.append(element, element)
    with ir.InsertionPoint(block):
        linalg.YieldOp([block.arguments[0]])
    return generic.results[0]


def _as_nchw(product: ir.Value, shape: list[int]) -> ir.Value:
    """The product [F, N * OH * OW] as the convolution's [N, F, OH, OW]: a reshape over one
    image, else a transpose of [F, N, OH, OW]."""
    f, n, oh, ow = shape
    if n == 1:
        return expanded(product, [1, f, oh, ow], [[0, 1], [2, 3]])
    return transposed(expanded(product, shape, [[0], [1, 2, 3]]), [1, 0, 2, 3])
