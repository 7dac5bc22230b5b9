"""Strided convolutions as stride-1 convolutions over the input's phases (the
`kbd-strided-convs-as-phases` stage).

A convolution of stride s reads input position o * s + t for output o and tap t = k * d (kernel
index k, dilation d). Writing t = i * s + p (phase p = t mod s, offset i = t div s), that is
position (o + i) * s + p: row o + i of the input's phase p (every s-th position from p). So the
convolution is a stride-1 convolution whose input channels are the input's channels times its
phases and whose kernel holds tap k at (phase p, offset i), zeros elsewhere. kbd's conv2d
schedule vectorizes stride-1 convolutions along contiguous output columns; a strided one it can
only unroll column by column (the input row it reads is not contiguous), an order of magnitude
slower. The price: the phased input is one copy of the input, and the kernel may gain zero taps
(an 11x11 kernel of stride 4 becomes 16 phases of 3x3: 144 taps for 121; a 1x1 kernel of stride
2 gains none: one phase of 1x1, the input subsampled).

Per spatial dim, with stride s, dilation d and kernel size K:
- s == 1: left as it is (one phase, same kernel and dilation);
- d a multiple of s: one phase, the same K taps at dilation d / s;
- otherwise the phases used must be 0 .. m-1 (true for d == 1, and for d and s coprime with
  K >= s); the new kernel has max(i) + 1 taps at dilation 1, unless that makes more than
  MAX_ZERO_TAPS slots per real tap (3x3 at stride 2: 16 for 9). Then each tap's O rows are
  gathered from its phase as a channel of their own, and the kernel has size 1 in that dim: no
  zero taps, one copy of the output's size per tap (im2col along that dim).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir.dialects import arith, linalg, tensor

from kbd.worker.mlir.walk import extract, insert, int_array, static_ops

CONVOLUTIONS = {"linalg.conv_2d_nchw_fchw": 2, "linalg.conv_1d_ncw_fcw": 1}


# A dim whose phases would hold more than this many kernel slots per real tap gathers its taps
# instead (see `Dim.gathered`).
MAX_ZERO_TAPS = 1.25


@dataclass(frozen=True)
class Dim:
    """How one spatial dim of a convolution is rewritten."""

    stride: int
    phases: int  # m: phases of the input this dim uses (0 .. m-1)
    rows: int  # Y: rows of each phase the stride-1 convolution reads
    taps: list[tuple[int, int]]  # per kernel index k: (phase p, offset i)
    kernel: int  # K': the phased kernel's size
    dilation: int  # the new convolution's dilation
    output: int  # O
    gathered: bool  # each tap's rows gathered as a channel of its own, the kernel size 1

    @property
    def slots(self) -> int:
        """Channels per input channel in the new convolution."""
        return len(self.taps) if self.gathered else self.phases

    @property
    def new_kernel(self) -> int:
        return 1 if self.gathered else self.kernel

    def placed(self, k: int) -> tuple[int, int]:
        """Where tap k goes in the new kernel: (channel slot, offset)."""
        return (k, 0) if self.gathered else self.taps[k]


def _dim(stride: int, dilation: int, kernel: int, output: int, size: int) -> Dim | None:
    if stride == 1:
        return Dim(1, 1, size, [(0, k) for k in range(kernel)], kernel, dilation, output, False)
    if dilation % stride == 0:
        taps = [(0, k) for k in range(kernel)]
        new_dilation = dilation // stride
        new_kernel = kernel
    else:
        taps = [((k * dilation) % stride, (k * dilation) // stride) for k in range(kernel)]
        new_dilation = 1
        new_kernel = max(i for _, i in taps) + 1
    phases = sorted({p for p, _ in taps})
    if phases != list(range(len(phases))):
        return None
    rows = output + (new_kernel - 1) * new_dilation
    # Phases cost zero taps where a tap's offsets leave gaps (a 3-tap kernel at stride 3 and
    # dilation 4: 9 slots for 3 taps); gathering costs a copy of the input per tap instead.
    gathered = len(phases) * new_kernel > MAX_ZERO_TAPS * kernel
    return Dim(stride, len(phases), rows, taps, new_kernel, new_dilation, output, gathered)


def strided_convs_as_phases(module: ir.Module) -> int:
    """Rewrite every strided NCHW/FCHW (or NCW/FCW) convolution of static shapes into a stride-1
    convolution over the input's phases; returns how many were rewritten."""
    return _as_phases(module, CONVOLUTIONS)


def strided_conv1ds_as_phases(module: ir.Module) -> int:
    """`strided_convs_as_phases` of the 1-D convolutions only (`kbd-strided-conv1ds-as-phases`),
    run before the product stages: one whose taps are gathered is then a pointwise convolution,
    which `kbd-pointwise-convs-as-matmuls` makes a product. (2-D ones stay with the
    convolution stages: `kbd-convs-channels-last` takes some strided ones first.)"""
    return _as_phases(module, {"linalg.conv_1d_ncw_fcw": 1})


def _as_phases(module: ir.Module, convolutions: dict[str, int]) -> int:
    changed = 0
    with module.context, ir.Location.unknown():
        for name, spatial in convolutions.items():
            for op, types in static_ops(module, name):
                strides, dilations = int_array(op, "strides"), int_array(op, "dilations")
                if all(s == 1 for s in strides):
                    continue
                image, weight, out = (list(t.shape) for t in types)
                dims = [
                    _dim(strides[j], dilations[j], weight[2 + j], out[2 + j], image[2 + j])
                    for j in range(spatial)
                ]
                if any(d is None for d in dims):
                    continue
                with ir.InsertionPoint(op), op.location:
                    phased = _phased_input(op.operands[0], types[0], dims)
                    kernel = _phased_kernel(op.operands[1], types[1], dims)
                    conv = getattr(linalg, name.removeprefix("linalg."))
                    new = conv(
                        phased,
                        kernel,
                        outs=[op.operands[2]],
                        strides=[1] * spatial,
                        dilations=[1 if d.gathered else d.dilation for d in dims],
                    )
                op.results[0].replace_all_uses_with(new)
                op.erase()
                changed += 1
    return changed


