"""kbd's import-time decompositions compute what eager computes."""

from __future__ import annotations

import pytest
import torch

from kbd.worker import decompositions, norms


def test_floating_scans_are_left_to_torch_mlir():
    x = torch.rand(3, 100)
    assert decompositions.cumsum(x, 1) is NotImplemented
    assert decompositions.cumprod(x, 0) is NotImplemented


def test_cumsum_of_integers_and_bools_accumulates_in_int64():
    mask = torch.rand(4, 9) < 0.5
    result = decompositions.cumsum(mask, 1)
    assert result.dtype == torch.int64
    assert torch.equal(result, torch.cumsum(mask, 1))


def test_cumsum_with_dtype():
    x = torch.arange(10, dtype=torch.int32)
    assert torch.equal(decompositions.cumsum(x, 0, torch.float32), torch.cumsum(x, 0).float())


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


def _brute_block_length(n: int) -> int | None:
    """block_length by its definition, trying every length."""
    block = decompositions.BLOCK
    fits = [b for b in range(1, block + 1) if n % b == 0 and n // b <= block]
    return max(fits) if n > block and fits else None


def test_sums_are_blocked_only_where_no_run_is_longer_than_a_block():
    block = decompositions.BLOCK
    cases = {
        block: None,  # one run is short enough
        3 * block: block,
        1 << 26: block,  # 1024 blocks
        block + 2: (block + 2) // 2,  # 2 * 3**2 * 11 * 331: 2 blocks of 32769
        block * block: block,
        2 * 65537: None,  # blocks of 2 would leave a run of 65537 block sums
        65537: None,  # a prime
        2 * block * block: None,  # too many blocks even at the longest
    }
    assert {n: decompositions.block_length(n) for n in cases} == cases
    for n in [block + 1, 3 * 65537, 100_000, 7 * 11 * 13 * 17 * 19, 1_000_003, 48 * 4093]:
        assert decompositions.block_length(n) == _brute_block_length(n), n
    assert decompositions.sum_(torch.rand(2, 2 * 65537), [1]) is NotImplemented


class Norms(torch.nn.Module):
    """Layer, group and instance norm of one input, each with a weight and bias."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.LayerNorm([4, 6, 5])
        self.group = torch.nn.GroupNorm(2, 4)
        self.instance = torch.nn.InstanceNorm2d(4, affine=True)
        for parameter in self.parameters():
            torch.nn.init.normal_(parameter)

    def forward(self, x):
        return self.layer(x) + self.group(x) + self.instance(x)


def test_norms_match_eager_in_f32_without_widening_to_f64():
    torch.manual_seed(0)
    model, x = Norms(), torch.rand(3, 4, 6, 5) * 10 + 100  # a mean far from 0
    program = torch.export.export(model, (x,), strict=False).run_decompositions(norms.TABLE)
    names = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    assert not any("norm" in name or "_to_copy" in name for name in names), names
    torch.testing.assert_close(program.module()(x), model(x), rtol=1e-4, atol=1e-4)


def test_norm_rows_longer_than_a_block_are_summed_in_blocks():
    x = torch.rand(2, 3 * decompositions.BLOCK, dtype=torch.float64) + 5
    weight, bias = torch.rand(2, x.shape[1], dtype=torch.float64)
    result = norms.layer_norm(x, [x.shape[1]], weight, bias, 1e-5)
    expected = torch.nn.functional.layer_norm(x, [x.shape[1]], weight, bias)
    torch.testing.assert_close(result, expected)
    model = torch.nn.LayerNorm(x.shape[1]).float()
    program = torch.export.export(model, (x.float(),), strict=False)
    names = [str(n.target) for n in program.run_decompositions(norms.TABLE).graph.nodes]
    assert names.count("aten.sum.dim_IntList") == 4  # blocks, then rows: for mean and variance


def test_norms_match_eager_in_f64():
    x = torch.rand(2, 6, 3, 7, dtype=torch.float64)
    weight, bias = torch.rand(6, dtype=torch.float64), torch.rand(6, dtype=torch.float64)
    torch.testing.assert_close(
        norms.group_norm(x, 3, weight, bias, 1e-5),
        torch.nn.functional.group_norm(x, 3, weight, bias, 1e-5),
    )
    torch.testing.assert_close(
        norms.instance_norm(x, None, None, None, None, True, 0.1, 1e-5, False),
        torch.nn.functional.instance_norm(x),
    )
    mean, var = torch.rand(6, dtype=torch.float64), torch.rand(6, dtype=torch.float64) + 0.5
    torch.testing.assert_close(
        norms.batch_norm(x, weight, bias, mean, var, False, 0.1, 1e-5, False),
        torch.nn.functional.batch_norm(x, mean, var, weight, bias, training=False),
    )


def test_an_inference_batch_norm_is_imported_as_one_pass_with_a_scale_per_channel():
    """torch.export makes an eval-mode batch norm `_native_batch_norm_legit_no_training`, which
    kbd decomposes (torch's own decomposition divides by a square root, which torch-mlir lowers
    with an assert per element); the one pass matches eager."""
    model = torch.nn.BatchNorm2d(4).eval()
    with torch.no_grad():
        model.running_mean.uniform_(-1, 1)
        model.running_var.uniform_(0.5, 2)
        model.weight.uniform_(-1, 1)
        model.bias.uniform_(-1, 1)
    x = torch.rand(2, 4, 3, 5)
    program = torch.export.export(model, (x,), strict=False)
    decomposed = program.run_decompositions(norms.TABLE)
    names = [str(n.target) for n in decomposed.graph.nodes if n.op == "call_function"]
    assert "aten.rsqrt.default" in names
    assert "aten.sqrt.default" not in names and "aten.reciprocal.default" not in names
    torch.testing.assert_close(decomposed.module()(x), model(x))


def test_norms_that_update_running_statistics_or_are_not_float_are_left_to_torch():
    x = torch.rand(2, 4, 3, 3)
    mean, var = torch.zeros(4), torch.ones(4)
    assert norms.batch_norm(x, None, None, mean, var, True, 0.1, 1e-5, False) is NotImplemented
    tracked = norms.instance_norm(x, None, None, mean, var, True, 0.1, 1e-5, False)
    assert tracked is NotImplemented
    assert norms.layer_norm(x.half(), [3, 3]) is NotImplemented
    assert norms.group_norm(x, 3) is NotImplemented  # 4 channels do not split into 3 groups


class SumAndMatmul(torch.nn.Module):
    def forward(self, x, w):
        return torch.softmax(x @ w, dim=-1).sum(dim=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_ops_accumulate_in_f32_and_round_once(dtype):
    """bf16 and f16 products, softmax and sums run on f32 copies of their operands (as eager's
    CPU kernels do) and round back once: the graph's results match eager in the low type far
    better than accumulating in it would, and keep the type."""
    from kbd.worker.mlir.importer import decomposition_table

    x, w = torch.randn(64, 512, dtype=dtype), torch.randn(512, 256, dtype=dtype)
    exported = torch.export.export(SumAndMatmul(), (x, w), strict=False)
    program = exported.run_decompositions(decomposition_table())
    products = [n for n in program.graph.nodes if n.target == torch.ops.aten.mm.default]
    assert [n.meta["val"].dtype for n in products] == [torch.float32]
    result = program.module()(x, w)
    assert result.dtype == dtype
    expected = SumAndMatmul()(x, w)
    torch.testing.assert_close(result.float(), expected.float(), rtol=1e-2, atol=1e-2)
    sums = [n for n in program.graph.nodes if n.target == torch.ops.aten.sum.dim_IntList]
    assert [n.meta["val"].dtype for n in sums] == [torch.float32]
