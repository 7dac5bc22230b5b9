import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3 convolution, stride 1, padding 1, with bias (a ResNet stage-1 layer)."""

    def __init__(self, channels=64):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(8, 64, 56, 56)]


def get_init_inputs():
    return [64]
