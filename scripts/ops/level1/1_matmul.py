import torch
import torch.nn as nn


class Model(nn.Module):
    """C = A @ B."""

    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.rand(1024, 1024), torch.rand(1024, 1024)]


def get_init_inputs():
    return []
