"""Every family schedule under schedules/<arch>/ lowers a small kernel of its family and, when
this CPU has the schedule's features, runs it and matches eager; a schedule for features the host
lacks is compiled to machine code for those features (written as an object file, not run)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch_mlir import ir

from kbd.plan import descriptor, target
from kbd.shared.protocol import Stage
from kbd.worker import families, ingress, mlir, runtime
from kbd.worker.mlir import conv_widths, outline, walk
from tests.conftest import FIXTURE_KB, fixture_args, json_records, kbd

SCHEDULES = Path(__file__).resolve().parent.parent / "schedules"
ARCH, HOST_FEATURES = descriptor.host_target()


class Matmul(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


class TensorMatrixEinsum(torch.nn.Module):
    """KernelBench's 4-D tensor-matrix product: imported as a batch matmul of one batch over the
    collapsed operands, then a transpose that moves a unit dim of the result."""

    def forward(self, a, b):
        return torch.einsum("bijl,lk->bijk", a, b)


class Lstm(torch.nn.Module):
    """Two LSTM layers: torch-mlir imports the first layer's input projection over all steps as
    a batch matmul against a copy of W per step (kbd-shared-b-batch-matmuls-as-matmuls), and
    each step's gates as element-wise ops after a matmul (the epilogue stages)."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(0)  # the same weights for kbd and for torch
        self.lstm = torch.nn.LSTM(24, 32, 2, batch_first=True)
        for weight in self.lstm.parameters():
            weight.data = torch.rand(weight.shape, generator=generator) * 0.4 - 0.2

    def forward(self, x):
        return self.lstm(x)[0]


class SharedWeightBmm(torch.nn.Module):
    """x @ W for a 3-D x written as a batch matmul against W repeated in every batch."""

    def forward(self, x, w):
        return torch.bmm(x, w.t().unsqueeze(0).expand(x.shape[0], -1, -1))


class TwoMatmuls(torch.nn.Module):
    def forward(self, a, b):
        return torch.relu(a @ b) @ b


