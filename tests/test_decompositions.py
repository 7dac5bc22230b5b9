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


class Mean(torch.nn.Module):
    def forward(self, x):
        return torch.mean(x)


def exported_ops(module, *args) -> list[str]:
    table = decompositions.TABLE
    program = torch.export.export(module, args, strict=False).run_decompositions(table)
    return [str(node.target) for node in program.graph.nodes if node.op == "call_function"]


def test_long_sums_are_summed_in_blocks_one_dimension_at_a_time():
    x = torch.rand(4, 3 * decompositions.BLOCK, dtype=torch.float64)
    for result, expected in [
        (decompositions.sum_all(x), torch.sum(x)),
        (decompositions.mean_all(x), torch.mean(x)),
        (decompositions.sum_(x, [1], True), torch.sum(x, 1, keepdim=True)),
        (decompositions.mean(x, [-1]), torch.mean(x, -1)),
    ]:
        assert result.shape == expected.shape
        torch.testing.assert_close(result, expected)
    # 4 x 3*BLOCK: the rows in blocks of BLOCK, then the blocks, then the rows
    assert exported_ops(Mean(), x).count("aten.sum.dim_IntList") == 3


def test_short_and_integer_sums_stay_one_reduction():
    assert decompositions.sum_all(torch.rand(64, 64)) is NotImplemented
    assert decompositions.sum_all(torch.ones(4, decompositions.BLOCK, dtype=torch.int64)) is (
        NotImplemented
    )
    prime = 65537  # longer than BLOCK, no block divides it
    assert decompositions.sum_(torch.rand(2, prime), [1]) is NotImplemented
    assert exported_ops(Mean(), torch.rand(64, 64)) == ["aten.mean.default"]
