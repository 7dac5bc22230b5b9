"""Sizes, memory estimates and thread environment (supervisor side)."""

from __future__ import annotations

import pytest

from kbd.plan.catalog import Entry
from kbd.plan.limits import WORKER_BASE_BYTES, estimate, format_size, parse_size, thread_env
from kbd.shared.errors import InputError
from kbd.shared.protocol import Scalar, Tensor
from kbd.shared.shapes import Shape


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiB", 2 << 30),
        ("512M", 512_000_000),
        ("1.5g", 1_500_000_000),
        ("1000000", 1_000_000),
        ("1KiB", 1024),
        ("1kib", 1024),
        ("3MiB", 3 << 20),
        ("1TiB", 1 << 40),
        ("2t", 2 * 10**12),
        ("4kb", 4000),
        ("7MB", 7_000_000),
        ("1GB", 10**9),
        ("100b", 100),
        ("100B", 100),
        (" 64 k ", 64_000),
        (".5G", 500_000_000),
        ("0.5KiB", 512),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text, "--mem-limit") == expected


@pytest.mark.parametrize(
    "text", ["", "abc", "GiB", "2 GiBs", "2XB", "-1G", "1.5.2G", "1e9", "2 G B", "1,5G"]
)
def test_parse_size_not_a_size(text):
    with pytest.raises(InputError) as info:
        parse_size(text, "--mem-limit")
    assert str(info.value) == (f"--mem-limit: {text!r} is not a size like 2GiB, 512M or 1000000")


@pytest.mark.parametrize("text", ["0", "0G", "0.0001", "0.5b"])
def test_parse_size_must_be_positive(text):
    with pytest.raises(InputError, match=r"^--budget: size must be positive$"):
        parse_size(text, "--budget")


@pytest.mark.parametrize(("text", "expected"), [("2.01k", 2010), ("2.01G", 2_010_000_000)])
def test_parse_size_decimal_fraction_is_exact(text, expected):
    assert parse_size(text, "--mem-limit") == expected


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "-"),
        (0, "0 B"),
        (512, "512 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (5 << 20, "5.0 MiB"),
        (int(2.5 * (1 << 30)), "2.5 GiB"),
        (3 << 40, "3072.0 GiB"),
        (10.7, "11 B"),
    ],
)
def test_format_size(n, text):
    assert format_size(n) == text


def make_entry(inputs, outputs) -> Entry:
    return Entry(
        kernel="level1/1_K.py",
        levels_file="levels.yaml",
        inputs=inputs,
        outputs=outputs,
        init_args=None,
        gflops=None,
        pipeline=None,
        dtype="f32",
        xfail=None,
    )


def tensor(*dims: int, dtype: str = "f32") -> Tensor:
    return Tensor(Shape(dims, dtype, "rnd"))


def test_estimate_without_shapes_is_the_base():
    assert estimate(make_entry(None, None)) == WORKER_BASE_BYTES


def test_estimate_counts_inputs_and_outputs():
    entry = make_entry([tensor(1024, 1024), Scalar(2.0)], [Shape((256,), "f64")])
    assert estimate(entry) == WORKER_BASE_BYTES + 2 * (4 << 20) + 2 * 256 * 8


def test_estimate_grows_with_input_size():
    out = [Shape((16,), "f32")]
    small = estimate(make_entry([tensor(64, 64)], out))
    large = estimate(make_entry([tensor(1024, 1024)], out))
    more = estimate(make_entry([tensor(1024, 1024), tensor(1024, 1024)], out))
    assert WORKER_BASE_BYTES < small < large < more


def test_estimate_grows_with_output_size():
    inputs = [tensor(16)]
    small = estimate(make_entry(inputs, [Shape((64, 64), "f32")]))
    large = estimate(make_entry(inputs, [Shape((1024, 1024), "f32")]))
    two = estimate(make_entry(inputs, [Shape((1024, 1024), "f32")] * 2))
    assert small < large < two
    assert two - large == 2 * (4 << 20)


def test_estimate_ignores_scalars():
    base = estimate(make_entry([tensor(8)], [Shape((), "f32")]))
    assert estimate(make_entry([tensor(8), Scalar(1), Scalar(2.5)], [Shape((), "f32")])) == base


def test_estimate_without_outputs_assumes_largest_input():
    entry = make_entry([tensor(100), tensor(10, 10, 10, dtype="f64"), Scalar(1.0)], None)
    inputs = 100 * 4 + 1000 * 8
    assert estimate(entry) == WORKER_BASE_BYTES + 2 * inputs + 2 * 1000 * 8


def test_estimate_scalar_only_without_outputs():
    assert estimate(make_entry([Scalar(1.0)], None)) == WORKER_BASE_BYTES


def test_thread_env():
    assert thread_env(3) == {
        "OMP_NUM_THREADS": "3",
        "MKL_NUM_THREADS": "3",
        "OPENBLAS_NUM_THREADS": "3",
    }
