"""Element types (`--dtype`): retyping entries, the tolerance rule, and real runs in bf16 of a
kernel that runs, one with nothing floating-point in it and one eager cannot run in bf16."""

from __future__ import annotations

import pytest

from kbd.plan import catalog, spec
from kbd.plan.spec import SweepSpec
from kbd.shared.protocol import Scalar, Tensor
from kbd.shared.shapes import Shape
from tests.conftest import FIXTURE_KB, ROOT, json_records, kbd

DTYPES_LEVELS = ROOT / "tests" / "fixtures" / "dtypes.yaml"


def test_with_dtype_retypes_floating_inputs_and_outputs_and_keeps_integers():
    entry = catalog.Entry(
        "level1/k.py",
        "l.yaml",
        [Tensor(Shape((8, 4), "f32", "randn")), Tensor(Shape((8,), "i64", "rnd10")), Scalar(2.5)],
        [Shape((8, 4), "f32")],
        None,
        1e-6,
        None,
        "f32",
        None,
    )
    cast = catalog.with_dtype(entry, "bf16")
    assert cast.dtype == "bf16"
    assert [i.shape.dtype for i in cast.inputs[:2]] == ["bf16", "i64"]
    assert cast.inputs[2] == Scalar(2.5) and cast.outputs == [Shape((8, 4), "bf16")]
    assert catalog.with_dtype(cast, "f32") == entry


def test_low_precision_types_are_checked_with_at_least_their_floor():
    options = SweepSpec()
    assert options.tolerance_for("f32") == options.tolerance == 0.01
    assert options.tolerance_for("f64") == 0.01
    for dtype, floor in spec.TOLERANCE_FLOOR.items():
        assert options.tolerance_for(dtype) == max(0.01, floor)
        assert SweepSpec(tolerance=0.5).tolerance_for(dtype) == 0.5  # a looser --tolerance wins
    assert set(spec.TOLERANCE_FLOOR) == set(spec.DTYPES) - {"f32"}


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("bf16")
    args = ["--kernelbench", str(FIXTURE_KB), "--levels", str(DTYPES_LEVELS), "--json"]
    return kbd("run", *args, "--dtype", "bf16", cwd=cwd)


def test_a_kernel_runs_and_is_checked_in_bf16(bf16_run):
    assert bf16_run.returncode == 0, bf16_run.stderr
    record = json_records(bf16_run.stdout)["level1/2_relu_scale"]
    assert (record["outcome"], record["dtype"]) == ("pass", "bf16")
    assert record["passing_tolerance"] == spec.TOLERANCE_FLOOR["bf16"]


def test_kernels_that_cannot_run_in_bf16_are_skipped_with_the_reason(bf16_run):
    records = json_records(bf16_run.stdout)
    integers = records["level8/1_integer_count"]
    assert (integers["outcome"], integers["dtype"]) == ("skipped", "bf16")
    assert integers["message"] == "not run in bf16: nothing in it is floating-point"
    det = records["level8/2_determinant"]
    assert (det["outcome"], det["phase"]) == ("skipped", "reference")
    assert det["message"].startswith("not run in bf16: eager cannot run it:")
    assert "BFloat16" in det["message"]
