"""Depthwise convolutions as one element-wise sum over their taps (the
`kbd-depthwise-convs-as-taps` stage); grouped convolutions as one convolution per group (the
`kbd-grouped-convs-as-convs` stage).

A depthwise convolution (`linalg.depthwise_conv_2d_nchw_chw`: torch's conv2d with as many groups
as channels) multiplies each channel by its own small kernel: out[n, c, y, x] = sum over taps
(i, j) of w[c, i, j] * in[n, c, y * sh + i * dh, x * sw + j * dw]. Each tap is a view of the
input (a slice, strided by the stride) times one weight per channel, so the whole convolution is
one element-wise `linalg.generic` over the output whose inputs are the taps' views and the taps'
weight columns, accumulated onto the output's initial value (torch-mlir's bias). It carries the
attribute `kbd.depthwise`, by which `depthwise.mlir` tiles it along the output's contiguous
columns and vectorizes it: per tap, a row of the input times a broadcast weight, one `fma`.
The linalg op itself has no schedule: the conv vectorizer takes only 1-D depthwise convolutions
in channels-last layout.

With a column stride s > 1, a tap's view would read every s-th column: each vector of outputs
gathered lane by lane, for every tap (MobileNet's and EfficientNet's downsampling layers spent
most of the network's time there). The input is first split into its column phases (phase p:
columns p, p + s, p + 2s, ... copied contiguous, once), and a tap reads phase (j * dw) mod s at
column offset (j * dw) div s, contiguously. The copies are `memref.copy`s between strided
buffers after bufferization, which `kbd-strided-copies-as-loops` leaves to LLVM's vectorizer.
"""

from __future__ import annotations

from torch_mlir import ir
from torch_mlir.dialects import arith, bufferization, linalg, tensor

from kbd.worker.mlir.walk import extract, insert, int_array, static_ops

MARKER = "kbd.depthwise"


def depthwise_convs_as_taps(module: ir.Module) -> int:
    """Rewrite every depthwise NCHW convolution of static shapes into an element-wise generic
    over its taps; returns how many were rewritten."""
    changed = 0
    with module.context, ir.Location.unknown():
        for op, types in static_ops(module, "linalg.depthwise_conv_2d_nchw_chw"):
            strides, dilations = int_array(op, "strides"), int_array(op, "dilations")
            image, weight, init = op.operands
            n, c, oh, ow = types[2].shape
            _, kh, kw = types[1].shape
            element = types[2].element_type
            views, columns = [], []
            with ir.InsertionPoint(op), op.location:
                phases = _column_phases(image, types[0], strides[1], dilations[1], kw, ow)
                for i in range(kh):
                    for j in range(kw):
                        source, column, column_stride = image, j * dilations[1], strides[1]
                        if phases:
                            source = phases[column % strides[1]]
                            column, column_stride = column // strides[1], 1
                        views.append(
                            extract(
                                source,
                                element,
                                [0, 0, i * dilations[0], column],
                                [n, c, oh, ow],
                                strides=[1, 1, strides[0], column_stride],
                            )
                        )
                        columns.append(extract(weight, element, [0, i, j], [c, 1, 1], shape=[c]))
                generic = _tap_sum(views, columns, init, types[2])
            op.results[0].replace_all_uses_with(generic.results[0])
            op.erase()
            changed += 1
    return changed


def _column_phases(image: ir.Value, image_type, stride: int, dilation: int, kw: int, ow: int):
    """{phase: a contiguous copy of the image's columns phase, phase + stride, ...} for the
    phases a tap reads, as wide as its taps read; {} for a column stride of 1."""
    if stride == 1:
        return {}
    n, c, h, _ = image_type.shape
    element = image_type.element_type
    reach = {}  # phase -> the largest column offset a tap reads it at
    for j in range(kw):
        phase, offset = divmod(j * dilation, stride)[::-1]
        reach[phase] = max(reach.get(phase, 0), offset)
    phases = {}
    for phase, offset in sorted(reach.items()):
        sizes = [n, c, h, ow + offset]
        view = extract(image, element, [0, 0, 0, phase], sizes, strides=[1, 1, 1, stride])
        copy = bufferization.materialize_in_destination(
            view.type, view, tensor.empty(sizes, element)
        )
        phases[phase] = copy
    return phases


def _tap_sum(views: list, columns: list, init: ir.Value, out_type) -> ir.Operation:
    """linalg.generic: out = init + sum_k views[k] * columns[k] (per channel), all parallel."""
    identity = ir.AffineMap.get_identity(4)
    channel = ir.AffineMap.get(4, 0, [ir.AffineDimExpr.get(1)])
    maps = [identity] * len(views) + [channel] * len(columns) + [identity]
    parallel = ir.Attribute.parse("#linalg.iterator_type<parallel>")
    generic = linalg.GenericOp(
        [out_type],
        [*views, *columns],
        [init],
        ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]),
        ir.ArrayAttr.get([parallel] * 4),
    )
    generic.operation.attributes[MARKER] = ir.UnitAttr.get()
    element = out_type.element_type
    block = generic.regions[0].blocks.append(*([element] * (2 * len(views) + 1)))
    with ir.InsertionPoint(block):
        args = list(block.arguments)
        taps, weights, acc = args[: len(views)], args[len(views) : -1], args[-1]
        for x, w in zip(taps, weights, strict=True):
            acc = arith.addf(acc, arith.mulf(x, w))
        linalg.YieldOp([acc])
    return generic.operation


def grouped_convs_as_convs(module: ir.Module) -> int:
    """Rewrite every grouped NCHW convolution (`linalg.conv_2d_ngchw_gfchw`: torch's conv2d
    with 1 < groups < channels) of static shapes into one `linalg.conv_2d_nchw_fchw` per group,
    on slices of its input, kernel and output (the `kbd-grouped-convs-as-convs` stage), which
    the conv2d schedule computes like any other; returns how many were rewritten."""
    changed = 0
    with module.context, ir.Location.unknown():
        for op, types in static_ops(module, "linalg.conv_2d_ngchw_gfchw"):
            image, weight, init = op.operands
            n, groups, channels, h, w = types[0].shape
            _, filters, _, kh, kw = types[1].shape
            _, _, _, oh, ow = types[2].shape
            element = types[2].element_type
            options = {"strides": int_array(op, "strides"), "dilations": int_array(op, "dilations")}
            with ir.InsertionPoint(op), op.location:
                result = init
                for g in range(groups):
                    x = _group(image, element, g, [n, groups, channels, h, w], 1)
                    k = _group(weight, element, g, [groups, filters, channels, kh, kw], 0)
                    out = _group(init, element, g, [n, groups, filters, oh, ow], 1)
                    conv = linalg.conv_2d_nchw_fchw(x, k, outs=[out], **options)
                    result = insert(conv, result, [0, g, 0, 0, 0], [n, 1, filters, oh, ow])
            op.results[0].replace_all_uses_with(result)
            op.erase()
            changed += 1
    return changed


def _group(value: ir.Value, element, group: int, shape: list[int], dim: int) -> ir.Value:
    """Group `group` of `value` (of `shape`), whose groups are dim `dim`, without that dim."""
    offsets = [0] * len(shape)
    offsets[dim] = group
    sizes = list(shape)
    sizes[dim] = 1
    return extract(value, element, offsets, sizes, shape=shape[:dim] + shape[dim + 1 :])
