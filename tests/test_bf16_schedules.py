"""bf16 schedules: the avx512_bf16 matmul and batch-matmul schedules read bf16 inputs as bf16
and multiply them with vdpbf16ps where the product allows it (the f32 schedule takes the rest),
match eager bf16 on every shape, and the rewrite that flattens whole-tensor transfers flattens
only contiguous ones."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from torch_mlir import ir

from kbd.plan import descriptor, spec, target
from kbd.worker import ingress, mlir
from kbd.worker.mlir import rewrites
from tests.test_schedules import SCHEDULES, Bmm, LinearRelu, Matmul, TwoMatmuls

ARCH, HOST_FEATURES = descriptor.host_target()
BF16 = SCHEDULES / "x86_64" / "avx512_bf16"

# (schedule, module, input shapes, whether its products run on vdpbf16ps)
MATMUL_CASES = [
    (Matmul, [(64, 64), (64, 64)], True),  # whole register tiles and panels
    (Matmul, [(100, 64), (64, 1000)], True),  # rows padded to whole tiles, a padded panel
    (Matmul, [(13, 70), (70, 1)], True),  # one column: one panel, mostly padding
    (Matmul, [(20, 1100), (1100, 40)], True),  # padded rows and a K loop of three blocks
    (TwoMatmuls, [(40, 32), (32, 32)], True),  # the second product's A is a bf16 ReLU
    (Matmul, [(37, 37), (37, 37)], False),  # odd K: not packed by two, the f32 schedule
    (LinearRelu, [(8, 64), (48, 64), (48,)], False),  # a few rows: the weight read in place
    (LinearRelu, [(130, 64), (48, 64), (48,)], True),  # the transposed weight packed
]
BATCH_MATMUL_CASES = [
    (Bmm, [(2, 64, 32), (2, 32, 64)], True),
    (Bmm, [(3, 20, 24), (3, 24, 37)], True),  # partial tiles in M and N
    (Bmm, [(2, 12, 600), (2, 600, 32)], True),  # padded rows and a K loop
    (Bmm, [(2, 8, 7), (2, 7, 16)], False),  # odd K
    (Matmul, [(16, 32), (32, 16)], False),  # a plain matmul: not this schedule's, f32
]
CASES = [(BF16 / "matmul" / "bf16.yaml", *case) for case in MATMUL_CASES] + [
    (BF16 / "batch_matmul" / "bf16.yaml", *case) for case in BATCH_MATMUL_CASES
]


def _lower(schedule, module_class, shapes):
    torch.manual_seed(0)
    args = [torch.randn(shape).to(torch.bfloat16) for shape in shapes]
    module = mlir.import_model(module_class(), args)
    out_types, _ = mlir.results_to_out_params(module)
    stages = descriptor.resolve_pipeline([str(schedule)], schedules_dir=SCHEDULES, cwd=Path("/"))
    for stage in stages:
        mlir.apply_stage(module, stage)
    return module, args, out_types


@pytest.mark.parametrize(
    ("schedule", "module_class", "shapes", "dot"),
    CASES,
    ids=[f"{c[0].parent.name}-{c[2]}" for c in CASES],
)
def test_bf16_schedule_uses_dot_products_where_it_can_and_matches_eager(
    schedule, module_class, shapes, dot, tmp_path
):
    module, args, out_types = _lower(schedule, module_class, shapes)
    assert ("llvm.x86.avx512bf16.dpbf16ps.512" in str(module)) == dot
    if ARCH != "x86_64" or "avx512_bf16" not in HOST_FEATURES:
        mlir.set_target_features(module, target.LLVM_FEATURES["avx512_bf16"])
        compiled = mlir.Compiled(module, 3, openmp=True)
        compiled.write_object(tmp_path / "kernel.o")
        assert (tmp_path / "kernel.o").stat().st_size > 0
        return
    compiled = mlir.Compiled(module, 3, openmp=True)
    outputs = [np.zeros(t.dims, ml_dtypes.bfloat16) for t in out_types]
    compiled([*outputs, *ingress.buffers_from_args(args)])
    expected = module_class()(*args).float().numpy()
    tolerance = spec.TOLERANCE_FLOOR["bf16"]
    np.testing.assert_allclose(
        outputs[0].astype(np.float32), expected, rtol=tolerance, atol=tolerance
    )


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump")
def test_bf16_matmul_compiles_to_vdpbf16ps_on_any_x86_host(tmp_path):
    module, _, _ = _lower(BF16 / "matmul" / "bf16.yaml", Matmul, [(64, 64), (64, 64)])
    mlir.set_target_features(module, target.LLVM_FEATURES["avx512_bf16"])
    mlir.Compiled(module, 3, openmp=True).write_object(tmp_path / "kernel.o")
    assembly = subprocess.run(
        ["objdump", "-d", str(tmp_path / "kernel.o")], capture_output=True, text=True, check=True
    ).stdout
    assert "vdpbf16ps" in assembly


FLATTEN = """
func.func @f(%big: tensor<4x32x2xbf16>, %c: tensor<16x4x32xf32>, %i: index)
    -> (vector<1x32x2xbf16>, vector<8x1x32xf32>, tensor<4x32x2xbf16>) {
  %c0 = arith.constant 0 : index
  %pad = arith.constant 0.0 : bf16
  %padf = arith.constant 0.0 : f32
  %panel = tensor.extract_slice %big[%i, 0, 0] [1, 32, 2] [1, 1, 1]
    : tensor<4x32x2xbf16> to tensor<1x32x2xbf16>
  %b = vector.transfer_read %panel[%c0, %c0, %c0], %pad {in_bounds = [true, true, true]}
    : tensor<1x32x2xbf16>, vector<1x32x2xbf16>
  %tile = tensor.extract_slice %c[0, %i, 0] [8, 1, 32] [1, 1, 1]
    : tensor<16x4x32xf32> to tensor<8x1x32xf32>
  %acc = vector.transfer_read %tile[%c0, %c0, %c0], %padf {in_bounds = [true, true, true]}
    : tensor<8x1x32xf32>, vector<8x1x32xf32>
  %half = tensor.extract_slice %big[%i, 0, 0] [1, 16, 2] [1, 1, 1]
    : tensor<4x32x2xbf16> to tensor<1x16x2xbf16>
  %v = vector.transfer_read %half[%c0, %c0, %c0], %pad {in_bounds = [true, true, true]}
    : tensor<1x16x2xbf16>, vector<1x16x2xbf16>
  %written = vector.transfer_write %v, %half[%c0, %c0, %c0] {in_bounds = [true, true, true]}
    : vector<1x16x2xbf16>, tensor<1x16x2xbf16>
  %back = tensor.insert_slice %written into %big[%i, 0, 0] [1, 16, 2] [1, 1, 1]
    : tensor<1x16x2xbf16> into tensor<4x32x2xbf16>
  return %b, %acc, %back : vector<1x32x2xbf16>, vector<8x1x32xf32>, tensor<4x32x2xbf16>
}
"""


def test_only_transfers_of_contiguous_whole_tensors_are_flattened():
    """A 1 x 32 x 2 panel of 4 x 32 x 2 and a 1 x 16 x 2 slice of it are one run of memory each
    (read and written as one vector); an 8 x 1 x 32 tile of 16 x 4 x 32 is 8 runs and is left
    as it is (flattening it would make bufferization copy it)."""
    with ir.Context(), ir.Location.unknown():
        module = ir.Module.parse(FLATTEN)
        assert rewrites.flatten_whole_tensor_transfers(module) == 3
        module.operation.verify()
        text = str(module)
    assert "vector.transfer_read %collapsed" in text and "vector<64xbf16>" in text
    assert "vector<32xbf16>" in text and "tensor.expand_shape" in text
    assert "vector<8x1x32xf32>" in text and "tensor<256xf32>" not in text
