"""3-D convolutions as 2-D ones (the `kbd-conv3d-as-conv2d` stage).

A 3-D convolution is a 2-D one over a deeper input: output depth od reads the input's depths
od * stride + kd * dilation for each depth tap kd, so with the output depths folded into the
batch and the depth taps into the channels, it is one 2-D convolution over N * OD images of
C * KD channels, with the kernel's taps in the same order. The conv2d schedules (strided,
dilated and grouped forms included) then compute 3-D convolutions too, keeping each output
tile in registers across all of its taps: the output is written once. The price is a copy of
the input per depth tap (its depths moved next to the batch) and one of the output.

The copy is made in the layout the convolution is computed in: channels first
(`linalg.conv_2d_nchw_fchw`, conv2d.mlir: vectors along the output rows) or, where those rows
are narrow and the filters fill whole vectors (`conv_widths.channels_last`), channels last
(`linalg.conv_2d_nhwc_hwcf`, conv2d-nhwc.mlir: vectors along the filters).
"""

from __future__ import annotations

from torch_mlir import ir
from torch_mlir.dialects import arith, linalg, tensor

from kbd.worker.mlir import conv_widths
from kbd.worker.mlir.walk import (
    channel_init,
    extract,
    insert,
    int_array,
    ops_named,
    static_operand_types,
)

DEPTH_TO_BATCH = [0, 2, 1, 3, 4]  # [N, C, D, H, W] <-> [N, D, C, H, W]


def conv3d_as_conv2d(module: ir.Module) -> int:
    """Rewrite every `linalg.conv_3d_ncdhw_fcdhw` of static shapes into one 2-D convolution
    over its depth taps stacked as channels; returns how many were rewritten."""
    changed = 0
    with module.context, ir.Location.unknown():
        for op in ops_named(module, "linalg.conv_3d_ncdhw_fcdhw"):
            op = op.operation
            types = static_operand_types(op)
            if types is None:
                continue
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
            positions = n * od * oh * ow
            channels_last = conv_widths.channels_last(ow, f, positions, input_copied=True)
            with ir.InsertionPoint(op), op.location:
                build = conv.channels_last if channels_last else conv.channels_first
                result = build(*op.operands)
            op.results[0].replace_all_uses_with(result)
            op.erase()
            changed += 1
    return changed


