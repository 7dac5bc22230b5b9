"""3-D convolutions as 2-D ones (the `kbd-conv3d-as-conv2d` stage).

A 3-D convolution is a 2-D one over a deeper input: output depth od reads the input's depths
od * stride + kd * dilation for each depth tap kd, so with the output depths folded into the
batch and the depth taps into the channels, it is one 2-D convolution over N * OD images of
C * KD channels, with the kernel's taps in the same order. The conv2d schedules (strided,
dilated and grouped forms included) then compute 3-D convolutions too, keeping each output
tile in registers across all of its taps: the output is written once. The price is a copy of
the input per depth tap (its depths moved next to the batch) and one of the output. An input
zero-padded by torch-mlir (a padded or transposed convolution) is copied unpadded into a
zero-filled stack, at its offsets: the padded input is not made.

The copy is made in the layout the convolution is computed in: channels first
(`linalg.conv_2d_nchw_fchw`, conv2d.mlir: vectors along the output rows) or, where those rows
are narrow and the filters fill whole vectors (`conv_widths.channels_last`), channels last
(`linalg.conv_2d_nhwc_hwcf`, conv2d-nhwc.mlir: vectors along the filters). The output depths
are folded into the batch depth-major ([OD * N] images), so that output depths whose taps
differ (a transposed convolution's border depths read fewer real depths of its zero-padded
input: `_depth_groups`) are convolutions of their own over contiguous images, with only the
taps that read real depths.

A kernel one column wide at unit row and column strides needs no stack (`flat_rows`): with
rows and columns flattened its row taps are dilated by the width, a 2-D convolution over
[N, C, D, H * W] of its operands reshaped, and its output rows are long.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir.dialects import arith, linalg, tensor

from kbd.worker.mlir import conv_widths
from kbd.worker.mlir.walk import (
    channel_init,
    collapsed,
    extract,
    insert,
    int_array,
    is_float_constant,
    producer,
    static_ops,
    transposed,
)


@dataclass(frozen=True)
class _Layout:
    """Where each dim of a 2-D convolution's operands goes, for one layout (permutations as
    `linalg.transpose` takes them: result dim i is source dim permutation[i])."""

    slot: list[int]  # [N, C, OD', H, W, 1] (one tap's depths) -> the stack's layout
    tap_dim: int  # where the stack has its taps
    stack_groups: list[list[int]]  # the stack [OD', N, ...] collapsed to a 4-D image
    kernel: list[int]  # [F, C, KD', KH, KW] -> the kernel's layout (before its collapse)
    kernel_groups: list[list[int]]
    init: list[int]  # [N, F, OD', OH, OW] -> [OD', N, ...] (the result's layout, 5-D)
    back: list[int]  # [OD, N, ...] -> [N, F, OD, OH, OW]
    channel_dim: int  # of the 4-D result


# a kernel one column wide: [N, C, D, H, W] -> [N, C, D, H * W] (`flat_rows`)
FLAT = [[0], [1], [2], [3, 4]]
# [OD', N, C, KD', H, W] by [F, C * KD', KH, KW] (the kernel's own layout, reshaped)
CHANNELS_FIRST = _Layout(
    slot=[2, 0, 1, 5, 3, 4],
    tap_dim=3,
    stack_groups=[[0, 1], [2, 3], [4], [5]],
    kernel=[0, 1, 2, 3, 4],
    kernel_groups=[[0], [1, 2], [3], [4]],
    init=[2, 0, 1, 3, 4],
    back=[1, 2, 0, 3, 4],
    channel_dim=1,
)
# [OD', N, H, W, KD', C] by [KH, KW, KD' * C, F]
CHANNELS_LAST = _Layout(
    slot=[2, 0, 3, 4, 5, 1],
    tap_dim=4,
    stack_groups=[[0, 1], [2], [3], [4, 5]],
    kernel=[3, 4, 2, 1, 0],
    kernel_groups=[[0], [1], [2, 3], [4]],
    init=[2, 0, 3, 4, 1],
    back=[1, 4, 0, 2, 3],
    channel_dim=3,
)


def conv3d_as_conv2d(module: ir.Module) -> int:
    """Rewrite every `linalg.conv_3d_ncdhw_fcdhw` of static shapes into one 2-D convolution
    over its depth taps stacked as channels; returns how many were rewritten."""
    changed = 0
    with module.context, ir.Location.unknown():
        for op, types in static_ops(module, "linalg.conv_3d_ncdhw_fcdhw"):
            n, c, _, h, w = types[0].shape
            f, _, kd, kh, kw = types[1].shape
            _, _, od, oh, ow = types[2].shape
            conv = _Conv3d(
                element=types[2].element_type,
                image=[n, c, h, w],
                kernel=[f, kd, kh, kw],
                output=[od, oh, ow],
                strides=int_array(op, "strides"),
                dilations=int_array(op, "dilations"),
            )
            if kw == 1 and conv.strides[1:] == [1, 1]:
                with ir.InsertionPoint(op), op.location:
                    result = conv.flat_rows(*op.operands)
                op.results[0].replace_all_uses_with(result)
                op.erase()
                changed += 1
                continue
            positions = n * od * oh * ow
            channels_last = conv_widths.channels_last(ow, f, positions, input_copied=True)
            with ir.InsertionPoint(op), op.location:
                layout = CHANNELS_LAST if channels_last else CHANNELS_FIRST
                result = conv.build(*op.operands, layout)
            op.results[0].replace_all_uses_with(result)
            op.erase()
            changed += 1
    return changed


class _Conv3d:
    """One 3-D convolution's shapes, and the 2-D convolutions computing it."""

    def __init__(self, *, element, image, kernel, output, strides, dilations):
        self.element, self.image, self.kernel, self.output = element, image, kernel, output
        self.strides, self.dilations = strides, dilations

    def flat_rows(self, image, weight, init) -> ir.Value:
        """The convolution of a kernel one column wide, with unit strides over rows and
        columns, as one 2-D convolution over the depths and the rows and columns flattened:
        output column w of row r reads input column w of rows r + kh * dilation, which is
        flat position (r + kh * dilation) * W + w, so the row taps are dilated by W. Input,
        kernel and output are reshaped, not copied."""
        (n, c, h, w), (f, kd, kh, _), (od, oh, ow) = self.image, self.kernel, self.output
        element, depth, groups = self.element, ir.RankedTensorType(image.type).shape[2], FLAT
        shape = [n, f, od, oh * ow]
        flat_init = channel_init(init, element, shape, 1)
        if flat_init is None:
            flat_init = collapsed(init, shape, groups)
        flat = linalg.conv_2d_nchw_fchw(
            collapsed(image, [n, c, depth, h * w], groups),
            collapsed(weight, [f, c, kd, kh], groups),
            outs=[flat_init],
            strides=[self.strides[0], 1],
            dilations=[self.dilations[0], self.dilations[1] * w],
        )
        return tensor.expand_shape(
            ir.RankedTensorType.get([n, f, od, oh, ow], element),
            flat,
            groups,
            [],
            [n, f, od, oh, ow],
        )

    def build(self, image, weight, init, layout: _Layout) -> ir.Value:
        """The convolution's result: per group of output depths with the same depth taps
        inside the input (`_depth_groups`), one 2-D convolution over [OD' * N] images of
        those taps stacked as channels, in `layout`; the results transposed back."""
        n, (f, kd), (od, oh, ow) = self.image[0], self.kernel[:2], self.output
        element = self.element
        conv_shape = [n, oh, ow, f] if layout is CHANNELS_LAST else [n, f, oh, ow]
        result = tensor.empty([od * conv_shape[0], *conv_shape[1:]], element)
        for first, last, tap, end in _depth_groups(image, od, kd, self.strides, self.dilations):
            rows = [(last - first) * n, *conv_shape[1:]]
            group_init = self._init(init, first, last, rows, layout)
            if tap < end:
                group_init = self._conv(image, weight, group_init, first, last, tap, end, layout)
            result = insert(group_init, result, [first * n, 0, 0, 0], rows)
        expanded = tensor.expand_shape(
            ir.RankedTensorType.get([od, *conv_shape], element),
            result,
            [[0, 1], [2], [3], [4]],
            [],
            [od, *conv_shape],
        )
        return transposed(expanded, layout.back)

    def _conv(self, image, weight, init, first, last, tap, end, layout) -> ir.Value:
        """The convolution of output depths [first, last) over depth taps [tap, end)."""
        (n, c, h, w), (f, _, kh, kw), (_, _, ow) = self.image, self.kernel, self.output
        element, depths, taps = self.element, last - first, end - tap
        width = w
        if layout is CHANNELS_FIRST:
            # rows kbd-pad-conv-widths will widen are read from a stack wide enough already
            wide = conv_widths.padded_width(ow, input_copied=True) or ow
            width = max(w, conv_widths.input_columns(wide, kw, self.strides[2], self.dilations[2]))
        source = [n, c, depths, h, w, 1]
        shape = [source[p] for p in layout.slot]
        shape[layout.tap_dim] = taps
        shape[layout.slot.index(4)] = width
        stack = tensor.empty(shape, element)
        padded = zero_padded(image)
        if width > w or padded is not None:
            zero = arith.ConstantOp(element, ir.FloatAttr.get(element, 0.0)).result
            stack = linalg.fill(zero, outs=[stack])
        for index in range(taps):
            stack = self._tap(image, padded, stack, first, depths, tap + index, index, layout)
        image_shape = _collapsed(shape, layout.stack_groups)
        stacked = tensor.collapse_shape(
            ir.RankedTensorType.get(image_shape, element), stack, layout.stack_groups
        )
        stacked.owner.attributes[conv_widths.INPUT_COPY] = ir.UnitAttr.get()
        kernel = extract(weight, element, [0, 0, tap, 0, 0], [f, c, taps, kh, kw])
        if layout.kernel != [0, 1, 2, 3, 4]:
            kernel = transposed(kernel, layout.kernel)
        kernel_shape = ir.RankedTensorType(kernel.type).shape
        kernel = tensor.collapse_shape(
            ir.RankedTensorType.get(_collapsed(kernel_shape, layout.kernel_groups), element),
            kernel,
            layout.kernel_groups,
        )
        named = linalg.conv_2d_nhwc_hwcf if layout is CHANNELS_LAST else linalg.conv_2d_nchw_fchw
        return named(
            stacked, kernel, outs=[init], strides=self.strides[1:], dilations=self.dilations[1:]
        )

    def _tap(self, image, padded, stack, first, depths, tap, index, layout) -> ir.Value:
        """`stack` with the input's depths of one tap (output depths first.. first + depths)
        copied into its slot `index`, left-aligned in its rows. With `padded` (the input is a
        tensor inserted into zeros, `zero_padded`), that tensor is copied at its offsets into
        the zero-filled stack: the padded input is never made (the tap's depths are real
        ones, `_depth_groups`)."""
        (n, c, h, w), element = self.image, self.element
        start = first * self.strides[0] + tap * self.dilations[0]
        row, column = 0, 0
        if padded is not None:
            image, (_, _, depth_offset, row, column) = padded
            start -= depth_offset
            h, w = ir.RankedTensorType(image.type).shape[3:]
        source = [n, c, depths, h, w, 1]
        slot = [source[p] for p in layout.slot]
        taken = extract(
            image,
            element,
            [0, 0, start, 0, 0],
            [n, c, depths, h, w],
            strides=[1, 1, self.strides[0], 1, 1],
        )
        # The slot keeps its unit dim: a rank-reducing one bufferizes to a subview that folds
        # into the vectorized copy's masked transfer_write with mismatched mask and map. The
        # transpose writes straight into the slot (destination-passing style).
        taken = tensor.expand_shape(
            ir.RankedTensorType.get(source, element),
            taken,
            [[0], [1], [2], [3], [4, 5]],
            [],
            source,
        )
        offsets = [index if d == layout.tap_dim else 0 for d in range(6)]
        offsets[layout.slot.index(3)] = row
        offsets[layout.slot.index(4)] = column
        into = extract(stack, element, offsets, slot)
        moved = linalg.transpose(taken, outs=[into], permutation=layout.slot)
        return insert(moved, stack, offsets, slot)

    def _init(self, init, first, last, rows, layout) -> ir.Value:
        """The accumulator of output depths [first, last): made afresh when it is a constant
        or a bias (`channel_init`), else a transposed copy of its slice."""
        fresh = channel_init(init, self.element, rows, layout.channel_dim)
        if fresh is not None:
            return fresh
        n, f, (_, oh, ow) = self.image[0], self.kernel[0], self.output
        part = extract(init, self.element, [0, 0, first, 0, 0], [n, f, last - first, oh, ow])
        moved = transposed(part, layout.init)
        groups = [[0, 1], [2], [3], [4]]
        return tensor.collapse_shape(ir.RankedTensorType.get(rows, self.element), moved, groups)