def _zeros(shape: list[int], element: ir.Type) -> ir.Value:
    zero = arith.constant(element, 0.0)
    return linalg.fill(zero, outs=[tensor.empty(shape, element)])


def _phased_input(image: ir.Value, image_type, dims: list[Dim]) -> ir.Value:
    """[N, C, I...] -> [N, C * m..., Y...]: each spatial dim padded with zeros (or cut) to Y * s
    positions, split into Y rows of s phases, phases 0 .. m-1 kept and moved next to C."""
    element = image_type.element_type
    n, c, *sizes = image_type.shape
    spatial = len(dims)
    wanted = [d.rows * d.stride for d in dims]
    if wanted != sizes:
        kept = [min(w, s) for w, s in zip(wanted, sizes, strict=True)]
        if kept != sizes:
            image = extract(image, element, [0] * (2 + spatial), [n, c, *kept])
        if kept != wanted:
            image = insert(image, _zeros([n, c, *wanted], element), [0] * (2 + spatial),
                            [n, c, *kept])  # fmt: skip
    split = [n, c] + [x for d in dims for x in (d.rows, d.stride)]
    groups = [[0], [1]] + [[2 + 2 * j, 3 + 2 * j] for j in range(spatial)]
    image = tensor.expand_shape(ir.RankedTensorType.get(split, element), image, groups, [], split)
    phases = [n, c] + [x for d in dims for x in (d.rows, d.phases)]
    if phases != split:
        image = extract(image, element, [0] * len(split), phases)
    # [N, C, Y1, m1, Y2, m2] -> [N, C, m1, m2, Y1, Y2]
    order = [0, 1] + [3 + 2 * j for j in range(spatial)] + [2 + 2 * j for j in range(spatial)]
    moved = [phases[i] for i in order]
    image = linalg.transpose(image, outs=[tensor.empty(moved, element)], permutation=order)
    if any(d.gathered for d in dims):
        image = _gathered(image, element, n, c, dims)
    channels = c
    for d in dims:
        channels *= d.slots
    result = [n, channels] + [d.output if d.gathered else d.rows for d in dims]
    groups = [[0], list(range(1, 2 + spatial))] + [[2 + spatial + j] for j in range(spatial)]
    return tensor.collapse_shape(ir.RankedTensorType.get(result, element), image, groups)


def _gathered(phased: ir.Value, element, n: int, c: int, dims: list[Dim]) -> ir.Value:
    """[N, C, m..., Y...] -> [N, C, slots..., rows...]: in a gathered dim, slot k holds the O
    rows of tap k's phase from its offset (one slice copied per tap); other dims as they are."""
    shape = [n, c] + [d.slots for d in dims] + [d.output if d.gathered else d.rows for d in dims]
    gathered = tensor.empty(shape, element)
    choices: list[list[int | None]] = [[]]
    for d in dims:
        options = range(len(d.taps)) if d.gathered else [None]
        choices = [[*chosen, k] for chosen in choices for k in options]
    for chosen in choices:
        # per dim: (source slot, slots, target slot) and (source row, rows)
        slots = [
            (0, d.phases, 0) if k is None else (d.taps[k][0], 1, k)
            for d, k in zip(dims, chosen, strict=True)
        ]
        rows = [
            (0, d.rows) if k is None else (d.taps[k][1], d.output)
            for d, k in zip(dims, chosen, strict=True)
        ]
        source_offsets = [0, 0] + [s[0] for s in slots] + [r[0] for r in rows]
        sizes = [n, c] + [s[1] for s in slots] + [r[1] for r in rows]
        target_offsets = [0, 0] + [s[2] for s in slots] + [0] * len(rows)
        taken = extract(phased, element, source_offsets, sizes)
        gathered = insert(taken, gathered, target_offsets, sizes)
    return gathered


def _phased_kernel(weight: ir.Value, weight_type, dims: list[Dim]) -> ir.Value:
    """[F, C, K...] -> [F, C * m..., K'...]: tap k of each dim at (phase p, offset i), zeros
    elsewhere (one slice copied per tap)."""
    element = weight_type.element_type
    f, c, *sizes = weight_type.shape
    spatial = len(dims)
    shape = [f, c] + [d.slots for d in dims] + [d.new_kernel for d in dims]
    kernel = _zeros(shape, element)
    taps: list[list[int]] = [[]]
    for j in range(spatial):
        taps = [[*tap, k] for tap in taps for k in range(sizes[j])]
    for tap in taps:
        column = extract(weight, element, [0, 0, *tap], [f, c] + [1] * spatial, shape=[f, c])
        placed = [dims[j].placed(k) for j, k in enumerate(tap)]
        offsets = [0, 0] + [p for p, _ in placed] + [i for _, i in placed]
        kernel = insert(column, kernel, offsets, [f, c] + [1] * (2 * spatial))
    channels = c
    for d in dims:
        channels *= d.slots
    result = [f, channels] + [d.new_kernel for d in dims]
    groups = [[0], list(range(1, 2 + spatial))] + [[2 + spatial + j] for j in range(spatial)]
    return tensor.collapse_shape(ir.RankedTensorType.get(result, element), kernel, groups)
