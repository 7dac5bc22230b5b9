"""Shape strings: grammar, defaults, sizes and every validation error."""

from __future__ import annotations

import pytest

from kbd.shared.errors import InputError
from kbd.shared.shapes import Shape, int_range, parse_dims, parse_shape, validate

WHERE = "levels/x.yaml: level1/1_K.py: input_shapes[0]"


def error(text: str, **defaults: str) -> str:
    with pytest.raises(InputError) as info:
        parse_shape(text, WHERE, **defaults)
    message = str(info.value)
    assert WHERE in message
    assert "\n" not in message
    return message


# --- grammar ---------------------------------------------------------------------------------


def test_dims_only_takes_defaults():
    assert parse_shape("64x128", WHERE) == Shape((64, 128), "f32", "0")


def test_single_dimension():
    assert parse_shape("7", WHERE) == Shape((7,), "f32", "0")


def test_dims_only_takes_given_defaults():
    assert parse_shape("3x4", WHERE, "i64", "rnd") == Shape((3, 4), "i64", "rnd")


def test_dims_and_type_keep_default_init():
    assert parse_shape("2x3x4xbf16", WHERE, "f32", "rnd") == Shape((2, 3, 4), "bf16", "rnd")


def test_dims_type_init():
    assert parse_shape("64x128xf16xrandn", WHERE) == Shape((64, 128), "f16", "randn")


def test_explicit_parts_override_defaults():
    assert parse_shape("8x8xf64xid", WHERE, "i32", "rnd") == Shape((8, 8), "f64", "id")


def test_surrounding_whitespace_is_ignored():
    assert parse_shape("  16x2xi8x1 ", WHERE) == Shape((16, 2), "i8", "1")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10xi64xrnd", Shape((10,), "i64", "rnd")),
        ("10xi64xrnd1000", Shape((10,), "i64", "rnd1000")),
        ("10xi1xrnd", Shape((10,), "i1", "rnd")),
        ("4x4xf32xtriu", Shape((4, 4), "f32", "triu")),
        ("2x4x3xf32xtril", Shape((2, 4, 3), "f32", "tril")),
        ("5x5xi32xid", Shape((5, 5), "i32", "id")),
    ],
)
def test_accepted_inits(text, expected):
    assert parse_shape(text, WHERE) == expected


def test_str_round_trips():
    shape = parse_shape("3x4xi16xrnd7", WHERE)
    assert str(shape) == "3x4xi16xrnd7"
    assert parse_shape(str(shape), WHERE) == shape


def test_int_range():
    assert int_range("rnd12") == 12
    assert int_range("rnd") is None
    assert int_range("randn") is None
    assert int_range("rndx") is None


def test_parse_dims():
    assert parse_dims("64x128", WHERE) == (64, 128)
    assert parse_dims(" 5 ", WHERE) == (5,)


# --- nbytes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "nbytes"),
    [
        (Shape((64, 128), "f32"), 64 * 128 * 4),
        (Shape((3,), "f64"), 24),
        (Shape((2, 3), "bf16"), 12),
        (Shape((2, 3), "f16"), 12),
        (Shape((10,), "i64"), 80),
        (Shape((10,), "i16"), 20),
        (Shape((7, 3), "i8"), 21),
        (Shape((7, 3), "i1"), 21),
        (Shape((), "f32"), 4),
    ],
)
def test_nbytes(shape, nbytes):
    assert shape.nbytes == nbytes


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["64xabc", "4x?"])
def test_parse_dims_bad_dimensions(text):
    with pytest.raises(InputError, match="bad dimensions") as info:
        parse_dims(text, WHERE)
    assert WHERE in str(info.value)


@pytest.mark.parametrize("text", ["0", "4x0", "0x4x4"])
def test_parse_dims_zero_dimension(text):
    with pytest.raises(InputError, match="must be positive") as info:
        parse_dims(text, WHERE)
    assert WHERE in str(info.value)


def test_parse_dims_negative_dimension():
    with pytest.raises(InputError, match="must be positive"):
        parse_dims("4x-2", WHERE)


@pytest.mark.parametrize("text", ["f32", "", "xf32", "f32x64"])
def test_no_dimensions(text):
    assert "has no dimensions" in error(text)


@pytest.mark.parametrize("text", ["0x4", "4x0xf32", "4x0xf32xrnd"])
def test_zero_dimension(text):
    assert "must be positive" in error(text)


def test_too_many_parts():
    assert "is not DIMSxTYPExINIT" in error("4x4xf32xrndxextra")


@pytest.mark.parametrize("text", ["4xf8", "4xfloat", "4xF32xrnd", "4x-1"])
def test_unknown_type(text):
    message = error(text)
    assert "unknown element type" in message
    assert "f32" in message  # lists the known types


def test_unknown_default_type():
    assert "unknown element type 'f128'" in error("4", default_dtype="f128")


@pytest.mark.parametrize("text", ["4xf32xrandom", "4xf32x2", "4xi32xrnd-3", "4xi32xRND"])
def test_unknown_init(text):
    assert "unknown initialization" in error(text)


def test_unknown_default_init():
    assert "unknown initialization 'ones'" in error("4", default_init="ones")


@pytest.mark.parametrize("dtype", ["f64", "f32", "f16", "bf16"])
def test_int_range_on_float(dtype):
    assert "needs an integer element type" in error(f"4x{dtype}xrnd5")


@pytest.mark.parametrize("text", ["4x5xf32xid", "4xf32xid", "2x2x2xf32xid"])
def test_id_needs_square_2d(text):
    assert "'id' needs a square 2-D shape" in error(text)


@pytest.mark.parametrize("init", ["triu", "tril"])
def test_triangular_needs_2d(init):
    assert "needs at least 2 dimensions" in error(f"8xf32x{init}")


def test_validate_names_where():
    with pytest.raises(InputError, match=r"^somewhere: unknown element type"):
        validate(Shape((2,), "c64"), "somewhere")


def test_int_range_zero_is_rejected():
    error("4xi32xrnd0")