def _depth_groups(image, od: int, kd: int, strides, dilations) -> list[tuple[int, int, int, int]]:
    """(first, last, tap, end): output depths [first, last) whose depth taps inside the input
    are [tap, end). A transposed convolution's input is zero-padded (torch-mlir inserts it into
    zeros): its border depths read fewer real depths, and the taps over the zeros are left out
    rather than computed (an output depth with none holds its init)."""
    low, high = _real_depths(image)
    groups: list[tuple[int, int, int, int]] = []
    for depth in range(od):
        reads = [depth * strides[0] + k * dilations[0] for k in range(kd)]
        inside = [k for k, d in enumerate(reads) if low <= d < high]
        tap, end = (inside[0], inside[-1] + 1) if inside else (0, 0)
        if groups and groups[-1][1] == depth and groups[-1][2:] == (tap, end):
            groups[-1] = (groups[-1][0], depth + 1, tap, end)
        else:
            groups.append((depth, depth + 1, tap, end))
    return groups


def _real_depths(image: ir.Value) -> tuple[int, int]:
    """The depths of `image` [N, C, D, H, W] that are not padding: those of the tensor inserted
    into zeros (`zero_padded`), or all."""
    padded = zero_padded(image)
    if padded is None:
        return 0, ir.RankedTensorType(image.type).shape[2]
    source, offsets = padded
    return offsets[2], offsets[2] + ir.RankedTensorType(source.type).shape[2]


