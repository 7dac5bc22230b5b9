"""How a convolution's output rows fill the vector lanes: rows padded to a whole number of
vectors (the `kbd-pad-conv-widths` stage, before conv2d.mlir), and whether to compute it
channels last instead (`channels_last`, for kbd-convs-channels-last and kbd-conv3d-as-conv2d).

conv2d.mlir keeps register tiles of 32 output columns and ends each row in narrower tiles of
16, 8 and 4 columns, then single columns. A narrow row pays for its tail as for whole vectors:
a row of 30 columns (a 3x3 kernel over 32, common in conv3d and level 2) is a tile of 16, one
of 8, one of 4 and two single columns, five vector steps where two 16-wide ones would do. Here
such a convolution computes a row rounded up to a multiple of 16 columns, over an input whose
rows are padded with zeros to match, and the result is the first columns of each row (a copy
that the epilogue it feeds fuses). A row is padded only when the vector steps drop by at
least a fifth and the row grows by at most a quarter: the padded input and the copy cost
passes over memory (a transposed conv2d's rows of 34 columns, padded to 48, took 1.7x as
long). A conv3d's stacked depth taps are a copy already: their rows may grow more (18 columns
to 32).
"""

from __future__ import annotations

from torch_mlir import ir
from torch_mlir.dialects import arith, linalg, tensor

from kbd.worker.mlir.walk import (
    channel_init,
    extract,
    insert,
    int_array,
    producer,
    static_ops,
)

LANES = 16  # the row is padded to a multiple of this many columns
REGISTER_TILE = 32  # conv2d.mlir's widest register tile (AVX-512), in columns
# What copying one weight into the channels-last layout costs, in full-width vector steps of
# the convolution (calibrated on a ResNet at bench shapes, whose last stages use each weight
# for a few output positions only: there, channels last lost more to the copies than it won).
WEIGHT_COPY = 150
INPUT_COPY = "kbd.input_copy"  # on a convolution's input that is a copy already (rows may grow)
# The largest im2col buffer `as_product` allows, in elements (16 MiB of f32)
MAX_GATHERED = 1 << 22