class _Conv3d:
    """One 3-D convolution's shapes, and the 2-D convolution computing it in either layout."""

    def __init__(self, *, element, image, kernel, output, strides, dilations):
        self.element, self.image, self.kernel, self.output = element, image, kernel, output
        self.strides, self.dilations = strides, dilations

    def channels_first(self, image, weight, init) -> ir.Value:
        """conv_2d_nchw_fchw over [N * OD, C * KD, H, W]; its result transposed back."""
        (n, c, h, w), (f, kd, kh, kw), (od, oh, ow) = self.image, self.kernel, self.output
        element = self.element
        # rows kbd-pad-conv-widths will widen are read from a stack wide enough already
        wide = conv_widths.padded_width(ow, input_copied=True) or ow
        columns = conv_widths.input_columns(wide, kw, self.strides[2], self.dilations[2])
        # [N, OD, C, KD, H, W]: a tap's slot has the input's own layout, depths next to batch
        width = max(w, columns)
        taps = self._stacked(image, [n, od, c, kd, h, width], 3, [0, 2, 1, 5, 3, 4])
        stacked = self._reshaped(taps, [n * od, c * kd, h, width], [[0, 1], [2, 3], [4], [5]])
        kernel = tensor.collapse_shape(
            ir.RankedTensorType.get([f, c * kd, kh, kw], element), weight, [[0], [1, 2], [3], [4]]
        )
        result = linalg.conv_2d_nchw_fchw(
            stacked,
            kernel,
            outs=[
                channel_init(init, element, [n * od, f, oh, ow], 1)
                or self._moved(init, [n, f, od, oh, ow], DEPTH_TO_BATCH, [n * od, f, oh, ow])
            ],
            strides=self.strides[1:],
            dilations=self.dilations[1:],
        )
        expanded = tensor.expand_shape(
            ir.RankedTensorType.get([n, od, f, oh, ow], element),
            result,
            [[0, 1], [2], [3], [4]],
            [],
            [n, od, f, oh, ow],
        )
        return self._transposed(expanded, [n, f, od, oh, ow], DEPTH_TO_BATCH)

    def channels_last(self, image, weight, init) -> ir.Value:
        """conv_2d_nhwc_hwcf over [N * OD, H, W, KD * C] with the kernel [KH, KW, KD * C, F];
        its result transposed back."""
        (n, c, h, w), (f, kd, kh, kw), (od, oh, ow) = self.image, self.kernel, self.output
        element = self.element
        # [N, OD, H, W, KD, C]: a tap's slot has the channels innermost
        taps = self._stacked(image, [n, od, h, w, kd, c], 4, [0, 2, 3, 4, 5, 1])
        stacked = self._reshaped(taps, [n * od, h, w, kd * c], [[0, 1], [2], [3], [4, 5]])
        # [F, C, KD, KH, KW] -> [KH, KW, KD, C, F] (a constant: folded at compile time)
        moved = self._transposed(weight, [kh, kw, kd, c, f], [3, 4, 2, 1, 0])
        kernel = tensor.collapse_shape(
            ir.RankedTensorType.get([kh, kw, kd * c, f], element), moved, [[0], [1], [2, 3], [4]]
        )
        result = linalg.conv_2d_nhwc_hwcf(
            stacked,
            kernel,
            outs=[
                channel_init(init, element, [n * od, oh, ow, f], 3)
                or self._moved(init, [n, od, oh, ow, f], [0, 2, 3, 4, 1], [n * od, oh, ow, f])
            ],
            strides=self.strides[1:],
            dilations=self.dilations[1:],
        )
        expanded = tensor.expand_shape(
            ir.RankedTensorType.get([n, od, oh, ow, f], element),
            result,
            [[0, 1], [2], [3], [4]],
            [],
            [n, od, oh, ow, f],
        )
        return self._transposed(expanded, [n, f, od, oh, ow], [0, 4, 1, 2, 3])

    def _stacked(self, image, shape, tap_dim, permutation) -> ir.Value:
        """The input's depth taps, each copied into its slot (index kd along `tap_dim`) of a
        tensor of `shape`: `permutation` takes the input's [N, C, OD, H, W, 1] (depths of one
        tap, a unit dim for the tap) to the slot's layout. Columns past the input's (a last
        dim wider than W) are zeros."""
        (n, c, h, w), kd, od, element = self.image, self.kernel[1], self.output[0], self.element
        stacked = tensor.empty(shape, element)
        if permutation[-1] == 4 and shape[-1] > w:
            zero = arith.ConstantOp(element, ir.FloatAttr.get(element, 0.0)).result
            stacked = linalg.fill(zero, outs=[stacked])
        source = [n, c, od, h, w, 1]
        slot = [source[p] for p in permutation]
        for tap in range(kd):
            depths = extract(
                image,
                element,
                [0, 0, tap * self.dilations[0], 0, 0],
                [n, c, od, h, w],
                strides=[1, 1, self.strides[0], 1, 1],
            )
            # The slot keeps its unit dim: a rank-reducing one bufferizes to a subview that
            # folds into the vectorized copy's masked transfer_write with mismatched mask and
            # map. The transpose writes straight into the slot (destination-passing style).
            depths = tensor.expand_shape(
                ir.RankedTensorType.get(source, element),
                depths,
                [[0], [1], [2], [3], [4, 5]],
                [],
                source,
            )
            offsets = [tap if d == tap_dim else 0 for d in range(6)]
            into = extract(stacked, element, offsets, slot)
            moved = linalg.transpose(depths, outs=[into], permutation=permutation)
            stacked = insert(moved, stacked, offsets, slot)
        return stacked

    def _reshaped(self, value, shape, groups) -> ir.Value:
        """`value` collapsed to `shape`; a stacked input is marked a copy already."""
        reshape = tensor.collapse_shape(ir.RankedTensorType.get(shape, self.element), value, groups)
        reshape.owner.attributes[conv_widths.INPUT_COPY] = ir.UnitAttr.get()
        return reshape

    def _transposed(self, value, shape, permutation) -> ir.Value:
        return linalg.transpose(
            value, outs=[tensor.empty(shape, self.element)], permutation=permutation
        ).results[0]

    def _moved(self, init, shape, permutation, collapsed) -> ir.Value:
        """A copy of `init` transposed to `shape`, its first two dims folded into one."""
        moved = self._transposed(init, shape, permutation)
        groups = [[0, 1], *[[d] for d in range(2, len(shape))]]
        return tensor.collapse_shape(
            ir.RankedTensorType.get(collapsed, self.element), moved, groups
        )