class Chain(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(torch.relu(2 * x + 1)) * 0.5


class Cube(torch.nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(x + 0.044715 * torch.pow(x, 3.0)))


class BiasChain(torch.nn.Module):
    def forward(self, x, bias):
        return torch.sigmoid(x + bias) * x


class LinearRelu(torch.nn.Module):
    """nn.Linear's product (x W^T + b, imported as a transpose of W and a matmul), then ReLU."""

    def forward(self, x, weight, bias):
        return torch.relu(torch.nn.functional.linear(x, weight, bias))


class Bmm(torch.nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b)


class UnrolledRnn(torch.nn.Module):
    """level3/34's cell unrolled over the steps of x: the same two products (x W^T + b) every
    step (kbd-outline-repeated-ops makes each one function, called every step)."""

    def forward(self, x, h, w_ih, b_ih, w_ho, b_ho):
        outputs = []
        for step in x:
            h = torch.tanh(F.linear(torch.cat((step, h), dim=1), w_ih, b_ih))
            outputs.append(F.linear(h, w_ho, b_ho))
        return torch.stack(outputs)


class RepeatedConvs(torch.nn.Module):
    """A DenseNet block's kind: the same padded 3x3 convolution with other weights three times
    (one outlined function), then a 1x1 one, which stays in place."""

    def forward(self, x, w1, w2, w3, w4):
        for weight in (w1, w2, w3):
            x = torch.relu(F.conv2d(x, weight, padding=1) * 0.2)
        return F.conv2d(x, w4)


class Softmax(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


class LogSoftmax(torch.nn.Module):
    def forward(self, x):
        return torch.log_softmax(x, dim=-1)


class SumLast(torch.nn.Module):
    def forward(self, x):
        return torch.sum(x, dim=-1)


class MaxMiddle(torch.nn.Module):
    def forward(self, x):
        return torch.max(x, dim=1)[0]


class SumMiddleKeepdim(torch.nn.Module):
    def forward(self, x):
        return torch.sum(x, dim=1, keepdim=True)


class MeanMiddle(torch.nn.Module):
    def forward(self, x):
        return torch.mean(x, dim=1)


class ArgmaxMiddle(torch.nn.Module):
    def forward(self, x):
        return torch.argmax(x, dim=1)


class ArgminLast(torch.nn.Module):
    def forward(self, x):
        return torch.argmin(x, dim=-1)


class RmsNorm(torch.nn.Module):
    """KernelBench's RMS norm: a mean of squares over the channels of a 4-D tensor."""

    def forward(self, x):
        return x / torch.sqrt(torch.mean(x**2, dim=1, keepdim=True) + 1e-5)


class L2Norm(torch.nn.Module):
    def forward(self, x):
        return x / torch.norm(x, p=2, dim=1, keepdim=True)


class FrobeniusNorm(torch.nn.Module):
    def forward(self, x):
        return x / torch.norm(x, p="fro")


class MseLoss(torch.nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)


class HingeLoss(torch.nn.Module):
    def forward(self, predictions, targets):
        return torch.mean(torch.clamp(1 - predictions * targets, min=0))


class TripletMarginLoss(torch.nn.Module):
    """Row distances (last-dim reductions), then the mean of a vector: a 1-D reduction that
    must stay one sequential loop (tiled across threads it would race)."""

    def forward(self, anchor, positive, negative):
        return torch.nn.functional.triplet_margin_loss(anchor, positive, negative)


class FourDimLoss(torch.nn.Module):
    """A mean of a 4-D tensor past decompositions.BLOCK: row sums of its last dim first."""

    def forward(self, x, y):
        return torch.mean(torch.abs(x - y))


class CrossEntropy(torch.nn.Module):
    """Cross entropy against fixed class targets (a buffer: every input of a case is a float)."""

    def __init__(self, rows=6, classes=70, ignore_index=-100):
        super().__init__()
        generator = torch.Generator().manual_seed(1)
        targets = torch.randint(0, classes, (rows,), generator=generator)
        targets[0] = ignore_index if ignore_index >= 0 else targets[0]  # one row ignored
        self.register_buffer("targets", targets)
        self.ignore_index = ignore_index

    def forward(self, x):
        return torch.nn.functional.cross_entropy(x, self.targets, ignore_index=self.ignore_index)


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


class SelfAttentionHeads(torch.nn.Module):
    """Two heads of self-attention written out as the transformers of level 3 write them: the
    projections are nn.Linear's products (matmuls), the scores and the weighted values batch
    matmuls, with the key's transpose and the head split between them."""

    def forward(self, x, wq, wk, wv):
        batch, tokens, _ = x.shape
        q, k, v = (
            F.linear(x, w).view(batch, tokens, 2, -1).transpose(1, 2).reshape(2 * batch, tokens, -1)
            for w in (wq, wk, wv)
        )
        scores = torch.bmm(q, k.transpose(1, 2)) / q.shape[-1] ** 0.5
        return torch.bmm(torch.softmax(scores, dim=-1), v)


class TwoAttentionLayers(SelfAttentionHeads):
    """Two layers of SelfAttentionHeads with the same weights: each product occurs twice, so
    kbd-outline-repeated-ops makes it a function both layers call, and each softmax reads a
    call's result. The weights are scaled to keep the second layer's scores moderate (with
    randn weights they reach thousands, and a softmax that sharp magnifies rounding)."""

    def forward(self, x, wq, wk, wv):
        wq, wk, wv = (w / w.shape[1] for w in (wq, wk, wv))
        heads = super().forward(x, wq, wk, wv)  # [2 * batch, tokens, features / 2]
        return super().forward(heads.reshape(x.shape), wq, wk, wv)


class LinearSoftmax(torch.nn.Module):
    """A softmax over a product's rows of 64: a chain of rank 2 whose max and sum keep their
    reduced dim (row-chains.mlir, one row at a time)."""

    def forward(self, x, w):
        return torch.softmax(F.linear(x, w), dim=-1)


class Cumsum(torch.nn.Module):
    def __init__(self, dim=1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.cumsum(x, dim=self.dim)


class ReverseCumprod(torch.nn.Module):
    """A reversed cumulative product over the last dim (flips around the scan)."""

    def forward(self, x):
        return torch.cumprod(x.flip(-1), dim=-1).flip(-1)


class Mv(torch.nn.Module):
    def forward(self, a, x):
        return torch.mv(a, x)


class LayerNorm(torch.nn.Module):
    """Layer norm over the last two dims, with a weight and bias that are not 1 and 0."""

    def __init__(self, shape=(5, 33)):
        super().__init__()
        self.norm = torch.nn.LayerNorm(shape)
        count = self.norm.weight.numel()
        with torch.no_grad():
            self.norm.weight.copy_(torch.linspace(0.5, 1.5, count).reshape(shape))
            self.norm.bias.copy_(torch.linspace(-1.0, 1.0, count).reshape(shape))

    def forward(self, x):
        return self.norm(x)


class LongLayerNorm(LayerNorm):
    """Rows longer than kbd's summation block (decompositions.BLOCK): summed in blocks."""

    def __init__(self):
        super().__init__((3 * 65536,))


class GroupNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.GroupNorm(2, 8)
        with torch.no_grad():
            self.norm.weight.copy_(torch.linspace(0.5, 1.5, 8))
            self.norm.bias.copy_(torch.linspace(-1.0, 1.0, 8))

    def forward(self, x):
        return self.norm(x)


class InstanceNorm(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.instance_norm(x)


class BatchNorm(torch.nn.Module):
    """Inference batch norm (running statistics)."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm2d(4).eval()
        with torch.no_grad():
            self.norm.running_mean.copy_(torch.linspace(-0.5, 0.5, 4))
            self.norm.running_var.copy_(torch.linspace(0.5, 2.0, 4))
            self.norm.weight.copy_(torch.linspace(0.5, 1.5, 4))

    def forward(self, x):
        return self.norm(x)


class Conv(torch.nn.Module):
    """conv2d or conv1d (by the rank of `shape`), or their transposed forms, with a bias and
    fixed random weights of `shape`: every instance computes the same function."""

    def __init__(self, shape=(4, 3, 3, 3), transposed=False, **options):
        super().__init__()
        generator = torch.Generator().manual_seed(1)
        filters = shape[1] * options.get("groups", 1) if transposed else shape[0]
        self.register_buffer("weight", torch.randn(shape, generator=generator))
        self.register_buffer("bias", torch.randn(filters, generator=generator))
        if len(shape) == 3:
            self.conv = F.conv_transpose1d if transposed else F.conv1d
        else:
            self.conv = F.conv_transpose2d if transposed else F.conv2d
        self.options = options

    def forward(self, x):
        return self.conv(x, self.weight, self.bias, **self.options)


class Conv3d(torch.nn.Module):
    """conv3d, or its transposed form, with a bias and fixed random weights of `shape`."""

    def __init__(self, shape=(4, 3, 3, 3, 3), transposed=False, **options):
        super().__init__()
        generator = torch.Generator().manual_seed(1)
        filters = shape[1] * options.get("groups", 1) if transposed else shape[0]
        self.register_buffer("weight", torch.randn(shape, generator=generator))
        self.register_buffer("bias", torch.randn(filters, generator=generator))
        self.conv = F.conv_transpose3d if transposed else F.conv3d
        self.options = options

    def forward(self, x):
        return self.conv(x, self.weight, self.bias, **self.options)


class Pool(torch.nn.Module):
    """Max or average pooling, 1-D to 3-D by the input's rank, with the given options."""

    def __init__(self, average=False, **options):
        super().__init__()
        self.average, self.options = average, options

    def forward(self, x):
        rank = x.dim() - 2
        if self.average:
            return (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[rank - 1](x, **self.options)
        return (F.max_pool1d, F.max_pool2d, F.max_pool3d)[rank - 1](x, **self.options)


def pool(average=False, **options):
    return functools.partial(Pool, average, **options)


class TwoConvs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = Conv((6, 3, 3, 3), padding=1), Conv((4, 6, 3, 3))

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


class ConvTanhScaleMaxPool(torch.nn.Module):
    """level2/82's graph: conv2d, tanh, a scaling and a bias, then a max pooling."""

    def __init__(self):
        super().__init__()
        self.conv = Conv((6, 3, 3, 3))
        self.register_buffer("bias", torch.linspace(-1.0, 1.0, 6).reshape(6, 1, 1))

    def forward(self, x):
        return F.max_pool2d(torch.tanh(self.conv(x)) * 2.0 + self.bias, 4)


class PoolChain(torch.nn.Module):
    """GoogLeNet's pattern, with an optional convolution first: a stride-2 max pool whose
    result an inception's 3x3 max pool reads, and another branch too."""

    def __init__(self, conv=False):
        super().__init__()
        self.conv = Conv((6, 3, 3, 3)) if conv else torch.nn.Identity()

    def forward(self, x):
        first = F.max_pool2d(self.conv(x), 3, 2, 1)
        return F.max_pool2d(first, 3, 1, 1) + first


class ConvEpilogue(torch.nn.Module):
    """A convolution (2-D or 3-D by the input's rank) and level 2's kind of epilogue: a bias of
    one value per channel, GELU (erf), sigmoid (exp), a scaling and a clamp."""

    def __init__(self, spatial=3):
        super().__init__()
        self.conv = Conv3d((6, 3, 3, 3, 3)) if spatial == 3 else Conv((6, 3, 3, 3))
        generator = torch.Generator().manual_seed(2)
        self.register_buffer("bias", torch.randn(6, *[1] * spatial, generator=generator))

    def forward(self, x):
        y = F.gelu(self.conv(x)) + self.bias
        return torch.clamp(torch.sigmoid(y) * 2.0 * y, -1.0, 1.0)


class ConvMeanKeepdim(torch.nn.Module):
    """level2/8's ops: a conv3d, a max pool, a global average pool into [N, C, 1, 1, 1], a bias
    and a sum over the channels. A reduction's result that holds the collapsed dims as unit
    dims read at constant 0 must keep its type (kbd-collapse-reduction-dims folds inputs' only)."""

    def __init__(self):
        super().__init__()
        self.conv = Conv3d((8, 3, 3, 3, 3))
        self.register_buffer(
            "bias", torch.randn(8, 1, 1, 1, generator=torch.Generator().manual_seed(2))
        )

    def forward(self, x):
        pooled = F.adaptive_avg_pool3d(F.max_pool3d(self.conv(x) / 2, 2), 1)
        return (pooled + self.bias).sum(dim=1)


# family -> (module, input shapes) cases: one that divides the schedule's tiles, one that does not
CASES = {
    "matmul": [
        (Matmul, [(64, 64), (64, 64)]),
        (Matmul, [(32, 48), (48, 17)]),
        (Matmul, [(300, 40), (40, 260)]),  # several blocks, partial ones at the edges
        (TwoMatmuls, [(260, 40), (40, 40)]),  # each matmul gets its blocks and fill
        (LinearRelu, [(8, 64), (192, 64), (192,)]),  # W's transpose folded: matmul-transposed-b
        (LinearRelu, [(11, 37), (70, 37), (70,)]),  # partial tiles in M, N and K
        (LinearRelu, [(130, 40), (24, 40), (24,)]),  # too many rows to fold: matmul.mlir
        (TensorMatrixEinsum, [(2, 3, 5, 24), (24, 40)]),  # kbd-unit-dims-as-reshapes first
        (SharedWeightBmm, [(4, 5, 24), (40, 24)]),  # one matmul of 20 rows, W's transpose folded
        (Lstm, [(3, 4, 24)]),  # gates vectorized after each step's matmul
        (SelfAttentionHeads, [(2, 20, 40), (24, 40), (24, 40), (24, 40)]),  # product-stages.yaml
        # rows of 64 scores: each softmax one row at a time (row-chains.mlir)
        (TwoAttentionLayers, [(2, 64, 48), (48, 48), (48, 48), (48, 48)]),
        (LinearSoftmax, [(10, 40), (64, 40)]),  # its softmax one row at a time
        # each step's two products: one outlined function each (kbd-outline-repeated-ops)
        (UnrolledRnn, [(5, 4, 24), (4, 40), (40, 64), (40,), (16, 40), (16,)]),
    ],
    "batch_matmul": [
        (Bmm, [(2, 64, 32), (2, 32, 64)]),
        (Bmm, [(3, 20, 24), (3, 24, 37)]),
        (Attention, [(2, 3, 20, 40), (2, 3, 24, 40), (2, 3, 24, 33)]),  # partial tiles everywhere
        (SelfAttentionHeads, [(2, 20, 40), (24, 40), (24, 40), (24, 40)]),  # product-stages.yaml
        (TwoAttentionLayers, [(2, 64, 48), (48, 48), (48, 48), (48, 48)]),  # row-chains.mlir
    ],
    "element_wise": [
        (Chain, [(8, 64)]),
        (Chain, [(3, 5, 7)]),
        (BiasChain, [(6, 10), (10,)]),
        (Cube, [(4, 40)]),
    ],
    "scan": [
        (Cumsum, [(5, 70)]),  # along the innermost dim: 4 chunks of 16 lanes and a partial one
        (Cumsum, [(2, 9, 33)]),  # along a middle dim: rows of 33
        (functools.partial(Cumsum, 0), [(40,)]),
        (ReverseCumprod, [(3, 4, 20)]),
    ],
    "matvec": [
        (Matmul, [(64, 256), (256, 1)]),
        (Matmul, [(37, 70), (70, 1)]),
        (Mv, [(40, 70), (70,)]),
        (Matmul, [(12, 20), (20, 3)]),  # not a matrix-vector product: still correct
    ],
    "conv2d": [
        (Conv, [(2, 3, 12, 12)]),
        # 61 output columns: register tiles of 32, 16, 8, 4 and 1 columns; 11 filters: a partial
        # tile of filters
        (functools.partial(Conv, (11, 5, 3, 3), padding=1), [(2, 5, 6, 61)]),
        (functools.partial(Conv, (8, 4, 3, 5), stride=2, dilation=(2, 1)), [(1, 4, 15, 40)]),
        # grouped: kbd-grouped-convs-as-convs, one conv per group (plain, strided, transposed)
        (functools.partial(Conv, (6, 2, 3, 3), groups=2), [(1, 4, 9, 20)]),
        (functools.partial(Conv, (8, 4, 3, 3), groups=2, stride=2, padding=1), [(2, 8, 17, 33)]),
        # 4 phases of 20 columns interleaved into rows of 80 (kbd-vector-copies)
        (functools.partial(Conv, (4, 6, 4, 4), transposed=True, stride=4), [(1, 4, 5, 20)]),
        (
            functools.partial(Conv, (4, 6, 3, 5), transposed=True, groups=2, stride=2),
            [(1, 4, 7, 9)],
        ),
        (functools.partial(Conv, (4, 5, 3, 3), transposed=True, stride=2), [(1, 4, 7, 9)]),
        (TwoConvs, [(2, 3, 10, 21)]),
        # three alike: one outlined function (kbd-outline-repeated-ops)
        (RepeatedConvs, [(2, 6, 10, 21), (6, 6, 3, 3), (6, 6, 3, 3), (6, 6, 3, 3), (4, 6, 1, 1)]),
        (functools.partial(ConvEpilogue, 2), [(2, 3, 9, 21)]),  # epilogues.yaml
        (ConvTanhScaleMaxPool, [(2, 3, 14, 21)]),  # the tanh vectorized apart from the pooling
        (functools.partial(PoolChain, True), [(2, 3, 17, 40)]),  # chained poolings after a conv
        # pointwise: over one image a matmul (kbd-pointwise-convs-as-matmuls), partial tiles,
        # padded (its border is the bias); over two, channels last
        (functools.partial(Conv, (20, 12, 1, 1), padding=1), [(1, 12, 5, 9)]),
        (functools.partial(Conv, (40, 24, 1, 1)), [(2, 24, 7, 7)]),
        # kbd-pad-conv-widths: rows of 30 computed as 32, of 18 (dilated) as 32
        (Conv, [(2, 3, 6, 32)]),
        (functools.partial(Conv, (5, 3, 3, 3), dilation=2, padding=1), [(1, 3, 7, 20)]),
        # channels last (kbd-convs-channels-last, conv2d-nhwc.mlir): rows of 7 and 20, 40 and
        # 32 filters (the last 8 a tile of their own), strided (no phases), 2 groups of 16
        (functools.partial(Conv, (40, 4, 3, 3)), [(2, 4, 9, 9)]),
        (functools.partial(Conv, (32, 3, 5, 5), stride=2, padding=2), [(2, 3, 21, 40)]),
        (functools.partial(Conv, (32, 4, 3, 3), groups=2, dilation=2), [(1, 8, 8, 11)]),
        (functools.partial(Conv, (6, 4, 3), padding=1), [(2, 4, 45)]),  # 1-D: 45 = 32 + 8 + 4 + 1
        (functools.partial(Conv, (6, 4, 3), stride=2, dilation=2), [(2, 4, 45)]),
        (functools.partial(Conv, (4, 6, 3), transposed=True, stride=3), [(2, 4, 15)]),
        # rows of 4 and 5 columns, too few positions for channels last: a gather of the taps
        # and a matmul (kbd-narrow-convs-as-matmuls), transposed to NCHW over two images;
        # strided and dilated (the gather's indexing only), 20 filters (a partial tile)
        (functools.partial(Conv, (32, 24, 3, 3), padding=1), [(2, 24, 4, 4)]),
        (functools.partial(Conv, (20, 6, 3, 3), stride=2, dilation=2, padding=2), [(1, 6, 10, 10)]),
        # strided: kbd-strided-convs-as-phases first (16 phases of 3x3; one phase of 1x1; three
        # taps gathered, dilation 4 and stride 3 coprime; a stride in one dim only; 3x3 taps
        # gathered)
        (functools.partial(Conv, (6, 3, 11, 11), stride=4, padding=2), [(2, 3, 40, 37)]),
        (functools.partial(Conv, (8, 4, 1, 1), stride=2), [(2, 4, 16, 15)]),
        (functools.partial(Conv, (6, 4, 3), stride=3, dilation=4), [(2, 4, 100)]),
        # 1-D and long: phased before the products (kbd-strided-conv1ds-as-phases), its taps
        # gathered, then a batch matmul (kbd-pointwise-convs-as-matmuls); a pointwise one too
        (functools.partial(Conv, (6, 4, 3), stride=3, dilation=4), [(2, 4, 800)]),
        (functools.partial(Conv, (6, 4, 1)), [(2, 4, 300)]),
        (functools.partial(Conv, (6, 4, 7, 7), stride=(2, 1), padding=3), [(1, 4, 20, 21)]),
        (functools.partial(Conv, (5, 4, 3, 3), stride=2, padding=1), [(2, 4, 17, 16)]),
        # depthwise (groups = channels): kbd-depthwise-convs-as-taps, then depthwise.mlir; a
        # partial width tile, padding, a stride, a dilation
        (functools.partial(Conv, (4, 1, 3, 3), groups=4), [(2, 4, 12, 40)]),
        (functools.partial(Conv, (6, 1, 3, 3), groups=6, padding=1), [(2, 6, 9, 37)]),
        (functools.partial(Conv, (6, 1, 3, 5), groups=6, stride=2), [(1, 6, 15, 41)]),
        (functools.partial(Conv, (4, 1, 3, 3), groups=4, dilation=(2, 1)), [(1, 4, 15, 70)]),
        # column stride: taps read contiguous copies of the input's column phases
        (functools.partial(Conv, (6, 1, 5, 5), groups=6, stride=2, padding=2), [(2, 6, 17, 33)]),
        (functools.partial(Conv, (4, 1, 3, 3), groups=4, stride=2, dilation=3), [(1, 4, 12, 41)]),
    ],
    "conv3d": [  # kbd-conv3d-as-conv2d, then the conv2d schedule
        (Conv3d, [(2, 3, 5, 9, 12)]),
        (ConvEpilogue, [(2, 3, 5, 9, 12)]),  # its transposes and epilogue: epilogues.yaml
        (ConvMeanKeepdim, [(2, 3, 5, 9, 12)]),  # a mean kept [N, C, 1, 1, 1]: its result's type
        (
            functools.partial(Conv3d, (6, 4, 3, 3, 3), padding=1, stride=(2, 1, 2)),
            [(1, 4, 7, 9, 17)],
        ),
        (functools.partial(Conv3d, (4, 2, 3, 1, 3), dilation=(2, 1, 1)), [(1, 2, 9, 5, 20)]),
        (functools.partial(Conv3d, (4, 3, 3, 3, 3), transposed=True, stride=2), [(1, 4, 3, 5, 6)]),
        (functools.partial(Conv3d, (6, 2, 1, 3, 3), groups=2), [(1, 4, 3, 6, 10)]),
        # a kernel one column wide: depths by flattened rows and columns, taps dilated by W
        (functools.partial(Conv3d, (8, 3, 3, 3, 1), stride=(2, 1, 1)), [(2, 3, 7, 6, 10)]),
        (
            functools.partial(Conv3d, (6, 3, 3, 2, 1), padding=1, dilation=(1, 2, 1)),
            [(1, 3, 5, 7, 9)],
        ),
        # channels last (conv2d-nhwc.mlir): rows of 8 columns, 16 and 32 filters, a dilated
        # depth; a transposed one (a padded input)
        (functools.partial(Conv3d, (16, 3, 3, 3, 3), dilation=(2, 1, 1)), [(2, 3, 7, 6, 10)]),
        (functools.partial(Conv3d, (16, 1, 3, 3, 3)), [(2, 1, 7, 6, 10)]),  # 3 channels < cl_c
        (functools.partial(Conv3d, (4, 32, 3, 3, 3), transposed=True), [(1, 4, 3, 5, 6)]),
        # kbd.worker.transposed_convs: by phases (8 of a 3x3x3 kernel at stride 2, each split
        # into its 2 groups); by phases of which some have no tap (dilation 2 at stride 2)
        (
            functools.partial(
                Conv3d,
                (4, 3, 3, 3, 3),
                transposed=True,
                groups=2,
                stride=2,
                padding=1,
                output_padding=1,
            ),
            [(1, 4, 3, 4, 5)],
        ),
        (
            functools.partial(Conv3d, (4, 3, 3, 3, 3), transposed=True, stride=2, dilation=2),
            [(1, 4, 3, 4, 5)],
        ),
        # rows of 2 x 21 columns: each phase's pair stored interleaved, 16 lanes and a masked 5
        # (kbd-vector-copies)
        (
            functools.partial(
                Conv3d,
                (4, 2, 3, 5, 7),
                transposed=True,
                groups=2,
                stride=2,
                padding=(1, 2, 3),
                output_padding=1,
            ),
            [(1, 4, 3, 4, 21)],
        ),
    ],
    "pooling": [  # kbd-poolings-as-taps, then pooling.mlir
        (pool(kernel_size=8, stride=1, padding=4, dilation=3), [(2, 3, 70)]),
        (pool(kernel_size=4, stride=1, padding=1), [(1, 4, 12, 45)]),
        # strided along the rows: the outer taps first, then the strided ones (separable)
        (pool(kernel_size=3, stride=2, padding=1), [(2, 3, 17, 40)]),
        (pool(kernel_size=3, stride=2, padding=1, dilation=3), [(1, 2, 12, 13, 40)]),
        (pool(kernel_size=(2, 3), stride=(1, 2), dilation=(2, 1)), [(1, 3, 9, 37)]),
        (pool(True, kernel_size=8, stride=1, padding=4), [(2, 3, 70)]),
        (pool(True, kernel_size=11), [(1, 2, 25, 37)]),
        (pool(True, kernel_size=3, stride=2, padding=1), [(1, 2, 9, 10, 40)]),
        # the divisor a tensor (counts without padding): not folded into the taps
        (pool(True, kernel_size=3, stride=2, padding=1, count_include_pad=False), [(1, 2, 9, 20)]),
        (PoolChain, [(2, 3, 17, 40)]),  # one pooling reads another's result
    ],
    "softmax": [  # rows.mlir: softmax, and the plain reductions it also handles
        (Softmax, [(8, 64)]),
        (Softmax, [(5, 37)]),
        (LogSoftmax, [(4, 100)]),
        (SumLast, [(6, 64)]),
        (SumLast, [(5, 37)]),
        (MaxMiddle, [(4, 33, 70)]),
        (SumMiddleKeepdim, [(3, 9, 130)]),
        (MeanMiddle, [(2, 16, 64)]),
    ],
    "reduction": [  # reduction.mlir
        (SumMiddleKeepdim, [(3, 9, 130)]),  # whole rows added into the result row
        (MaxMiddle, [(4, 33, 70)]),
        (MeanMiddle, [(2, 16, 64)]),
        (RmsNorm, [(2, 8, 5, 37)]),  # a 4-D middle-dim reduction, then the division
        (SumLast, [(5, 37)]),  # partial sums in registers
        (L2Norm, [(5, 300)]),
        (FrobeniusNorm, [(2, 3, 5, 7)]),
        (ArgmaxMiddle, [(3, 17, 40)]),  # the loop lowering inside each block
        (ArgminLast, [(4, 50)]),
        (HingeLoss, [(8, 16), (16,)]),  # a scalar from few elements: one sequential sum
        # a scalar from more than decompositions.BLOCK elements: row sums in blocks of their
        # own, then their sum
        (MseLoss, [(4, 20000), (4, 20000)]),
        (FrobeniusNorm, [(3, 4, 100, 70)]),  # rank-4 last-dim sums in blocks of their own
        (FourDimLoss, [(2, 3, 120, 100), (2, 3, 120, 100)]),
        (TripletMarginLoss, [(64, 300)] * 3),
        (CrossEntropy, [(6, 70)]),  # kbd's decomposition: row reductions, no log-softmax
        (functools.partial(CrossEntropy, ignore_index=3), [(6, 70)]),
    ],
    "norm": [  # norm.mlir, on the norms as kbd.worker.norms decomposes them
        (LayerNorm, [(3, 5, 33)]),
        (LongLayerNorm, [(2, 3 * 65536)]),
        (GroupNorm, [(2, 8, 5, 7)]),
        (GroupNorm, [(3, 8, 64)]),
        (InstanceNorm, [(2, 4, 6, 16)]),
        (BatchNorm, [(2, 4, 5, 9)]),
    ],
}


DTYPES = {"f32": np.float32, "i64": np.int64}  # result element types of the cases


def family_schedules() -> list[tuple[Path, str | None, str]]:
    """(descriptor, feature or None, family) of every schedules/x86_64/[feature/]family/f32.yaml."""
    found = []
    for path in sorted((SCHEDULES / "x86_64").glob("**/f32.yaml")):
        parts = path.relative_to(SCHEDULES / "x86_64").parts
        feature = parts[0] if len(parts) == 3 else None
        found.append((path, feature, parts[-2]))
    return found


def test_every_family_has_cases_and_every_feature_is_known():
    for _, feature, family in family_schedules():
        assert family in CASES
        assert feature is None or feature in target.LLVM_FEATURES


def lower(path: Path, module_class, shapes):
    torch.manual_seed(0)
    args = [torch.randn(shape) for shape in shapes]
    module = mlir.import_model(module_class(), args)
    out_types, _ = mlir.results_to_out_params(module)
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    for stage in stages:
        mlir.apply_stage(module, stage)
    assert runtime.uses_openmp(stages)  # blocks run as parallel loops
    return module, args, out_types


@pytest.mark.parametrize(
    ("path", "feature", "family"),
    family_schedules(),
    ids=[str(p.relative_to(SCHEDULES)) for p, _, _ in family_schedules()],
)
def test_family_schedule(path, feature, family, tmp_path):
    for module_class, shapes in CASES[family]:
        module, args, out_types = lower(path, module_class, shapes)
        if ARCH == "x86_64" and (feature is None or feature in HOST_FEATURES):
            compiled = mlir.Compiled(module, 3, openmp=True)
            outputs = [np.zeros(t.dims, DTYPES[t.dtype]) for t in out_types]
            compiled([*outputs, *ingress.buffers_from_args(args)])
            expected = module_class()(*args).detach().numpy()
            np.testing.assert_allclose(outputs[0], expected, rtol=1e-4, atol=1e-4)
        else:
            mlir.set_target_features(module, target.LLVM_FEATURES.get(feature, ()))
            compiled = mlir.Compiled(module, 3, openmp=True)
            compiled.write_object(tmp_path / "kernel.o")
            assert (tmp_path / "kernel.o").stat().st_size > 0


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump")
def test_avx512_schedule_compiles_to_zmm_code_on_any_x86_host(tmp_path):
    path = SCHEDULES / "x86_64" / "avx512f" / "matmul" / "f32.yaml"
    module, _, _ = lower(path, Matmul, [(64, 64), (64, 64)])
    mlir.set_target_features(module, target.LLVM_FEATURES["avx512f"])
    mlir.Compiled(module, 3, openmp=True).write_object(tmp_path / "kernel.o")
    assembly = subprocess.run(
        ["objdump", "-d", str(tmp_path / "kernel.o")], capture_output=True, text=True, check=True
    ).stdout
    assert "vfmadd" in assembly and "zmm" in assembly


def test_a_family_schedule_runs_in_a_sandboxed_worker_with_two_threads(tmp_path):
    """The worker loads the OpenMP runtime for a pipeline that lowers to it (2 pinned cores)."""
    schedule = SCHEDULES / "x86_64" / "matmul" / "f32.yaml"
    args = fixture_args("level1/1_", "level1/2_", "--pipeline", str(schedule), "-j", "1", "--json")
    result = kbd("run", *args, cwd=tmp_path)
    records = json_records(result.stdout)
    assert records["level1/1_matmul"]["outcome"] == "pass", result.stderr
    assert records["level1/2_relu_scale"]["outcome"] == "pass", result.stderr
    assert records["level1/1_matmul"]["pipeline"] == str(schedule)


def test_matmul_blocks_are_guided_parallel_loops_that_fill_their_own_output_tile():
    """Each M,N block of the matmul schedule initializes its output tile inside the parallel
    loop (not one thread filling the whole output first), and the loop has a guided schedule
    (kbd-openmp-guided-schedule): a thread done with its blocks takes the next ones."""
    torch.manual_seed(0)
    args = [torch.randn(512, 512), torch.randn(512, 512)]
    module = mlir.import_model(Matmul(), args)
    mlir.results_to_out_params(module)
    path = SCHEDULES / "x86_64" / "matmul" / "f32.yaml"
    for stage in descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/")):
        mlir.apply_stage(module, stage)
        if stage.text == "kbd-openmp-guided-schedule":
            break
    text = str(module)
    loops = [line.strip() for line in text.splitlines() if "omp.wsloop" in line]
    assert loops and all(line.startswith("omp.wsloop schedule(guided)") for line in loops)
    assert text.count("linalg.fill") == 1 and text.index("omp.wsloop") < text.index("linalg.fill")


def _threads_cpu_ns() -> dict[str, int]:
    """On-CPU time (ns, /proc schedstat) of each thread of this process but the main one."""
    found = {}
    for tid in os.listdir("/proc/self/task"):
        if tid != str(os.getpid()):
            with contextlib.suppress(FileNotFoundError):  # a thread that just ended
                found[tid] = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
    return found


@pytest.mark.skipif(
    ARCH != "x86_64" or len(os.sched_getaffinity(0)) < 2 or not runtime.OPENMP_LIBRARY.is_file(),
    reason="needs 2 cores of an x86_64 CPU and intel-openmp",
)
def test_openmp_threads_sleep_right_after_a_parallel_kernel():
    """After a family schedule's parallel loop, its OpenMP thread stops spinning within
    OPENMP_BLOCKTIME_MS: the runtime's default spins 200 ms, taking a core from whatever runs
    next (in a benchmark, eager's threads)."""
    arch, flags = descriptor.host_target()
    path = descriptor.find_pipeline(
        "matmul", "f32", schedules_dir=SCHEDULES, arch=arch, features=target.ranked(flags)
    )
    module, args, out_types = lower(path, Matmul, [(256, 256), (256, 256)])
    compiled = mlir.Compiled(module, 3, openmp=True)
    buffers = [np.zeros(out_types[0].dims, np.float32), *ingress.buffers_from_args(args)]
    compiled(buffers)  # starts the OpenMP thread
    time.sleep(0.05)  # threads torch started (lower() ran eager) stop spinning too
    openmp = ctypes.CDLL(str(runtime.OPENMP_LIBRARY))
    assert openmp.kmp_get_blocktime() == runtime.OPENMP_BLOCKTIME_MS
    compiled(buffers)
    before = _threads_cpu_ns()
    time.sleep(0.2)
    spun = {t: ns - before.get(t, 0) for t, ns in _threads_cpu_ns().items()}
    assert max(spun.values()) < 20e6, spun  # with the default: ~200 ms (~100 ms on a busy CPU)


# One run of the fixture kernels below serves the tests of family schedules run by kbd (each run
# starts a worker template: seconds of torch import). x86_64 adds the kernels whose schedules are
# x86_64's: the norm of a group norm and a layer norm, and a softmax returned with a log-softmax.
FAMILY_RUN = [
    ("level1/1_matmul", "[32x48, 48x16]", "[rnd, rnd]", None, "matmul"),
    # a family no schedule exists for (made up): the scalar pipeline, and the record says so
    ("level1/2_relu_scale", "[8x64, 2.5]", "[randn, scalar]", None, "unscheduled"),
    ("level1/4_conv2d", "[2x3x12x12]", "[rnd]", "[3, 4, 3]", "conv2d"),
    ("level1/9_linear_relu", "[8x40]", "[rnd]", "[40, 24]", "matmul"),
]
FAMILY_RUN_X86 = [
    ("level1/8_group_layer_norm", "[3x8x5x7]", "[randn]", "[8, 2, 5, 7]", "norm"),
    ("level1/10_softmax_log_softmax", "[16x100]", "[randn]", None, "softmax"),
]


def _fixture_kernel(kernel: str):
    spec = importlib.util.spec_from_file_location("fixture", FIXTURE_KB / f"{kernel}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def family_run(tmp_path_factory):
    """`kbd run` (default `--schedules family`) of FAMILY_RUN with every stage's IR printed:
    (records by kernel, printed IR by kernel as `// -----// ` sections, stderr)."""
    tmp_path = tmp_path_factory.mktemp("family-run")
    entries = FAMILY_RUN + (FAMILY_RUN_X86 if ARCH == "x86_64" else [])
    text = ""
    for kernel, shapes, initializations, init_args, family in entries:
        text += f"- kernel: {kernel}.py\n  input_shapes: {shapes}\n"
        text += f"  initializations: {initializations}\n  family: {family}\n"
        text += f"  init_args: {init_args}\n" if init_args else ""
    (tmp_path / "levels.yaml").write_text(text)
    args = ["--kernelbench", str(FIXTURE_KB), "--levels", str(tmp_path / "levels.yaml")]
    args += ["-j", "1", "--json", "--print-original-module", "--print-mlir-after-all"]
    result = kbd("run", *args, "--print-to", str(tmp_path / "ir") + "/", cwd=tmp_path)
    records = json_records(result.stdout)
    assert sorted(records) == sorted(kernel for kernel, *_ in entries), result.stderr
    dumps = {
        kernel: (tmp_path / "ir" / f"{kernel.replace('/', '__')}.mlir")
        .read_text()
        .split("// -----// ")[1:]
        for kernel in records
    }
    return records, dumps, result.stderr


def test_a_kernel_runs_its_family_schedule_and_the_record_names_it(family_run):
    """An entry's generated family picks its schedule through the finder (ranked host features);
    a family without a schedule for this CPU runs the scalar pipeline, and the record says so.
    On x86_64, the fixture's group norm and layer norm make its graph's family `norm`, whose
    schedule (norm.mlir on kbd's norm decompositions) the kernel runs and passes with."""
    records, _, stderr = family_run
    assert [r["outcome"] for r in records.values()] == ["pass"] * len(records), stderr
    arch, flags = descriptor.host_target()
    for kernel, family in [("level1/1_matmul", "matmul"), ("level1/4_conv2d", "conv2d")]:
        found = descriptor.find_pipeline(
            family, "f32", schedules_dir=SCHEDULES, arch=arch, features=target.ranked(flags)
        )
        assert records[kernel]["pipeline"] == str(found.relative_to(SCHEDULES))
    assert records["level1/2_relu_scale"]["pipeline"].startswith(
        "scalar-lowering.yaml (no unscheduled f32 schedule for "
    )
    if ARCH == "x86_64":
        kernel = _fixture_kernel("level1/8_group_layer_norm")
        model = kernel.Model(*kernel.get_init_inputs())
        assert families.family_of(model, kernel.get_inputs()) == "norm"
        assert records["level1/8_group_layer_norm"]["pipeline"] == "x86_64/norm/f32.yaml"


def test_a_one_batch_product_and_a_unit_dim_transpose_become_a_matmul_and_reshapes():
    """kbd-unit-dims-as-reshapes: the einsum's batch matmul of one batch becomes the
    linalg.matmul the matmul schedule tiles (with a fill of its own, which the schedule fuses),
    and the transpose that only moves a unit dim is no copy; a real batch matmul and a real
    transpose are left alone."""
    stage = descriptor.resolve_pipeline(
        ["kbd-unit-dims-as-reshapes"], schedules_dir=SCHEDULES, cwd=Path("/")
    )[0]
    args = [torch.randn(2, 3, 5, 24), torch.randn(24, 40)]
    module = mlir.import_model(TensorMatrixEinsum(), args)
    before = str(module)
    assert "linalg.batch_matmul" in before and "linalg.transpose" in before
    mlir.apply_stage(module, stage)
    after = str(module)
    assert "linalg.batch_matmul" not in after and "linalg.transpose" not in after
    assert "linalg.matmul" in after and "linalg.fill" in after
    assert "tensor<30x24xf32>, tensor<24x40xf32>) outs(" in after

    class Transposes(torch.nn.Module):
        def forward(self, a, b):
            return torch.bmm(a, b).transpose(1, 2)

    module = mlir.import_model(Transposes(), [torch.randn(2, 4, 8), torch.randn(2, 8, 3)])
    mlir.apply_stage(module, stage)
    assert "linalg.batch_matmul" in str(module) and "linalg.transpose" in str(module)


def test_a_batch_matmul_against_one_shared_matrix_becomes_one_matmul():
    """kbd-shared-b-batch-matmuls-as-matmuls: a batch matmul whose B is one matrix copied into
    every batch becomes one matmul of the batches' rows stacked, reading the matrix itself (no
    copies); a batch matmul with a B per batch is left alone."""
    stage = descriptor.resolve_pipeline(
        ["kbd-shared-b-batch-matmuls-as-matmuls"], schedules_dir=SCHEDULES, cwd=Path("/")
    )[0]
    module = mlir.import_model(SharedWeightBmm(), [torch.randn(4, 5, 24), torch.randn(40, 24)])
    assert "linalg.batch_matmul" in str(module)
    mlir.apply_stage(module, stage)
    after = str(module)
    assert "linalg.batch_matmul" not in after and "tensor<4x24x40xf32>" not in after
    assert "ins(%collapsed, %transposed : tensor<20x24xf32>, tensor<24x40xf32>)" in after

    class Bmm(torch.nn.Module):
        def forward(self, a, b):
            return torch.bmm(a, b)

    module = mlir.import_model(Bmm(), [torch.randn(4, 5, 24), torch.randn(4, 24, 40)])
    mlir.apply_stage(module, stage)
    assert "linalg.batch_matmul" in str(module)


def test_float_arithmetic_may_be_contracted_into_fused_multiply_adds():
    """kbd-contract-float-arithmetic marks every float add, subtract and multiply `contract`
    (LLVM may fuse a multiply into the add that uses it), keeping flags already there; the
    common LLVM lowering runs it."""
    assert "kbd-contract-float-arithmetic" in (SCHEDULES / "llvm-lowering.yaml").read_text()
    stage = descriptor.resolve_pipeline(
        ["kbd-contract-float-arithmetic"], schedules_dir=SCHEDULES, cwd=Path("/")
    )[0]
    with ir.Context():
        module = ir.Module.parse(
            """
            func.func @f(%a: vector<16xf32>, %b: vector<16xf32>, %c: f32, %d: f32)
                -> (vector<16xf32>, f32) {
              %p = arith.mulf %a, %b : vector<16xf32>
              %s = arith.addf %p, %a fastmath<nnan> : vector<16xf32>
              %q = arith.mulf %c, %d : f32
              %r = arith.subf %q, %c : f32
              return %s, %r : vector<16xf32>, f32
            }
            """
        )
        mlir.apply_stage(module, stage)
        text = str(module)
    assert text.count("fastmath<contract>") == 3 and "fastmath<nnan,contract>" in text


@pytest.mark.parametrize(
    ("conv", "shape", "rewritten"),
    [
        # 11x11, stride 4: 4 x 4 phases of 3 input channels, a 3x3 kernel at dilation 1
        (functools.partial(Conv, (6, 3, 11, 11), stride=4), (1, 3, 39, 39), "tensor<6x48x3x3xf32>"),
        # 1x1, stride 2: the input subsampled, one phase
        (functools.partial(Conv, (8, 4, 1, 1), stride=2), (1, 4, 16, 15), "tensor<8x4x1x1xf32>"),
        # dilation 4, a multiple of stride 2: one phase, dilation 2
        (functools.partial(Conv, (6, 4, 3), stride=2, dilation=4), (2, 4, 50), "tensor<6x4x3xf32>"),
        # dilation 4, stride 3: phases 0, 1, 2 with offsets 0, 1, 2 would be 9 slots for 3
        # taps; each tap's rows are gathered instead, a kernel of size 1
        (
            functools.partial(Conv, (6, 4, 3), stride=3, dilation=4),
            (2, 4, 50),
            "tensor<6x12x1xf32>",
        ),
        # 3x3, stride 2: 2 phases of 2 taps per dim would be 16 slots for 9: gathered
        (functools.partial(Conv, (5, 4, 3, 3), stride=2), (1, 4, 17, 16), "tensor<5x36x1x1xf32>"),
        # 7x7, stride 2 in one dim: 2 phases of 4 taps there (8 slots for 7), 7 taps in the other
        (
            functools.partial(Conv, (5, 4, 7, 7), stride=(2, 1)),
            (1, 4, 20, 21),
            "tensor<5x8x4x7xf32>",
        ),
    ],
)
def test_a_strided_convolution_becomes_a_stride_one_convolution_over_phases(conv, shape, rewritten):
    """kbd-strided-convs-as-phases leaves no strided convolution, and the new one's kernel has
    the input channels times the phases used; a stride-1 convolution is left alone."""
    stage = descriptor.resolve_pipeline(
        ["kbd-strided-convs-as-phases"], schedules_dir=SCHEDULES, cwd=Path("/")
    )[0]
    module = mlir.import_model(conv(), [torch.randn(shape)])
    assert "strides = dense<1>" not in str(module)
    mlir.apply_stage(module, stage)
    text = str(module)
    conv_line = next(line for line in text.splitlines() if "linalg.conv_" in line)
    assert "strides = dense<1>" in conv_line and rewritten in conv_line

    module = mlir.import_model(Conv((4, 3, 3, 3)), [torch.randn(1, 3, 9, 9)])
    before = str(module)
    mlir.apply_stage(module, stage)
    assert str(module) == before


def conv2d_products(feature, module, rewrite: str, before: str) -> tuple[str, Stage]:
    """Apply the conv2d schedule (`feature`'s, or AVX2's for None) to `module` up to its
    matmul.mlir stage, which must leave no matmul; `rewrite` must come before the stage named
    `before`. Returns the module's text after `rewrite`, and that stage."""
    path = SCHEDULES / "x86_64" / (feature or "") / "conv2d" / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    names = [stage.text for stage in stages]
    assert names.index(rewrite) < names.index(before)
    found = None
    for stage in stages:
        mlir.apply_stage(module, stage)
        if stage.text == rewrite:
            found = str(module), stage
        if stage.name == "matmul.mlir":
            assert "linalg.matmul" not in str(module)
            assert found is not None
            return found
    raise AssertionError("the conv2d schedule has no matmul.mlir stage")


@pytest.mark.parametrize("feature", [None, "avx512f"])
def test_a_pointwise_convolution_of_one_image_becomes_a_matmul(feature):
    """kbd-pointwise-convs-as-matmuls, before the channels-last rewrite: a 1 x 1 convolution
    over one image of 7 x 7 becomes a matmul of its [40, 24] kernel and the image as [24, 49]
    (no transpose, no copy of the input) onto its bias, which the matmul schedule then leaves
    no matmul of; over two images, or strided, it stays a convolution."""
    module = mlir.import_model(Conv((40, 24, 1, 1)), [torch.randn(1, 24, 7, 7)])
    text, stage = conv2d_products(
        feature, module, "kbd-pointwise-convs-as-matmuls", "kbd-convs-channels-last"
    )
    assert "linalg.conv_2d" not in text and "linalg.transpose" not in text
    products = [line for line in text.splitlines() if "linalg.matmul" in line]
    assert len(products) == 1
    assert "tensor<40x24xf32>, tensor<24x49xf32>" in products[0]
    assert re.search(r"linalg.broadcast .* outs\(\S+ : tensor<40x49xf32>", text)
    for others in (Conv((40, 24, 1, 1)), Conv((40, 24, 1, 1), stride=2)):
        kept = mlir.import_model(others, [torch.randn(2, 24, 7, 7)])
        mlir.apply_stage(kept, stage)
        assert "linalg.conv_2d_nchw_fchw" in str(kept)


@pytest.mark.parametrize("feature", [None, "avx512f"])
def test_a_convolution_with_narrow_rows_becomes_a_product_over_its_gathered_taps(feature):
    """kbd-narrow-convs-as-matmuls, with the products: a 3 x 3 convolution with rows of 4
    columns over two images (32 positions: too few to pay for channels last's copy of the
    kernel) becomes a gather of its taps [C * 9, N * 16], a matmul of the kernel as [F, C * 9]
    (a view) onto its bias, and a transpose to NCHW (a reshape over one image), and the matmul
    schedule leaves no matmul; wide rows, positions too few to fill vectors, and positions
    enough for channels last stay convolutions."""
    module = mlir.import_model(Conv((32, 24, 3, 3), padding=1), [torch.randn(2, 24, 4, 4)])
    text, stage = conv2d_products(
        feature, module, "kbd-narrow-convs-as-matmuls", "kbd-outline-repeated-ops"
    )
    assert "linalg.conv_2d" not in text
    products = [line for line in text.splitlines() if "linalg.matmul" in line]
    assert len(products) == 1
    assert "tensor<32x216xf32>, tensor<216x32xf32>" in products[0]
    assert re.search(r"linalg.broadcast .* outs\(\S+ : tensor<32x32xf32>", text)
    assert "permutation = [1, 0, 2, 3]" in text
    one = mlir.import_model(Conv((40, 24, 3, 3), stride=2), [torch.randn(1, 24, 11, 11)])
    mlir.apply_stage(one, stage)
    assert "linalg.conv_2d" not in str(one) and "linalg.transpose" not in str(one)
    assert "tensor<40x216xf32>, tensor<216x25xf32>" in str(one)
    # rows of 32; 4 positions; 98 positions (channels last)
    for shape in [(2, 24, 7, 34), (1, 24, 4, 4), (2, 24, 9, 9)]:
        kept = mlir.import_model(Conv((40, 24, 3, 3)), [torch.randn(shape)])
        mlir.apply_stage(kept, stage)
        assert "linalg.conv_2d_nchw_fchw" in str(kept)


def test_a_grouped_convolution_becomes_one_convolution_per_group():
    stage = descriptor.resolve_pipeline(
        ["kbd-grouped-convs-as-convs"], schedules_dir=SCHEDULES, cwd=Path("/")
    )[0]
    module = mlir.import_model(Conv((6, 2, 3, 3), groups=3), [torch.randn(1, 6, 9, 20)])
    assert "linalg.conv_2d_ngchw_gfchw" in str(module)
    mlir.apply_stage(module, stage)
    text = str(module)
    assert "linalg.conv_2d_ngchw_gfchw" not in text
    assert text.count("linalg.conv_2d_nchw_fchw") == 3


def test_a_depthwise_convolution_becomes_a_vectorized_sum_over_its_taps():
    """kbd-depthwise-convs-as-taps turns a depthwise convolution into one element-wise generic
    over its 9 taps (marked kbd.depthwise); depthwise.mlir leaves no generic of it and computes
    it in vector arithmetic."""
    path = SCHEDULES / "x86_64" / "conv2d" / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    module = mlir.import_model(Conv((4, 1, 3, 3), groups=4), [torch.randn(1, 4, 10, 40)])
    assert "linalg.depthwise_conv_2d_nchw_chw" in str(module)
    for stage in stages:
        mlir.apply_stage(module, stage)
        text = str(module)
        if stage.text == "kbd-depthwise-convs-as-taps":
            assert "linalg.depthwise_conv_2d_nchw_chw" not in text
            generic = next(line for line in text.splitlines() if "kbd.depthwise" in line)
            assert generic.count("tensor<1x4x8x38xf32>") == 9 + 1  # 9 taps, and the output
        if stage.name == "depthwise.mlir":
            assert "kbd.depthwise" not in text
            assert re.search(r"arith\.mulf .* : vector<16xf32>", text)  # AVX2: 16 columns
            break
    else:
        raise AssertionError("the conv2d schedule has no depthwise.mlir stage")


def test_a_depthwise_convolutions_column_stride_reads_contiguous_phases():
    """With a column stride of 2, kbd-depthwise-convs-as-taps copies the input's two column
    phases once (contiguous, as wide as the taps read them) and every tap reads a phase with
    unit column stride: no tap gathers every other column."""
    stage = descriptor.resolve_pipeline(
        ["kbd-depthwise-convs-as-taps"], schedules_dir=SCHEDULES, cwd=Path("/")
    )[0]
    module = mlir.import_model(Conv((4, 1, 3, 3), groups=4, stride=2), [torch.randn(1, 4, 11, 41)])
    mlir.apply_stage(module, stage)
    text = str(module)
    copies = re.findall(r"materialize_in_destination .* tensor<1x4x11x(\d+)xf32>", text)
    assert sorted(copies) == ["20", "21"]  # 20 output columns; phase 0 read at offsets 0 and 1
    taps = [
        line
        for line in text.splitlines()
        if "tensor.extract_slice" in line and "to tensor<1x4x5x20xf32>" in line
    ]
    assert len(taps) == 9 and all("[1, 1, 2, 1]" in line for line in taps)


def test_a_convolutions_epilogue_and_copies_become_vector_code_in_parallel_rows():
    """After the conv3d schedule, its output's transpose and epilogue (bias, GELU, sigmoid,
    scaling, clamp) are one fused generic, marked kbd.rank like the copies around the
    convolution, and parallel-generics.mlir leaves no linalg op: vector erf and exp in an
    scf.forall, nothing for the loop lowering."""
    path = SCHEDULES / "x86_64" / "conv3d" / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    module = mlir.import_model(ConvEpilogue(), [torch.randn(2, 3, 5, 9, 12)])
    for stage in stages:
        mlir.apply_stage(module, stage)
        text = str(module)
        if stage.text == "kbd-mark-parallel-generics":
            # one generic for the output's transpose and the whole epilogue; the input's 3
            # depth taps, each copied into its slot of the stacked input [OD, N, C, KD, H, W]
            # (zeros first: its rows are padded from 12 columns to 18, for output rows of 16);
            # the conv's bias broadcast made afresh for its [N * OD, F, OH, OW] output
            assert text.count("kbd.rank = 5 : i64") == 1
            assert text.count("kbd.rank = 6 : i64") == 1 + 3
            assert text.count("kbd.rank = 4 : i64") == 1
            assert "tensor<3x2x3x3x9x18xf32>" in text
            result = r"outs\(%\w+ : tensor<2x6x3x7x10xf32>\) attrs = +\{kbd.rank"
            assert len(re.findall(result, text)) == 1
            assert text.count("math.erf") == text.count("math.exp") == 1
        if stage is _last_parallel_generics(stages):
            break
    else:
        raise AssertionError("the conv3d schedule has no parallel-generics.mlir stage")
    assert "linalg." not in text
    assert re.search(r"math\.erf .* : vector<[0-9x]*16xf32>", text)
    assert re.search(r"math\.exp .* : vector<[0-9x]*16xf32>", text)


def _last_parallel_generics(stages):
    """The last parallel-generics.mlir stage of a pipeline (epilogues.yaml has two)."""
    return [stage for stage in stages if stage.name == "parallel-generics.mlir"][-1]


class ConvGeluMean(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = Conv((6, 3, 3, 3))

    def forward(self, x):
        return F.gelu(self.conv(x)).mean((2, 3))


@pytest.mark.parametrize(
    ("model", "shape", "function"),
    [
        # GELU before a global average pool
        (ConvGeluMean, (2, 3, 9, 21), "math.erf"),
        # tanh, then a scaling and a bias (element-wise ops between), before a max pooling
        (ConvTanhScaleMaxPool, (2, 3, 14, 21), "math.tanh"),
    ],
    ids=["gelu-mean", "tanh-scale-bias-maxpool"],
)
def test_an_activation_a_reduction_reads_is_vectorized_and_not_fused_into_it(
    model, shape, function
):
    """kbd-mark-reduction-inputs: a math function whose result a reduction reads, directly or
    through other element-wise ops, is vectorized on its own before fusion, which would move it
    into the reduction's scalar loop (a libm call per element). CASES checks the results."""
    path = SCHEDULES / "x86_64" / "conv2d" / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    module = mlir.import_model(model(), [torch.randn(shape)])
    for stage in stages:
        mlir.apply_stage(module, stage)
        if stage is _last_parallel_generics(stages):
            break
    calls = [line for line in str(module).splitlines() if function in line]
    assert calls and all(re.search(r": vector<[0-9x]*16xf32>", line) for line in calls)


class ConvNormMean(torch.nn.Module):
    """level 2's conv3d, group norm, then a mean over the volume."""

    def __init__(self):
        super().__init__()
        self.conv = Conv3d((8, 3, 3, 3, 3))
        self.norm = torch.nn.GroupNorm(2, 8)

    def forward(self, x):
        return self.norm(self.conv(x)).mean((2, 3, 4))


def _largest_reduction_input(module) -> int:
    """How many elements the largest input of a `linalg.generic` with a reduction has."""
    largest = 0
    with module.context:

        def visit(op):
            nonlocal largest
            if op.name == "linalg.generic" and "reduction" in str(op.attributes["iterator_types"]):
                for value in op.operands:
                    if isinstance(value.type, ir.RankedTensorType):
                        largest = max(largest, int(np.prod(value.type.shape)))
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
    return largest


def _row_blocks(module) -> list[str]:
    """The text of every scf.forall that reduction.mlir vectorizes (marked kbd.rows)."""
    blocks = []

    def visit(op):
        if op.name == "scf.forall" and "kbd.rows" in op.attributes:
            blocks.append(str(op))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return blocks


def _up_to_reduction(module_class, shapes):
    """The module after the batch_matmul schedule's stages up to reduction.mlir's."""
    path = SCHEDULES / "x86_64" / "batch_matmul" / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    module = mlir.import_model(module_class(), [torch.randn(shape) for shape in shapes])
    for stage in stages:
        mlir.apply_stage(module, stage)
        if stage.name == "reduction.mlir":
            return module
    raise AssertionError("the batch_matmul schedule has no reduction.mlir stage")


def test_a_softmax_between_products_is_computed_one_row_at_a_time():
    """epilogues.yaml: the softmax between an attention's two products (rows of 64 scores) is
    one parallel loop over rows, with its max, exp, sum and division in each row, instead of a
    pass over the scores per op; the repeated products stay outlined calls, and no copy of a
    call is left inside the rows (each would compute the whole product again)."""
    module = _up_to_reduction(TwoAttentionLayers, [(2, 64, 48), (48, 48), (48, 48), (48, 48)])
    softmaxes = [
        block
        for block in _row_blocks(module)
        if all(op in block for op in ("maximumf", "math.exp", "arith.divf"))
    ]
    assert len(softmaxes) == 2  # one per layer
    assert not any("func.call" in block for block in softmaxes)
    assert "call @kbd_outlined_" in str(module)


def test_a_short_row_is_not_chained():
    """Rows of 20 scores (not a multiple of 64) keep the separate vectorized epilogue ops:
    their masked row vectors would not lower inside a parallel loop."""
    module = _up_to_reduction(SelfAttentionHeads, [(2, 20, 40), (24, 40), (24, 40), (24, 40)])
    assert not any(
        all(op in block for op in ("maximumf", "arith.divf")) for block in _row_blocks(module)
    )


def _attention_stages(feature):
    path = SCHEDULES / "x86_64" / (feature or "") / "batch_matmul" / "f32.yaml"
    return descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))


@pytest.mark.parametrize("feature", [None, "avx512f"])
def test_a_long_attention_is_computed_one_block_of_queries_at_a_time(feature):
    """attention.mlir: over 512 tokens (512 x 512 scores per head), the product with V is an
    scf.forall over blocks of query rows with the scores' product and the softmax fused into
    each block, the softmax one row at a time: no op has the whole score matrix as its result
    (before, each op of the chain was a pass over it)."""
    module = mlir.import_model(
        SelfAttentionHeads(), [torch.randn(1, 512, 64), *(torch.randn(64, 64) for _ in range(3))]
    )
    whole_scores = "-> tensor<2x512x512xf32>"
    assert whole_scores in str(module)
    for stage in _attention_stages(feature):
        mlir.apply_stage(module, stage)
        if stage.text == "kbd-mark-attention":
            marked = str(module)
            for mark in ("kbd.attention}", "kbd.attention_scores", "kbd.attention_rows"):
                assert marked.count(mark) == 1, mark
        if stage.name == "reduction.mlir":
            break
    text = str(module)
    assert whole_scores not in text
    [rows] = [block for block in _row_blocks(module) if "math.exp" in block]
    assert "arith.divf" in rows and "vector.multi_reduction" not in rows
    assert "linalg.batch_matmul" not in text  # both products vectorized in each block


def test_a_short_attention_keeps_its_whole_scores():
    """64 tokens (64 x 64 scores, in the cache whole): nothing is marked, and the softmax is
    the row chain between the two products, as before."""
    module = mlir.import_model(
        SelfAttentionHeads(), [torch.randn(1, 64, 64), *(torch.randn(64, 64) for _ in range(3))]
    )
    for stage in _attention_stages("avx512f"):
        mlir.apply_stage(module, stage)
        if stage.text == "kbd-mark-attention":
            assert "kbd.attention" not in str(module)
            break


def test_a_blocked_attention_passes_against_eager(tmp_path):
    """The fixture's self-attention over 512 tokens, two heads, through `kbd run` with its
    family schedule: the blocked attention is what runs (the pipeline holds attention.mlir and
    the kernel's scores are never whole), and it passes its check against eager."""
    (tmp_path / "levels.yaml").write_text(
        "- kernel: level1/12_self_attention.py\n  family: batch_matmul\n"
    )
    args = ["--kernelbench", str(FIXTURE_KB), "--levels", str(tmp_path / "levels.yaml")]
    args += ["--json", "--print-mlir-after-all", "--print-to", str(tmp_path / "ir") + "/"]
    result = kbd("run", *args, cwd=tmp_path)
    [record] = json_records(result.stdout).values()
    assert record["outcome"] == "pass", result.stdout + result.stderr
    dump = (tmp_path / "ir" / "level1__12_self_attention.mlir").read_text()
    after = dump.split("IR Dump After transform attention.mlir")[1].split("// -----//")[0]
    assert "scf.forall" in after and "-> tensor<2x512x512xf32>" not in after


def test_a_norm_and_mean_after_a_convolution_are_vectorized_reductions():
    """epilogues.yaml: kbd-collapse-reduction-dims makes the mean over 3 trailing dims one over
    their product, the norm's statistics it reads ([N, C, 1, 1, 1] at (n, c, 0, 0, 0)) as
    [N, C], and reduction.mlir leaves no reduction over the conv's output (2 x 8 x 4 x 6 x 8
    values) to the loop lowering, nor the normalization in the mean's tiles: only the group
    statistics' combine step."""
    path = SCHEDULES / "x86_64" / "conv3d" / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    module = mlir.import_model(ConvNormMean(), [torch.randn(2, 3, 6, 8, 10)])
    for stage in stages:
        mlir.apply_stage(module, stage)
        if stage.text == "kbd-collapse-reduction-dims":
            # the mean: [N, C, D * H * W] with one reduction
            assert re.search(
                r"iterator_types = \[\"parallel\", \"parallel\", \"reduction\"\]\}"
                r" ins\([^)]*tensor<2x8x192xf32>",
                str(module),
            )
            assert _largest_reduction_input(module) == 2 * 8 * 192
            assert not re.search(r"-> \([^)]*, 0, 0\)>", str(module))  # no unit dims read at 0
        if stage.name == "reduction.mlir":
            break
    else:
        raise AssertionError("the conv3d schedule has no reduction.mlir stage")
    assert _largest_reduction_input(module) <= 2 * 8
    assert str(module).count("linalg.generic") == 1  # the combine step; the mean's tiles vectorized


def test_narrow_rows_with_many_filters_are_computed_channels_last():
    """kbd-conv3d-as-conv2d stacks a conv3d's input channels last when its rows are narrow and
    its filters fill whole vectors, and conv2d-nhwc.mlir vectorizes it along the filters."""

    def picks(width, filters, positions, copied=True):
        return conv_widths.channels_last(width, filters, positions, input_copied=copied)

    assert picks(20, 64, 1000) and picks(8, 16, 400)
    assert not picks(30, 64, 1000)  # rows padded to 32: whole vectors
    assert not picks(20, 3, 1000)  # 3 filters: 3 lanes of 16
    assert not picks(2, 512, 4, False)  # each weight used 4 times: not worth its copy
    assert picks(7, 512, 98, False) and not picks(7, 512, 98)  # a copy's rows are padded to 16
    path = SCHEDULES / "x86_64" / "avx512f" / "conv3d" / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    module = mlir.import_model(Conv3d((16, 3, 3, 3, 3)), [torch.randn(2, 3, 7, 6, 10)])
    for stage in stages:
        mlir.apply_stage(module, stage)
        text = str(module)
        if stage.text == "kbd-conv3d-as-conv2d":
            # [N * OD, H, W, KD * C] by [KH, KW, KD * C, F]
            conv = next(line for line in text.splitlines() if "linalg.conv_2d_nhwc_hwcf" in line)
            assert "tensor<10x6x10x9xf32>, tensor<3x3x9x16xf32>" in conv
            assert "linalg.conv_2d_nchw_fchw" not in text
        if stage.name == "conv2d-nhwc.mlir":
            assert "linalg.conv_2d_nhwc_hwcf" not in text
            assert re.search(r"vector.fma .* : vector<16xf32>", text)
            # 9 channels: two steps of cl_c = 4, then one peeled (8 columns: 8 FMAs each)
            assert re.search(r"scf.for %\w+ = %c0 to %c8 step %c4", text)
            assert len(re.findall(r"vector.fma", text)) == 8 * 4 + 8
            break
    else:
        raise AssertionError("the conv3d schedule has no conv2d-nhwc.mlir stage")


def test_a_kernel_one_column_wide_convolves_flattened_rows():
    """kbd-conv3d-as-conv2d: a conv3d whose kernel is one column wide, at unit row and column
    strides, is one 2-D convolution over the depths and the rows and columns flattened, its
    row taps dilated by the width: input, kernel and output are reshaped, none is copied."""
    path = SCHEDULES / "x86_64" / "avx512f" / "conv3d" / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    model = Conv3d((8, 3, 3, 3, 1), dilation=(1, 2, 1))
    module = mlir.import_model(model, [torch.randn(2, 3, 7, 8, 10)])
    mlir.apply_stage(module, stages[0])
    assert stages[0].text == "kbd-conv3d-as-conv2d"
    text = str(module)
    conv = next(line for line in text.splitlines() if "linalg.conv_2d_nchw_fchw" in line)
    assert "dilations = dense<[1, 20]>" in conv
    assert "tensor<2x3x7x80xf32>, tensor<8x3x3x3xf32>" in conv
    assert "tensor<2x8x5x40xf32>" in conv
    assert "linalg.transpose" not in text
    # a column stride, or a kernel wider than one column, keeps the stacked depth taps
    for strided in (Conv3d((8, 3, 3, 3, 1), stride=(1, 1, 2)), Conv3d((8, 3, 3, 3, 2))):
        module = mlir.import_model(strided, [torch.randn(2, 3, 7, 8, 10)])
        mlir.apply_stage(module, stages[0])
        assert "dilations = dense<[1, 10]>" not in str(module)
        assert "linalg.transpose" in str(module)


@pytest.mark.parametrize("tile", ["cl_f=64 cl_w=6", "cl_f=48 cl_w=14"])
def test_a_filter_tile_wider_than_the_filters_still_vectorizes(tile):
    """conv2d-nhwc.mlir with a filter tile above the filter count (32), as kbd tune tries: the
    whole 16-filter tiles left have static sizes, and every convolution is vectorized."""
    path = SCHEDULES / "x86_64" / "avx512f" / "conv3d" / "f32.yaml"
    stages = descriptor.resolve_pipeline(
        [f"{path}{{{tile}}}"], schedules_dir=SCHEDULES, cwd=Path("/")
    )
    module = mlir.import_model(
        Conv3d((16, 32, 3, 3, 3), transposed=True), [torch.randn(1, 16, 6, 10, 6)]
    )
    for stage in stages:
        mlir.apply_stage(module, stage)
        if stage.name == "conv2d-nhwc.mlir":
            break
    assert "linalg.conv" not in str(module)


def test_a_transposed_conv3d_leaves_out_the_depth_taps_over_its_padding():
    """kbd-conv3d-as-conv2d: a transposed conv3d (kernel depth 3 over 3 depths: torch-mlir pads
    them with 2 zero depths on each side) computes each of its 5 output depths over the taps
    that read real depths only, 1, 2, 3, 2 and 1 of them: 5 convolutions, 36 channel-taps
    where the padded input would cost 60."""
    path = SCHEDULES / "x86_64" / "conv3d" / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    module = mlir.import_model(
        Conv3d((4, 3, 3, 3, 3), transposed=True), [torch.randn(1, 4, 3, 5, 6)]
    )
    mlir.apply_stage(module, stages[0])
    convs = [line for line in str(module).splitlines() if "linalg.conv_2d_nchw_fchw" in line]
    # [1 output depth, 4 channels x its taps, 9 rows, 10 columns] (rows and columns padded)
    found = [re.search(r"ins\(\S+, \S+ : tensor<1x(\d+)x9x10xf32>", conv) for conv in convs]
    channels = [int(match.group(1)) for match in found]
    assert channels == [4, 8, 12, 8, 4]


def test_a_padded_conv3d_stacks_its_input_unpadded_into_zeros():
    """kbd-conv3d-as-conv2d: torch-mlir pads a transposed conv3d's input (1x4x3x5x6 into zeros
    of 1x4x7x9x10); each depth tap's copy into the stack reads the input itself, at the
    padding's row and column offsets, so the padded input is never made (canonicalized away)
    and no copy has its shape."""
    path = SCHEDULES / "x86_64" / "conv3d" / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    module = mlir.import_model(
        Conv3d((4, 3, 3, 3, 3), transposed=True), [torch.randn(1, 4, 3, 5, 6)]
    )
    assert "tensor<1x4x7x9x10xf32>" in str(module)
    mlir.apply_stage(module, stages[0])
    mlir.apply_stage(module, Stage(kind="pass", text="canonicalize", source="test"))
    text = str(module)
    assert "tensor<1x4x7x9x10xf32>" not in text
    taps = re.findall(r"linalg\.transpose ins\(\S+ : tensor<1x4x(\d+)x5x6x1xf32>", text)
    assert len(taps) == 9  # 1 + 2 + 3 + 2 + 1 depth taps, each of the unpadded rows


def test_a_strided_transposed_convs_phases_are_stored_interleaved_in_vectors():
    """kbd-vector-copies: the two column phases of each output row (a transposed conv3d of
    stride 2, rows of 42 = 2 x 21 columns) are loaded as vectors and interleaved by a shuffle
    into whole rows; no copy into a stride-2 view is left (the loop lowering's single-lane
    stores)."""
    path = SCHEDULES / "x86_64" / "avx512f" / "conv3d" / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    options = dict(groups=2, stride=2, padding=(1, 2, 3), output_padding=1)
    model = Conv3d((4, 2, 3, 5, 7), transposed=True, **options)
    module = mlir.import_model(model, [torch.randn(1, 4, 3, 4, 21)])
    mlir.results_to_out_params(module)
    strided_copies = re.compile(r"memref\.copy .* to memref<[^>]*strided<\[[^]]*, 2\]")
    for stage in stages:
        if stage.text == "kbd-vector-copies":
            assert len(strided_copies.findall(str(module))) == 8  # a copy per phase
        mlir.apply_stage(module, stage)
        if stage.text == "kbd-vector-copies":
            break
    text = str(module)
    assert not strided_copies.findall(text)
    interleave = ", ".join(f"{i}, {16 + i}" for i in range(16))
    assert text.count("vector.shuffle") >= 8 and f"[{interleave}]" in text
    assert "vector.maskedstore" in text  # each row's last 2 x 5 columns


@pytest.mark.parametrize("feature", [None, "avx512f"])
def test_a_long_strided_dilated_conv1d_is_a_batch_matmul_of_its_gathered_taps(feature):
    """kbd-strided-conv1ds-as-phases, before the products: a 3-tap conv1d of stride 3 and
    dilation 4 (level1/76) has its taps gathered, a size-1 conv of 3 x 4 channels that
    kbd-pointwise-convs-as-matmuls makes a batch matmul over the images, tiled by the batch
    matmul schedule; a short one (rows of 31) stays a convolution."""
    folder = SCHEDULES / "x86_64" / (feature or "") / "conv2d" / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(folder)], schedules_dir=SCHEDULES, cwd=Path("/"))
    names = [stage.text for stage in stages if stage.kind == "pass"]
    assert names.index("kbd-strided-conv1ds-as-phases") < names.index(
        "kbd-pointwise-convs-as-matmuls"
    )

    def products(length):
        model = Conv((6, 4, 3), stride=3, dilation=4)
        module = mlir.import_model(model, [torch.randn(2, 4, length)])
        for stage in stages:
            if stage.kind == "transform" and stage.text.endswith("/batch-matmul.mlir"):
                break
            mlir.apply_stage(module, stage)
        return str(module)

    long = products(800)
    assert "linalg.conv_1d_ncw_fcw" not in long
    assert re.search(r"linalg\.batch_matmul .*tensor<2x6x12xf32>, tensor<2x12x264xf32>", long)
    short = products(100)
    assert "linalg.batch_matmul" not in short and "linalg.conv_1d_ncw_fcw" in short


def test_a_narrow_conv2d_is_computed_channels_last_when_its_weights_are_reused_enough():
    """kbd-convs-channels-last: rows of 7 with 40 filters become a conv_2d_nhwc_hwcf between
    transposes; the same layer over a 2 x 2 image stays channels first (each weight used for 4
    outputs would not pay for its copy into [KH, KW, C, F])."""
    path = SCHEDULES / "x86_64" / "avx512f" / "conv2d" / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    stage = next(s for s in stages if s.text == "kbd-convs-channels-last")
    for size, expected in ((9, "tensor<2x9x9x4xf32>, tensor<3x3x4x40xf32>"), (4, None)):
        module = mlir.import_model(Conv((40, 4, 3, 3)), [torch.randn(2, 4, size, size)])
        mlir.apply_stage(module, stage)
        text = str(module)
        if expected:
            conv = next(line for line in text.splitlines() if "linalg.conv_2d_nhwc_hwcf" in line)
            assert expected in conv and "linalg.conv_2d_nchw_fchw" not in text
        else:
            assert "linalg.conv_2d_nhwc_hwcf" not in text and "linalg.conv_2d_nchw_fchw" in text


def test_narrow_convolution_rows_are_computed_padded_to_whole_vectors():
    """kbd-pad-conv-widths: a conv3d's rows of 30 columns are computed as 32 over zero-padded
    input rows, its depth taps stacked as channels of one convolution, and nothing is left for
    the runtime's element-by-element memrefCopy."""
    widths = (8, 14, 18, 30, 34, 64, 254)
    assert [conv_widths.padded_width(w) for w in widths] == [None, 16, None, 32, None, None, None]
    assert conv_widths.padded_width(18, input_copied=True) == 32  # a conv3d tap: a copy anyway
    path = SCHEDULES / "x86_64" / "conv3d" / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    module = mlir.import_model(Conv3d((4, 3, 3, 3, 3)), [torch.randn(1, 3, 5, 6, 32)])
    for stage in stages:
        mlir.apply_stage(module, stage)
        text = str(module)
        if stage.text == "kbd-pad-conv-widths":
            convs = [line for line in text.splitlines() if "linalg.conv_2d_nchw_fchw" in line]
            # one convolution over 3 channels x 3 depth taps, rows of 32 read from rows of 34
            assert len(convs) == 1
            assert "tensor<3x9x6x34xf32>" in convs[0] and "-> tensor<3x4x4x32xf32>" in convs[0]
            # the bias broadcast made at the padded width, not padded by a copy
            bias = r"linalg.broadcast ins\(\S+ : tensor<4xf32>\) outs\(\S+ : tensor<3x4x4x32xf32>\)"
            assert len(re.findall(bias, text)) == 1
            assert not re.search(r"linalg.fill .* -> tensor<3x4x4x32xf32>", text)
    assert "memrefCopy" not in text


def test_attention_reads_its_keys_in_place_under_the_batch_matmul_schedule():
    """kbd's decomposition writes attention's scores as a product with a transposed K;
    kbd-fold-transpose-into-batch-matmul folds that transpose into the product's maps, and
    batch-matmul-transposed-b.mlir vectorizes it along K, batch-matmul.mlir the product with V:
    no transpose and no linalg.batch_matmul left."""
    path = SCHEDULES / "x86_64" / "batch_matmul" / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    module = mlir.import_model(Attention(), [torch.randn(2, 3, 8, 16) for _ in range(3)])
    assert "linalg.transpose" in str(module)
    for stage in stages:
        mlir.apply_stage(module, stage)
        text = str(module)
        if stage.text == "kbd-fold-transpose-into-batch-matmul":
            assert "linalg.transpose" not in text
            assert "affine_map<(d0, d1, d2, d3) -> (d0, d2, d3)>" in text  # K[b, n, k]
        if stage.name == "batch-matmul.mlir":
            assert "linalg.batch_matmul" not in text and "vector.reduction" in text
            break
    else:
        raise AssertionError("the batch_matmul schedule has no batch-matmul.mlir stage")


@pytest.mark.parametrize("family", ["matmul", "batch_matmul"])
@pytest.mark.parametrize("feature", [None, "avx512f"])
def test_both_product_families_schedule_a_transformers_matmuls_and_batch_matmuls(family, feature):
    """A transformer is a matmul or a batch matmul kernel by whichever product dominates; either
    way its descriptor includes product-stages.yaml, which schedules every product: none is
    left as a linalg product (for the loop lowering) whichever family the kernel got."""
    path = SCHEDULES / "x86_64" / (feature or "") / family / "f32.yaml"
    args = [torch.randn(2, 20, 40), *(torch.randn(24, 40) for _ in range(3))]
    module = mlir.import_model(SelfAttentionHeads(), args)
    before = str(module)
    assert "linalg.matmul" in before and "linalg.batch_matmul" in before
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    names = [stage.name for stage in stages]
    for schedule in ("matmul.mlir", "batch-matmul.mlir", "batch-matmul-transposed-b.mlir"):
        assert schedule in names
    for stage in stages[: names.index("batch-matmul.mlir") + 1]:
        mlir.apply_stage(module, stage)
    after = str(module)
    assert "linalg.matmul" not in after and "linalg.batch_matmul" not in after
    assert "vector.contract" in after or "vector.reduction" in after


class ConvLinear(torch.nn.Module):
    """A small convnet: a strided convolution and a Linear classifier."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(16 * 8 * 8, 64)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


@pytest.mark.parametrize("family", ["conv2d", "matmul", "batch_matmul"])
@pytest.mark.parametrize("feature", [None, "avx512f"])
def test_every_family_schedules_products_and_convolutions(family, feature):
    """Whichever family a kernel's dominant op gave it, its descriptor includes
    product-stages.yaml and convolution-stages.yaml: a convnet's Linear classifier and its
    convolution are both vectorized, neither left to the loop lowering."""
    path = SCHEDULES / "x86_64" / (feature or "") / family / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    module = mlir.import_model(ConvLinear(), [torch.randn(2, 3, 16, 16)])
    before = str(module)
    assert "linalg.matmul" in before and "linalg.conv_2d" in before
    for stage in stages:
        mlir.apply_stage(module, stage)
        if stage.name == "reduction.mlir":
            break
    after = str(module)
    assert "linalg.matmul" not in after and "linalg.conv_2d" not in after
    assert "vector.fma" in after or "vector.contract" in after
    # what the loop lowering would take: a reduction (the classifier's product, or the
    # convolution's, generalized) left as a linalg op
    reductions = [op for op in walk.ops_named(module, "linalg.generic") if "reduction" in str(op)]
    assert not reductions, reductions[0]


@pytest.mark.parametrize(
    ("module", "shape", "regions", "divisions"),
    [
        # 1-D, padding 4, dilation 3: at each end, the first (last) column and the next three,
        # which keep the same taps; the interior
        (Pool(kernel_size=8, stride=1, padding=4, dilation=3), (2, 3, 70), 5, 0),
        # 3-D average (channels-last between transposes, as torch-mlir imports it), strided
        # along its rows: 3 x 3 regions of the outer taps, then 3 of the strided ones, each
        # dividing by the window's size
        (Pool(True, kernel_size=3, stride=2, padding=1), (1, 2, 9, 9, 39), 9 + 3, 3),
    ],
)
def test_a_pooling_becomes_vectorized_taps_without_a_padded_copy(module, shape, regions, divisions):
    """kbd-poolings-as-taps leaves no pooling op, no padding and no transpose: one generic
    (kbd.pooling) per region of the output, the average's division folded in; pooling.mlir
    computes them all in vector arithmetic."""
    path = SCHEDULES / "x86_64" / "pooling" / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    module = mlir.import_model(module, [torch.randn(shape)])
    assert "tensor.pad" in str(module)
    for stage in stages:
        mlir.apply_stage(module, stage)
        text = str(module)
        if stage.text == "kbd-poolings-as-taps":
            for name in ("linalg.pooling", "tensor.pad", "linalg.transpose", "reduction"):
                assert name not in text
            assert text.count("kbd.pooling") == regions
            assert text.count("arith.divf") == divisions
        if stage.name == "pooling.mlir":
            assert "kbd.pooling" not in text
            assert re.search(r"arith\.(maximumf|addf) .* : vector<\d+xf32>", text)
            break
    else:
        raise AssertionError("the pooling schedule has no pooling.mlir stage")


def test_a_linear_layer_reads_its_weight_in_place_under_the_matmul_schedule(family_run):
    """kbd-fold-transpose-into-matmul (in the matmul family schedules) folds the transpose of
    nn.Linear's weight into the matmul's maps, matmul-transposed-b.mlir then vectorizes that
    matmul along K (no linalg.matmul left), and the kernel passes."""
    records, dumps, stderr = family_run
    assert records["level1/9_linear_relu"]["outcome"] == "pass", stderr
    dumps = dumps["level1/9_linear_relu"]
    original = next(d for d in dumps if d.startswith("Original module"))
    assert "linalg.transpose" in original and "linalg.matmul" in original
    folded = next(d for d in dumps if d.startswith("IR Dump After kbd-fold-transpose-into"))
    assert "linalg.transpose" not in folded
    assert "affine_map<(d0, d1, d2) -> (d1, d2)>" in folded  # W[n, k]
    scheduled = next(d for d in dumps if d.startswith("IR Dump After transform matmul-trans"))
    assert "linalg.matmul" not in scheduled and "vector.reduction" in scheduled


class Linear(torch.nn.Module):
    def forward(self, x, w):
        return F.linear(x, w)


@pytest.mark.parametrize("feature", [None, "avx512f"])
def test_a_transposed_copy_is_made_in_tiles_transposed_in_registers(feature):
    """A Linear over more rows than kbd-fold-transpose-into-matmul folds keeps the transposed
    copy of its weight; the copy is marked kbd.transpose and made in 16 x 16 tiles, each read
    along the weight's rows and transposed with shuffles, not gathered lane by lane from 16
    rows of the weight."""
    path = SCHEDULES / "x86_64" / (feature or "") / "matmul" / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    module = mlir.import_model(Linear(), [torch.randn(256, 64), torch.randn(96, 64)])
    marked = False
    for stage in stages:
        mlir.apply_stage(module, stage)
        marked = marked or "kbd.transpose = 2" in str(module)
        if stage.name == "reduction.mlir":
            break
    text = str(module)
    assert marked
    assert "vector.shuffle" in text and "vector<16x16xf32>" in text
    assert "permutation_map" not in text and "linalg.generic" not in text


@pytest.mark.skipif(ARCH != "x86_64", reason="the softmax schedule is x86_64's")
def test_a_softmax_kernel_with_two_block_loops_passes_with_its_schedule(family_run):
    """A softmax and a log-softmax returned together: rows.mlir tiles each result into its own
    scf.forall and vectorizes the ops of each (a `match ... in` both at once would fail)."""
    kernel = "level1/10_softmax_log_softmax"
    fixture = _fixture_kernel(kernel)
    assert families.family_of(fixture.Model(), fixture.get_inputs()) == "softmax"
    records, dumps, stderr = family_run
    assert records[kernel]["outcome"] == "pass", stderr
    assert records[kernel]["pipeline"] == "x86_64/softmax/f32.yaml"
    scheduled = next(d for d in dumps[kernel] if d.startswith("IR Dump After transform rows.mlir"))
    blocks = scheduled.split("= scf.forall (")[1:]  # the ops of each block, then the rest
    assert len(blocks) == 2 and all("vector.reduction" in block for block in blocks)


class Elementwise(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, x):
        return self.function(x)


def vector_math(function, x: torch.Tensor, stage: str, op: str) -> np.ndarray | None:
    """`function` of x lowered by the element-wise schedule, whose `stage` leaves no `op`
    (checked), then run (None off x86_64)."""
    path = SCHEDULES / "x86_64" / "element_wise" / "f32.yaml"
    module = mlir.import_model(Elementwise(function), [x])
    out_types, _ = mlir.results_to_out_params(module)
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    for each in stages:
        mlir.apply_stage(module, each)
        if each.text == stage:
            assert op not in str(module)
    if ARCH != "x86_64":
        return None
    output = np.zeros(out_types[0].dims, np.float32)
    mlir.Compiled(module, 3, openmp=True)([output, *ingress.buffers_from_args([x])])
    return output


def test_vector_exp_is_a_polynomial_accurate_over_the_whole_range():
    """kbd-polynomial-exp (in every x86_64 family schedule): no libm call per lane, results
    within a few ulp of eager, 0 and inf at the ends, NaN kept."""
    special = [-float("inf"), -200.0, -88.0, -87.0, -1e-7, 0.0, 1e-7, 0.5, 1.0, 88.5, 88.7]
    values = torch.tensor([*special, 89.0, float("inf"), float("nan"), 0.0, 0.0])  # 16 values
    x = torch.cat([values, torch.linspace(-80, 80, 4080)]).reshape(64, -1)
    output = vector_math(torch.exp, x, "kbd-polynomial-exp", "math.exp")
    if output is not None:
        expected = torch.exp(x).numpy()
        np.testing.assert_allclose(output, expected, rtol=5e-7, atol=1e-37, equal_nan=True)


def test_vector_erf_is_a_polynomial_accurate_over_the_whole_range():
    """kbd-polynomial-erf (in every x86_64 family schedule): no libm call per lane, results
    within 1e-6 of eager, +-1 at the ends, NaN kept."""
    special = [-float("inf"), -10.0, -3.0, -1e-7, 0.0, 1e-7, 0.5, 3.0, 10.0, float("inf")]
    values = torch.tensor([*special, float("nan"), 0.0, 0.0, 0.0, 0.0, 0.0])  # 16 values
    x = torch.cat([values, torch.linspace(-6, 6, 4080)]).reshape(64, -1)
    output = vector_math(torch.erf, x, "kbd-polynomial-erf", "math.erf")
    if output is not None:
        expected = torch.erf(x).numpy()
        np.testing.assert_allclose(output, expected, rtol=0, atol=1e-6, equal_nan=True)


def test_vector_log_is_a_polynomial_accurate_over_the_whole_range():
    """kbd-polynomial-log (in every x86_64 family schedule): no libm call per lane, results
    within a few ulp of eager, -inf at 0, NaN below it, inf kept."""
    special = [0.0, -0.0, -1.0, 1e-30, 1e-7, 0.5, 0.7071, 0.7072, 1.0, 2.0, 3e38, float("inf")]
    values = torch.tensor([*special, float("nan"), -float("inf"), 1e-40, 1e-44])  # subnormals
    x = torch.cat([values, torch.logspace(-37, 38, 4080)]).reshape(64, -1)
    output = vector_math(torch.log, x, "kbd-polynomial-log", "math.log")
    if output is not None:
        expected = torch.log(x).numpy()
        np.testing.assert_allclose(output, expected, rtol=5e-7, atol=1e-7, equal_nan=True)


def test_vector_log1p_keeps_its_precision_near_zero():
    """kbd-polynomial-log takes log1p as a log of 1 + x, corrected so that tiny x keep their
    relative precision; -1 gives -inf, below it NaN."""
    special = [-1.0, -2.0, -0.5, -1e-30, 0.0, 1e-30, 1e-10, 1e-6, 1e-3, 1.0, 3e38, float("inf")]
    values = torch.tensor([*special, float("nan"), 5.0, 6.0, 7.0])  # 16 values
    x = torch.cat([values, torch.logspace(-20, 20, 4080)]).reshape(64, -1)
    output = vector_math(torch.log1p, x, "kbd-polynomial-log", "math.log")
    if output is not None:
        expected = torch.log1p(x).numpy()
        np.testing.assert_allclose(output, expected, rtol=1e-6, atol=0, equal_nan=True)


class Relu(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)


def test_a_flattened_result_is_computed_in_its_out_param():
    """element-wise.mlir flattens the chain to 1-D, so its result is a reshape of a buffer of
    its own; kbd-outputs-in-place makes that buffer the out-param itself: no allocation and no
    copy of the result remain, and the kernel still computes it."""
    path = SCHEDULES / "x86_64" / "element_wise" / "f32.yaml"
    x = torch.randn(4, 64)
    module = mlir.import_model(Relu(), [x])
    out_types, _ = mlir.results_to_out_params(module)
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    for stage in stages:
        before = str(module)
        mlir.apply_stage(module, stage)
        if stage.text == "kbd-outputs-in-place":
            assert "memref.copy" in before and "memref.alloc" in before
            assert "memref.copy" not in str(module) and "memref.alloc" not in str(module)
    output = np.zeros(out_types[0].dims, np.float32)
    mlir.Compiled(module, 2, openmp=True)([output, *ingress.buffers_from_args([x])])
    np.testing.assert_array_equal(output, torch.relu(x).numpy())


class Masked(torch.nn.Module):
    def forward(self, x, mask):
        return x * mask, mask & (x > 0)


def test_bool_buffers_are_bytes_under_vectorized_code():
    """A bool input or result is a buffer of bytes (as numpy and torch store it), converted to
    and from i1 inside: read as a vector of i1 it would be 16 bools packed into 2 bytes."""
    path = SCHEDULES / "x86_64" / "element_wise" / "f32.yaml"
    torch.manual_seed(0)
    args = [torch.randn(4, 64), torch.rand(4, 64) < 0.5]
    module = mlir.import_model(Masked(), args)
    out_types, in_types = mlir.results_to_out_params(module)
    assert [t.dtype for t in out_types] == ["f32", "i1"] and in_types[1].dtype == "i1"
    assert "memref<4x64xi8>" in str(module)
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    for stage in stages:
        mlir.apply_stage(module, stage)
    outputs = [np.zeros(t.dims, ingress.NUMPY_DTYPES[t.dtype]) for t in out_types]
    mlir.Compiled(module, 2, openmp=True)([*outputs, *ingress.buffers_from_args(args)])
    for got, expected in zip(outputs, Masked()(*args), strict=True):
        np.testing.assert_array_equal(got, expected.numpy())


class ConvReciprocal(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)

    def forward(self, x):
        return torch.reciprocal(torch.sqrt(self.conv(x) ** 2 + 1.0))


def test_an_epilogue_with_an_assert_is_vectorized_without_it():
    """kbd-drop-generic-asserts: torch-mlir's reciprocal asserts its divisor is not zero inside
    the epilogue's body, which kept the fused epilogue a scalar loop; dropped, the epilogue (the
    square root included) is vector code."""
    path = SCHEDULES / "x86_64" / "conv2d" / "f32.yaml"
    stages = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=Path("/"))
    module = mlir.import_model(ConvReciprocal(), [torch.randn(2, 3, 9, 21)])
    assert "cf.assert" in str(module)
    for stage in stages:
        mlir.apply_stage(module, stage)
        if stage is _last_parallel_generics(stages):
            break
    text = str(module)
    assert "cf.assert" not in text and "linalg.generic" not in text
    assert re.search(r"math\.sqrt .* : vector<[0-9x]*16xf32>", text)


def test_repeated_products_and_convolutions_are_compiled_once(monkeypatch):
    """kbd-outline-repeated-ops: each product or convolution that occurs more than once, with
    its accumulator's fill and its input's padding, becomes one private function that every
    copy calls; one that occurs once, or accumulates into a tensor from outside, stays."""
    stage = descriptor.resolve_pipeline(
        ["kbd-outline-repeated-ops"], schedules_dir=SCHEDULES, cwd=Path("/")
    )[0]
    shapes = [(5, 4, 24), (4, 40), (40, 64), (40,), (16, 40), (16,)]
    module = mlir.import_model(UnrolledRnn(), [torch.randn(s) for s in shapes])
    assert str(module).count("linalg.matmul") == 10
    mlir.apply_stage(module, stage)
    text = str(module)
    functions = re.findall(r"func.func private @(\w+)\(([^)]*)\) -> (tensor<[^>]*>)", text)
    assert sorted(result for _, _, result in functions) == ["tensor<4x16xf32>", "tensor<4x40xf32>"]
    assert text.count("call @kbd_outlined_") == 10 and text.count("linalg.matmul") == 2
    assert text.count("linalg.fill") == 2  # the fills moved into the functions
    assert module.operation.verify()
    # the epilogues' stage: each step's bias add, one function; its tanh (which the next step's
    # concatenation takes) and the output's bias add (stacked) are written in place: they stay,
    # as 5 steps are fewer than MANY_COPIES
    generics = descriptor.resolve_pipeline(
        ["kbd-outline-repeated-generics"], schedules_dir=SCHEDULES, cwd=Path("/")
    )[0]
    after_products = str(module)

    def outline_generics(many_copies: int, small: int) -> str:
        monkeypatch.setattr(outline, "MANY_COPIES", many_copies)
        monkeypatch.setattr(outline, "SMALL_WRITTEN_INTO", small)
        with module.context:
            copy = ir.Module.parse(after_products)
        mlir.apply_stage(copy, generics)
        assert copy.operation.verify()
        return str(copy)

    text = outline_generics(outline.MANY_COPIES, outline.SMALL_WRITTEN_INTO)
    assert text.count("func.func private @kbd_outlined_") == 3
    assert text.count("call @kbd_outlined_") == 10 + 5 and text.count("linalg.generic") == 1 + 10
    # with as many steps as MANY_COPIES, the two small ones become functions too (a copy each)
    text = outline_generics(5, outline.SMALL_WRITTEN_INTO)
    assert text.count("func.func private @kbd_outlined_") == 5
    assert text.count("call @kbd_outlined_") == 10 + 15 and text.count("linalg.generic") == 3
    # but not when their results are larger than SMALL_WRITTEN_INTO (4x16 and 4x40 here)
    text = outline_generics(5, 63)
    assert text.count("func.func private @kbd_outlined_") == 3
    assert text.count("call @kbd_outlined_") == 10 + 5 and text.count("linalg.generic") == 1 + 10

    shapes = [(2, 6, 10, 21), (6, 6, 3, 3), (6, 6, 3, 3), (6, 6, 3, 3), (4, 6, 1, 1)]
    module = mlir.import_model(RepeatedConvs(), [torch.randn(s) for s in shapes])
    mlir.apply_stage(module, stage)
    text = str(module)
    [function] = re.findall(r"func.func private @\w+\(.*", text)
    assert "tensor<2x6x10x21xf32>, %arg1: tensor<6x6x3x3xf32>) -> tensor<2x6x10x21xf32>" in function
    main = text[text.index("func.func @main") : text.index("func.func private")]
    assert main.count("call @kbd_outlined_0") == 3 and main.count("linalg.conv_2d_nchw_fchw") == 1
    assert "tensor.pad" not in main  # the 3x3 convolutions' padding went with them

    t = "tensor<8x8xf32>"
    accumulated = f"""
    func.func @main(%a: {t}, %b: {t}, %c: {t}) -> {t} {{
      %0 = linalg.matmul ins(%a, %b : {t}, {t}) outs(%c : {t}) -> {t}
      %1 = linalg.matmul ins(%a, %b : {t}, {t}) outs(%0 : {t}) -> {t}
      return %1 : {t}
    }}"""
    with ir.Context():
        module = ir.Module.parse(accumulated)
        mlir.apply_stage(module, stage)
        assert "call" not in str(module) and str(module).count("linalg.matmul") == 2