def vector_steps(width: int) -> int:
    """How many vector steps conv2d.mlir's register tiles take for a row of `width` columns:
    tiles of 32 (two vectors), then 16, 8 and 4 columns, then single columns."""
    steps, rest = 2 * (width // REGISTER_TILE), width % REGISTER_TILE
    for tile in (16, 8, 4):
        if rest >= tile:
            steps, rest = steps + 1, rest - tile
    return steps + rest


def padded_width(width: int, *, input_copied: bool = False) -> int | None:
    """The row width to compute instead of `width`, or None to leave it. A row may grow by a
    quarter, or by any amount when the input is a copy already (kbd-conv3d-as-conv2d's)."""
    padded = -(-width // LANES) * LANES
    if padded == width or 5 * (padded // LANES) > 4 * vector_steps(width):
        return None
    if not input_copied and 4 * padded > 5 * width:
        return None
    return padded


def pad_conv_widths(module: ir.Module) -> int:
    """Compute every static `linalg.conv_2d_nchw_fchw` whose rows `padded_width` widens over
    padded rows; returns how many were rewritten."""
    changed = 0
    with module.context, ir.Location.unknown():
        for op, types in static_ops(module, "linalg.conv_2d_nchw_fchw"):
            image, weight, init = op.operands
            n, c, h, w = types[0].shape
            f, _, _, kw = types[1].shape
            _, _, oh, ow = types[2].shape
            wide = padded_width(ow, input_copied=input_is_copy(image))
            if wide is None:
                continue
            strides, dilations = int_array(op, "strides"), int_array(op, "dilations")
            element = types[2].element_type
            columns = input_columns(wide, kw, strides[1], dilations[1])
            with ir.InsertionPoint(op), op.location:
                padded_image = _padded(image, element, [n, c, h, w], max(columns, w))
                padded_init = channel_init(init, element, [n, f, oh, wide], 1) or _padded(
                    init, element, [n, f, oh, ow], wide
                )
                conv = linalg.conv_2d_nchw_fchw(
                    padded_image, weight, outs=[padded_init], strides=strides, dilations=dilations
                )
                rows = extract(conv, element, [0, 0, 0, 0], [n, f, oh, ow])
                copy = linalg.copy(rows, outs=[tensor.empty([n, f, oh, ow], element)])
            op.results[0].replace_all_uses_with(copy)
            op.erase()
            changed += 1
    return changed


def input_is_copy(value: ir.Value) -> bool:
    """Whether `value` is a copy already (kbd-conv3d-as-conv2d's stacked depth taps)."""
    source = producer(value)
    return source is not None and INPUT_COPY in source.attributes


def channels_last(width: int, filters: int, positions: int, *, input_copied: bool) -> bool:
    """Whether a convolution with output rows of `width` columns, `filters` filters and
    `positions` output positions per filter (N x OH x OW) runs faster with its vectors along
    the filters (channels last, conv2d-nhwc.mlir) than along its rows (conv2d.mlir, rows padded
    by `padded_width`, given `input_copied`): the lanes it saves must pay for its kernel's copy
    into the [KH, KW, C, F] layout, made on every call (a copy of a parameter, strided:
    WEIGHT_COPY steps a weight), and for copying its input and output (a margin of a quarter)."""
    along_rows = _row_fill(width, input_copied=input_copied)
    along_filters = _vector_fill(filters)
    saved = positions * (1 / along_rows - 1 / along_filters)  # vector steps a weight
    return along_filters >= 1.25 * along_rows and saved >= WEIGHT_COPY


def as_product(width: int, filters: int, positions: int, reduction: int) -> bool:
    """Whether a convolution with output rows of `width` columns, `filters` filters,
    `positions` output positions per filter (N x OH x OW) and `reduction` terms per output
    (C x KH x KW) is computed as a product over its gathered taps (kbd-narrow-convs-as-matmuls):
    its rows fill at most half of the lanes conv2d.mlir's tiles give them (rows padded by
    `padded_width`), its positions fill at least three quarters of theirs as the product's
    columns, the gathered taps (`reduction` x `positions` elements) fit MAX_GATHERED, and
    channels last would not be chosen, or would copy more: its copy of the kernel is
    `reduction` x `filters` elements, the gather `reduction` x `positions`."""
    if positions >= filters and channels_last(width, filters, positions, input_copied=False):
        return False
    narrow = _row_fill(width, input_copied=False) <= 0.5
    return narrow and _vector_fill(positions) >= 0.75 and reduction * positions <= MAX_GATHERED


def _row_fill(width: int, *, input_copied: bool) -> float:
    """The share of its vector lanes a row of `width` columns fills in conv2d.mlir's tiles
    (padded by `padded_width`)."""
    return width / (LANES * vector_steps(padded_width(width, input_copied=input_copied) or width))


def _vector_fill(count: int) -> float:
    """The share of their lanes `count` values fill, in whole vectors."""
    return count / (LANES * -(-count // LANES))


def input_columns(width: int, kernel_width: int, stride: int, dilation: int) -> int:
    """How many input columns a row of `width` output columns reads."""
    return (width - 1) * stride + dilation * (kernel_width - 1) + 1


def _padded(value: ir.Value, element, shape: list[int], width: int) -> ir.Value:
    """`value` [N, C, H, W] in the first W columns of a zero [N, C, H, width] tensor: a copy
    into a slice of it (canonicalization folds the copy into the insert, which bufferizes to a
    strided copy that kbd-strided-copies-as-loops makes loops)."""
    if width == shape[3]:
        return value
    wide = [*shape[:3], width]
    zero = arith.ConstantOp(element, ir.FloatAttr.get(element, 0.0)).result
    zeros = linalg.fill(zero, outs=[tensor.empty(wide, element)])
    slot = extract(zeros, element, [0, 0, 0, 0], shape)
    copied = linalg.copy(value, outs=[slot])
    return insert(copied, zeros, [0, 0, 0, 0], shape)
