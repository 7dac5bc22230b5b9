"""Input buffers mean what KernelBench means: masks, class indices, triangles, probabilities."""

from __future__ import annotations

import numpy as np
import pytest

from kbd.shared.protocol import Scalar, Tensor
from kbd.shared.shapes import Shape
from kbd.worker import ingress


def buffer(text: str) -> np.ndarray:
    dims, dtype, init = text.rsplit("x", 2)[0], *text.rsplit("x", 2)[1:]
    shape = Shape(tuple(int(d) for d in dims.split("x")), dtype, init)
    return ingress.make_buffer(shape, np.random.default_rng(0))


def test_integer_rnd_gives_usable_class_indices():
    values = buffer("1000xi64xrnd7")
    assert values.dtype == np.int64
    assert values.min() == 0 and values.max() == 6
    assert len(np.unique(buffer("1000xi32xrnd"))) == 10


def test_bool_mask_is_random():
    mask = buffer("1000xi1xrnd")
    assert mask.dtype == np.bool_ and 300 < mask.sum() < 700


@pytest.mark.parametrize(("init", "check"), [
    ("triu", lambda m: np.array_equal(m, np.triu(m)) and m[0, -1] > 0),
    ("tril", lambda m: np.array_equal(m, np.tril(m)) and m[-1, 0] > 0),
    ("sym", lambda m: np.array_equal(m, m.T)),
    ("id", lambda m: np.array_equal(m, np.eye(6))),
    ("sign", lambda m: set(np.unique(m)) == {-1.0, 1.0}),
    ("prob", lambda m: np.allclose(m.sum(-1), 1) and (m > 0).all()),
    ("randn", lambda m: (m < 0).any()),
    ("rnd", lambda m: ((m >= 0) & (m < 1)).all()),
])  # fmt: skip
def test_float_inits(init, check):
    values = buffer(f"6x6xf32x{init}")
    assert values.dtype == np.float32
    assert check(values)


def test_inputs_are_seeded_and_shared_with_torch():
    specs = [Tensor(Shape((4, 4), "f32", "rnd")), Scalar(2.5)]
    args, buffers = ingress.make_inputs(specs, seed=3)
    again, _ = ingress.make_inputs(specs, seed=3)
    assert args[1] == 2.5 and len(buffers) == 1
    assert np.array_equal(args[0].numpy(), again[0].numpy())
    buffers[0][0, 0] = 42.0
    assert args[0][0, 0].item() == 42.0  # zero-copy: the compiled code sees the same memory


def test_bf16_buffers_reach_torch_as_bfloat16():
    args, _ = ingress.make_inputs([Tensor(Shape((2, 3), "bf16", "rnd"))], seed=0)
    assert str(args[0].dtype) == "torch.bfloat16"


def test_weights_become_arguments_not_constants():
    """Lifted parameters keep multi-megabyte weights out of the IR (and out of compile memory)."""
    import torch

    from kbd.worker import mlir

    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.BatchNorm1d(32)).eval()
    x = torch.rand(4, 64)
    lifted, args = ingress.lift_parameters(model, [x])
    assert len(args) == 1 + 7  # 2 Linear params, 2 BN params, 3 BN buffers, then x
    with torch.no_grad():
        assert torch.equal(lifted(*args), model(x))
    module = mlir.import_model(lifted, args)
    text = str(module)
    assert "dense_resource" not in text
    outputs, inputs = mlir.results_to_out_params(module)
    assert [t.dims for t in outputs] == [(4, 32)]
    assert (32, 64) in [t.dims for t in inputs] and (4, 64) in [t.dims for t in inputs]


@pytest.mark.parametrize(("declared", "ok"), [((), True), ((1,), True), ((2,), False)])
def test_declared_output_against_a_0d_result(declared, ok):
    """A levels entry's output `scalar` matches a 0-d result, and so does `1`, lighthouse's way
    of writing a loss's result (a one-element buffer); any other shape is an error."""
    from types import SimpleNamespace

    from kbd.worker import job as worker_job
    from kbd.worker.mlir import BufferType

    job = SimpleNamespace(outputs=[Shape(declared, "f32")])
    signature = (job, [BufferType((), "f32")], [], [np.float32(0)], [])
    if ok:
        worker_job._check_signature(*signature)
    else:
        with pytest.raises(ValueError, match="levels entry says 2, the kernel returns scalar"):
            worker_job._check_signature(*signature)
