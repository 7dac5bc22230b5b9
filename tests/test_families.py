"""Schedule families from the ops of a kernel's exported graph."""

from __future__ import annotations

import torch

from kbd.worker import families


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2


class ConvNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.norm = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.softmax(self.norm(self.conv(x)), dim=1)


class Chain(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(torch.relu(2 * x + 1)) * 0.5


class Bmm(torch.nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b) + 1


class Softmax(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class Sort(torch.nn.Module):
    def forward(self, x):
        return torch.sort(x).values


def test_dominant_op_decides():
    assert families.family_of(Mlp().eval(), [torch.randn(2, 8)]) == "matmul"
    assert families.family_of(ConvNorm().eval(), [torch.randn(1, 3, 8, 8)]) == "conv2d"
    assert families.family_of(Bmm(), [torch.randn(2, 3, 4), torch.randn(2, 4, 5)]) == "batch_matmul"
    assert families.family_of(Softmax(), [torch.randn(4, 8)]) == "softmax"


def test_element_wise_only_graphs_and_unclaimed_ops():
    assert families.family_of(Chain(), [torch.randn(4, 8)]) == "element_wise"
    assert families.family_of(Sort(), [torch.randn(4, 8)]) is None
    assert families.classify([]) is None


class ConvThenLinear(torch.nn.Module):
    """A heavy convolution feeding a light classifier: the convolution dominates."""

    def __init__(self, out_features: int):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3)
        self.fc = torch.nn.Linear(16 * 6 * 6, out_features)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


class ProjectThenBmm(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.proj = torch.nn.Linear(width, width)

    def forward(self, q, k):
        return torch.bmm(self.proj(q), k)


class MatmulOp(torch.nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def test_the_op_doing_the_most_flops_decides():
    # conv: 2*16*36*27 = 31104 FLOPs; linear: 2*576*out
    assert families.family_of(ConvThenLinear(4).eval(), [torch.randn(1, 3, 8, 8)]) == "conv2d"
    assert families.family_of(ConvThenLinear(512).eval(), [torch.randn(1, 3, 8, 8)]) == "matmul"
    # projection: 2*(4*16)*16*16; bmm: 2*(4*16*256)*16
    q, k = torch.randn(4, 16, 16), torch.randn(4, 16, 256)
    assert families.family_of(ProjectThenBmm(16), [q, k]) == "batch_matmul"
    assert families.family_of(ProjectThenBmm(16), [q, torch.randn(4, 16, 1)]) == "matmul"


def test_products_are_told_apart_by_their_operands():
    mm = MatmulOp()
    assert families.family_of(mm, [torch.randn(8, 16), torch.randn(16, 4)]) == "matmul"
    assert families.family_of(mm, [torch.randn(8, 16), torch.randn(16, 1)]) == "matvec"
    assert families.family_of(mm, [torch.randn(8, 16), torch.randn(16)]) == "matvec"
    assert families.family_of(mm, [torch.randn(2, 8, 16), torch.randn(2, 16, 4)]) == "batch_matmul"
    assert families.family_of(mm, [torch.randn(2, 8, 16), torch.randn(16, 4)]) == "matmul"
    conv3d = torch.nn.Conv3d(2, 2, 3).eval()
    assert families.family_of(conv3d, [torch.randn(1, 2, 5, 5, 5)]) == "conv3d"


def test_meta_tensors_are_enough():
    with torch.device("meta"):
        model, x = ConvThenLinear(4).eval(), torch.randn(1, 3, 8, 8)
    assert families.family_of(model, [x]) == "conv2d"


class MseLoss(torch.nn.Module):
    def forward(self, predictions, targets):
        return torch.nn.functional.mse_loss(predictions, targets)


class CrossEntropy(torch.nn.Module):
    def forward(self, x, targets):
        return torch.nn.functional.cross_entropy(x, targets)


class L2Norm(torch.nn.Module):
    def forward(self, x):
        return x / torch.norm(x, p=2, dim=1, keepdim=True)


def test_losses_and_norms_are_reductions():
    x = torch.randn(4, 8)
    assert families.family_of(MseLoss(), [x, torch.randn(4, 8)]) == "reduction"
    assert families.family_of(CrossEntropy(), [x, torch.randint(0, 8, (4,))]) == "reduction"
    assert families.family_of(L2Norm(), [x]) == "reduction"


class MaskedCumsum(torch.nn.Module):
    def forward(self, x, mask):
        return torch.cumsum(x * mask, dim=1)


def test_scans_are_their_own_family():
    args = [torch.randn(4, 8), torch.rand(4, 8) < 0.5]
    assert families.family_of(MaskedCumsum(), args) == "scan"


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_attention_is_a_batched_product():
    args = [torch.randn(2, 3, 8, 16) for _ in range(3)]
    assert families.family_of(Attention(), args) == "batch_matmul"


class PoolThenSum(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.avg_pool2d(x, 3, padding=1).sum(dim=1)


def test_pooling_graphs_are_pooling_unless_a_convolution_dominates():
    assert families.family_of(torch.nn.MaxPool1d(4, 2, 1), [torch.randn(1, 2, 16)]) == "pooling"
    pool = torch.nn.MaxPool2d(3, 2, 1, return_indices=True)
    assert families.family_of(pool, [torch.randn(1, 2, 9, 9)]) == "pooling"
    assert families.family_of(torch.nn.AvgPool3d(3), [torch.randn(1, 2, 6, 6, 6)]) == "pooling"
    assert families.family_of(PoolThenSum(), [torch.randn(1, 2, 8, 8)]) == "pooling"
    conv_pool = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.MaxPool2d(2)).eval()
    assert families.family_of(conv_pool, [torch.randn(1, 3, 8, 8)]) == "conv2d"


def test_recurrent_layers_are_matmuls():
    gru = torch.nn.GRU(8, 16, 2)
    assert families.family_of(gru, [torch.randn(5, 3, 8), torch.randn(2, 3, 16)]) == "matmul"
    lstm = torch.nn.LSTM(8, 16)
    assert families.family_of(lstm, [torch.randn(5, 3, 8)]) == "matmul"


def test_a_recurrent_layer_outweighs_a_small_linear_head():
    """The layer's gate products are counted (3 per step for a GRU), not only the head's."""

    class GruHead(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gru, self.head = torch.nn.GRU(64, 64), torch.nn.Linear(64, 2)

        def forward(self, x):
            return self.head(self.gru(x)[0][-1])

    ops = families._ops(torch.export.export(GruHead(), (torch.randn(10, 4, 64),)))
    gru = next(op for op in ops if op.name == "gru")
    assert families._flops(gru) == 2 * 10 * 4 * 3 * 64 * (64 + 64)
