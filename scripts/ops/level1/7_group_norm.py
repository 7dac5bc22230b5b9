import torch
import torch.nn as nn


class Model(nn.Module):
    """Group norm, 8 groups of 8 channels (KernelBench level1/35_GroupNorm_)."""

    def __init__(self, channels=64, groups=8):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)

    def forward(self, x):
        return self.norm(x)


def get_inputs():
    return [torch.rand(14, 64, 256, 256)]


def get_init_inputs():
    return [64, 8]
