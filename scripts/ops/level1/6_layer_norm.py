import torch
import torch.nn as nn


class Model(nn.Module):
    """Layer norm over the last three dims (KernelBench level1/40_LayerNorm)."""

    def __init__(self, normalized_shape=(64, 256, 256)):
        super().__init__()
        self.norm = nn.LayerNorm(normalized_shape)

    def forward(self, x):
        return self.norm(x)


def get_inputs():
    return [torch.rand(16, 64, 256, 256)]


def get_init_inputs():
    return [(64, 256, 256)]
