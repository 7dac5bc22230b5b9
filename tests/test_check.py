"""Comparing compiled outputs with the eager reference (numpy only)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kbd.worker.check import compare


def arr(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_exact_match_passes():
    c = compare([arr(1, 2, 3)], [arr(1, 2, 3)], 1e-4, 0.1)
    assert c.passed
    assert c.passing_tolerance == 1e-4
    assert c.max_abs_error == 0.0
    assert c.max_rel_error == 0.0
    assert c.message == ""


def test_passes_within_tolerance():
    ref = np.array([1.0, 100.0])
    out = np.array([1.005, 101.0])  # |diff| <= tol + tol * |ref| at tol 0.01
    c = compare([ref], [out], 0.01, 0.1)
    assert c.passed
    assert c.passing_tolerance == 0.01
    assert c.max_abs_error == pytest.approx(1.0)
    assert c.max_rel_error == pytest.approx(0.01)


def test_mismatch_reports_smallest_passing_tolerance():
    c = compare([np.array([1.0, 2.0])], [np.array([1.05, 2.0])], 0.01, 1.0)
    assert not c.passed
    assert c.passing_tolerance == 0.1
    assert c.max_abs_error == pytest.approx(0.05)
    assert c.max_rel_error == pytest.approx(0.05)
    assert c.message == (
        "max abs error 0.05, max rel error 0.05; fails at tolerance 0.01, passes at 0.1"
    )


def test_mismatch_passing_exactly_at_max_tolerance():
    c = compare([np.array([1.0])], [np.array([1.05])], 1e-4, 0.1)
    assert not c.passed
    assert c.passing_tolerance == 0.1
    assert c.message.endswith("fails at tolerance 0.0001, passes at 0.1")


def test_mismatch_fails_even_at_max_tolerance():
    c = compare([np.array([1.0, 2.0])], [np.array([1.0, 7.0])], 1e-4, 0.1)
    assert not c.passed
    assert c.passing_tolerance is None
    assert c.max_abs_error == pytest.approx(5.0)
    assert c.max_rel_error == pytest.approx(2.5)
    assert c.message.endswith("fails at tolerance 0.0001, fails even at 0.1")


def test_worst_output_decides():
    ref = [np.zeros(3), np.ones(2)]
    out = [np.zeros(3), np.array([1.0, 1.5])]
    c = compare(ref, out, 1e-3, 1.0)
    assert not c.passed
    assert c.passing_tolerance == 1.0
    assert c.max_abs_error == pytest.approx(0.5)


def test_shape_mismatch():
    c = compare([np.zeros((2, 3))], [np.zeros((3, 2))], 1e-4, 0.1)
    assert not c.passed
    assert c.passing_tolerance is None
    assert math.isinf(c.max_abs_error)
    assert c.message == "output 0 has shape (3, 2), eager has (2, 3)"


def test_broadcastable_shape_is_still_a_mismatch():
    c = compare([np.zeros((4, 1)), np.zeros((4, 4))], [np.zeros((4, 1)), np.zeros(4)], 1e-4, 0.1)
    assert not c.passed
    assert c.message == "output 1 has shape (4,), eager has (4, 4)"


def test_output_count_mismatch():
    c = compare([np.zeros(2)], [np.zeros(2), np.zeros(2)], 1e-4, 0.1)
    assert not c.passed
    assert c.passing_tolerance is None
    assert math.isinf(c.max_rel_error)
    assert c.message == "2 outputs, eager has 1"


def test_nan_equals_nan():
    ref = np.array([np.nan, 1.0])
    c = compare([ref], [np.array([np.nan, 1.0], dtype=np.float32)], 1e-4, 0.1)
    assert c.passed
    assert c.passing_tolerance == 1e-4
    assert c.max_abs_error == 0.0


def test_nan_equals_nan_has_no_relative_error():
    c = compare([np.array([np.nan, 1.0])], [np.array([np.nan, 1.0])], 1e-4, 0.1)
    assert c.passed
    assert c.max_rel_error == 0.0


def test_nan_against_number_fails():
    c = compare([np.array([1.0])], [np.array([np.nan])], 1e-4, 0.1)
    assert not c.passed
    assert c.passing_tolerance is None
    assert math.isinf(c.max_abs_error)


def test_zero_dimensional():
    assert compare([np.array(2.0)], [np.array(2.0, dtype=np.float32)], 1e-4, 0.1).passed
    c = compare([np.array(2.0)], [np.array(2.1)], 1e-4, 0.1)
    assert not c.passed
    assert c.passing_tolerance == 0.1
    assert c.max_abs_error == pytest.approx(0.1)


def test_zero_dimensional_against_one_element():
    c = compare([np.array(2.0)], [np.array([2.0])], 1e-4, 0.1)
    assert not c.passed
    assert "shape (1,)" in c.message


def test_empty_outputs():
    c = compare([np.zeros((0, 3))], [np.zeros((0, 3), dtype=np.float32)], 1e-4, 0.1)
    assert c.passed
    assert c.max_abs_error == 0.0


def test_integer_and_bool_outputs():
    assert compare([np.array([1, 2])], [np.array([1, 2], dtype=np.int64)], 1e-4, 0.1).passed
    assert compare([np.array([True])], [np.array([True])], 1e-4, 0.1).passed
    assert not compare([np.array([True])], [np.array([False])], 1e-4, 0.1).passed


def test_matching_infinities_have_no_error():
    c = compare([np.array([1.0, -np.inf])], [np.array([1.0, -np.inf])], 1e-4, 0.1)
    assert c.passed
    assert c.max_abs_error == 0.0


def test_large_outputs_are_compared_without_float64_copies():
    """The check works in chunks: its peak memory is far below one float64 copy of an output."""
    import tracemalloc

    ref = np.ones(8 << 20, dtype=np.float32)  # 32 MiB; a float64 copy would be 64 MiB
    out = ref.copy()
    out[-1] = 2.0  # in the last chunk
    tracemalloc.start()
    try:
        c = compare([ref], [out], 0.01, 1.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not c.passed and c.max_abs_error == 1.0 and c.passing_tolerance == 1.0
    assert peak < 16 << 20
