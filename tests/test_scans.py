"""Scans (cumsum, cumprod) become loops at import (kbd.worker.mlir.scans), which every pipeline
lowers: checked here through the default scalar pipeline (the family schedule's cases are in
test_schedules.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from kbd.plan import descriptor
from kbd.worker import ingress, mlir

SCHEDULES = Path(__file__).resolve().parent.parent / "schedules"


class Scans(torch.nn.Module):
    """A masked cumsum, the count of a mask so far (int64), a cumprod over the outer dim and a
    reverse cumsum."""

    def forward(self, x, mask):
        return (
            torch.cumsum(x * mask, 1),
            torch.cumsum(mask, 1),
            torch.cumprod(x, 0),
            torch.cumsum(x.flip(1), 1).flip(1),
        )


def compile_and_run(model, args, pipeline: str):
    module = mlir.import_model(model, args)
    assert "tm_tensor" not in str(module)
    out_types, _ = mlir.results_to_out_params(module)
    stages = descriptor.resolve_pipeline([pipeline], schedules_dir=SCHEDULES, cwd=SCHEDULES)
    for stage in stages:
        mlir.apply_stage(module, stage)
    compiled = mlir.Compiled(module, 2)
    outputs = [np.zeros(t.dims, ingress.NUMPY_DTYPES[t.dtype]) for t in out_types]
    compiled([*outputs, *ingress.buffers_from_args(args)])
    return outputs


@pytest.mark.parametrize("columns", [1, 16, 70])
def test_scans_through_the_scalar_pipeline_match_eager(columns):
    torch.manual_seed(0)
    args = [torch.rand(5, columns) + 0.5, torch.rand(5, columns) < 0.5]
    outputs = compile_and_run(Scans(), args, "scalar-lowering.yaml")
    for got, expected in zip(outputs, Scans()(*args), strict=True):
        assert got.dtype == expected.numpy().dtype
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-5)


class Cumsum(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.cumsum(x, self.dim)


@pytest.mark.parametrize(
    ("shape", "dim"), [((40,), 0), ((3, 4, 5, 1), 1), ((2, 3, 4, 5), 2), ((1, 1), 1)]
)
def test_a_scan_along_any_dim_of_any_rank_matches_eager(shape, dim):
    torch.manual_seed(0)
    x = torch.randn(shape)
    (got,) = compile_and_run(Cumsum(dim), [x], "scalar-lowering.yaml")
    np.testing.assert_allclose(got, torch.cumsum(x, dim).numpy(), rtol=1e-5, atol=1e-5)
