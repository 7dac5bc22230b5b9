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
