"""kbd's import-time decompositions compute what eager computes."""

from __future__ import annotations

import pytest
import torch

from kbd.worker import decompositions


@pytest.mark.parametrize("shape", [(7,), (3, 100), (2, 5, 33), (1, 1)])
@pytest.mark.parametrize("dim", [0, -1])
def test_cumsum_matches_eager(shape, dim):
    x = torch.rand(shape, dtype=torch.float64)
    torch.testing.assert_close(decompositions.cumsum(x, dim), torch.cumsum(x, dim))


def test_cumsum_of_integers_and_bools_accumulates_in_int64():
    mask = torch.rand(4, 9) < 0.5
    result = decompositions.cumsum(mask, 1)
    assert result.dtype == torch.int64
    assert torch.equal(result, torch.cumsum(mask, 1))


def test_cumsum_with_dtype():
    x = torch.arange(10, dtype=torch.int32)
    assert torch.equal(decompositions.cumsum(x, 0, torch.float32), torch.cumsum(x, 0).float())


@pytest.mark.parametrize("dim", [0, 1])
def test_cumprod_matches_eager(dim):
    x = torch.rand(6, 17, dtype=torch.float64) + 0.5
    torch.testing.assert_close(decompositions.cumprod(x, dim), torch.cumprod(x, dim))


def test_zero_dimensional():
    x = torch.tensor(3.0)
    assert decompositions.cumsum(x, 0).item() == 3.0