def zero_padded(image: ir.Value) -> tuple[ir.Value, list[int]] | None:
    """(the tensor, its offsets) when `image` [N, C, D, H, W] is a tensor inserted into a zero
    `linalg.fill` at static offsets with unit strides (torch-mlir's padding of a convolution's
    input) or a `tensor.pad` of it with zeros (an explicit padding, kbd.worker.transposed_convs'
    phases), padding its depths, rows and columns only; else None."""
    insert_op = producer(image)
    if insert_op is not None and insert_op.name == "tensor.pad":
        return _zero_pad(insert_op)
    if insert_op is None or insert_op.name != "tensor.insert_slice":
        return None
    fill = producer(insert_op.operands[1])
    if fill is None or fill.name != "linalg.fill" or not is_float_constant(fill.operands[0], 0.0):
        return None
    offsets = list(ir.DenseI64ArrayAttr(insert_op.attributes["static_offsets"]))
    sizes = list(ir.DenseI64ArrayAttr(insert_op.attributes["static_sizes"]))
    strides = list(ir.DenseI64ArrayAttr(insert_op.attributes["static_strides"]))
    source = insert_op.operands[0]
    shape = ir.RankedTensorType(source.type).shape
    if len(offsets) != 5 or min(offsets + sizes) < 0 or strides != [1] * 5:  # dynamic, strided
        return None
    if offsets[:2] != [0, 0] or sizes != shape:  # all images and channels, not rank-reducing
        return None
    return source, offsets


def _zero_pad(pad: ir.Operation) -> tuple[ir.Value, list[int]] | None:
    """(the source, its low pads) of a static `tensor.pad` of depths, rows and columns whose
    region yields a zero constant."""
    low = list(ir.DenseI64ArrayAttr(pad.attributes["static_low"]))
    high = list(ir.DenseI64ArrayAttr(pad.attributes["static_high"]))
    if len(pad.operands) != 1 or len(low) != 5 or min(low + high) < 0:  # dynamic pads
        return None
    if low[:2] != [0, 0] or high[:2] != [0, 0]:
        return None
    body = pad.regions[0].blocks[0]
    yielded = list(body.operations)[-1]
    if len(list(body.operations)) != 1 or not is_float_constant(yielded.operands[0], 0.0):
        return None
    return pad.operands[0], low


def _collapsed(shape: list[int], groups: list[list[int]]) -> list[int]:
    sizes = []
    for group in groups:
        size = 1
        for d in group:
            size *= shape[d]
        sizes.append(size)
    return sizes
