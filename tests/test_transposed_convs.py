"""Strided transposed convolutions by phases, grouped 3-D convolutions by groups
(kbd.worker.transposed_convs): the same results as torch's, and no zero-stuffed input."""

from __future__ import annotations

import random
import re

import pytest
import torch

from kbd.worker import mlir, transposed_convs

aten = torch.ops.aten


def _random_transposed(rng: random.Random, spatial: int):
    """A valid strided transposed convolution's arguments (f64), any dilation, padding, output
    padding, groups and bias."""
    groups = rng.choice([1, 2])
    kernels = [rng.randint(1, 4) for _ in range(spatial)]
    strides = [rng.randint(2, 3) for _ in range(spatial)]
    dilations = [rng.randint(1, 3) for _ in range(spatial)]
    paddings = [rng.randint(0, d * (k - 1)) for d, k in zip(dilations, kernels, strict=True)]
    output_paddings = [
        rng.randint(0, max(s, d) - 1) for s, d in zip(strides, dilations, strict=True)
    ]
    inputs = groups * rng.choice([1, 2])
    per_group = rng.choice([1, 3])
    x = torch.randn(2, inputs, *[rng.randint(1, 5) for _ in range(spatial)], dtype=torch.float64)
    weight = torch.randn(inputs, per_group, *kernels, dtype=torch.float64)
    bias = rng.choice([None, torch.randn(per_group * groups, dtype=torch.float64)])
    return x, weight, bias, strides, paddings, dilations, True, output_paddings, groups


@pytest.mark.parametrize("spatial", [1, 2, 3])
def test_strided_transposed_convolutions_match_torch(spatial):
    """Phases cover every output position once: kernels smaller than the stride (phases with
    the bias alone), dilations sharing a factor with the stride, output padding past the last
    tap, negative phase offsets."""
    rng = random.Random(spatial)
    checked = 0
    while checked < 40:
        arguments = _random_transposed(rng, spatial)
        try:
            expected = aten.convolution(*arguments)
        except RuntimeError:
            continue  # an output padding torch rejects for this stride and dilation
        got = transposed_convs.convolution(*arguments)
        assert got is not NotImplemented
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
        checked += 1


def test_grouped_3d_convolutions_are_split_by_group():
    x = torch.randn(2, 4, 5, 6, 7, dtype=torch.float64)
    weight = torch.randn(6, 2, 3, 2, 3, dtype=torch.float64)
    bias = torch.randn(6, dtype=torch.float64)
    arguments = (x, weight, bias, [1, 2, 1], [1, 0, 1], [1, 1, 2], False, [0, 0, 0], 2)
    torch.testing.assert_close(
        transposed_convs.convolution(*arguments), aten.convolution(*arguments)
    )


def test_other_convolutions_are_left_to_torch_mlir():
    x3 = torch.randn(1, 4, 5, 5, 5)
    depthwise = (x3, torch.randn(4, 1, 3, 3, 3), None, [1] * 3, [0] * 3, [1] * 3, False, [0] * 3, 4)
    plain = (x3, torch.randn(6, 4, 3, 3, 3), None, [2] * 3, [0] * 3, [1] * 3, False, [0] * 3, 1)
    transposed_1 = (
        x3,
        torch.randn(4, 6, 3, 3, 3),
        None,
        [1] * 3,
        [1] * 3,
        [1] * 3,
        True,
        [0] * 3,
        1,
    )
    grouped_2d = (
        torch.randn(1, 4, 5, 5),
        torch.randn(6, 2, 3, 3),
        None,
        [1, 1],
        [0, 0],
        [1, 1],
        False,
        [0, 0],
        2,
    )
    for arguments in (depthwise, plain, transposed_1, grouped_2d):
        assert transposed_convs.convolution(*arguments) is NotImplemented


def test_a_strided_transposed_conv3d_imports_without_a_zero_stuffed_input():
    """torch-mlir alone inserts the input into zeros at stride 2 (zero-stuffing); by phases,
    every strided insert writes a phase of the output (6 channels), and each convolution has
    its phase's taps: 8 phases of 2 groups, 1 or 2 taps per dim of a 3-tap kernel, and makes
    exactly its phase's positions (half the output's 10 x 12 x 14 per dim), none to be cut."""
    conv = torch.nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
    text = str(mlir.import_model(conv, [torch.randn(1, 4, 5, 6, 7)]))
    strided = [
        line for line in text.splitlines() if "tensor.insert_slice" in line and ", 2] :" in line
    ]
    assert strided
    assert all(re.search(r": tensor<1x6x\d+x\d+x\d+xf32> into", line) for line in strided)
    kernels = re.findall(r"linalg\.conv_3d_ncdhw_fcdhw .*, tensor<3x2x(\d)x(\d)x(\d)xf32>\)", text)
    assert len(kernels) == 16
    assert {int(taps) for kernel in kernels for taps in kernel} == {1, 2}
    outputs = re.findall(r"linalg\.conv_3d_ncdhw_fcdhw .* -> tensor<([\dx]+)xf32>", text)
    assert outputs == ["1x3x5x6x7"] * 16


def test_phases_without_a_tap_are_filled_with_the_output_not_scattered():
    """A 3-tap kernel dilated by 2 at stride 5 (level1/81) leaves 2 of 5 phases per dim
    without a tap: the output starts as one fill of the bias, and only the 3 x 3 phases with
    a tap are strided inserts, where every one of the 25 was."""
    conv = torch.nn.ConvTranspose2d(4, 6, 3, stride=5, padding=1, dilation=2)
    x = torch.randn(1, 4, 5, 6)
    text = str(mlir.import_model(conv, [x]))
    strided = [
        line for line in text.splitlines() if "tensor.insert_slice" in line and ", 5] :" in line
    ]
    assert len(strided) == 9
    torch.testing.assert_close(
        transposed_convs.convolution(
            x, conv.weight, conv.bias, [5, 5], [1, 1], [2, 2], True, [0, 0], 1
        ),
        conv(x),
    )
