"""Compare compiled outputs with the eager reference."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CHUNK = 1 << 16  # elements compared at a time: the check needs ~10 float64 temporaries of it


@dataclass(frozen=True)
class Comparison:
    passed: bool
    # The smallest tolerance of the form requested * 10**k (k >= 0, up to max_tolerance) that
    # passes; None when none does.
    passing_tolerance: float | None
    max_abs_error: float
    max_rel_error: float
    message: str


def compare(
    reference: list[np.ndarray], actual: list[np.ndarray], tolerance: float, max_tolerance: float
) -> Comparison:
    """`allclose(rtol=atol=tolerance)` on every output, as the reference tool does, without
    copying whole outputs: |a - r| <= t + t|r| for all elements is max(|a - r| / (1 + |r|)) <= t.

    Deliberate differences: shapes must match exactly (no broadcasting), and NaN equals NaN
    (a kernel whose eager result is NaN, e.g. log of a negative, is not a mismatch).
    """
    if len(reference) != len(actual):
        return Comparison(
            False,
            None,
            float("inf"),
            float("inf"),
            f"{len(actual)} outputs, eager has {len(reference)}",
        )
    for i, (r, a) in enumerate(zip(reference, actual, strict=True)):
        if np.shape(r) != np.shape(a):
            return Comparison(
                False,
                None,
                float("inf"),
                float("inf"),
                f"output {i} has shape {np.shape(a)}, eager has {np.shape(r)}",
            )
    max_abs, max_rel, needed = _errors(reference, actual)
    if needed <= tolerance * (1 + 1e-12):
        return Comparison(True, tolerance, max_abs, max_rel, "")
    passing = _smallest_passing(needed, tolerance, max_tolerance)
    hint = f"passes at {passing:g}" if passing is not None else f"fails even at {max_tolerance:g}"
    message = (
        f"max abs error {max_abs:.3g}, max rel error {max_rel:.3g}; "
        f"fails at tolerance {tolerance:g}, {hint}"
    )
    return Comparison(False, passing, max_abs, max_rel, message)


def _smallest_passing(needed: float, tolerance: float, max_tolerance: float) -> float | None:
    exponent = 1
    while True:
        candidate = float(f"{tolerance * 10**exponent:.12g}")
        if candidate > max_tolerance * (1 + 1e-9):
            return None
        if needed <= candidate * (1 + 1e-12):
            return candidate
        exponent += 1


def _errors(reference: list[np.ndarray], actual: list[np.ndarray]) -> tuple[float, float, float]:
    """(max abs error, max rel error, smallest tolerance t with |a - r| <= t + t|r| everywhere),
    computed CHUNK elements at a time, so that the check needs no float64 copy of an output."""
    max_abs = max_rel = needed = 0.0
    for r, a in zip(reference, actual, strict=True):
        flat_r, flat_a = np.ravel(r), np.ravel(a)
        for start in range(0, flat_r.size, CHUNK):
            chunk_r = flat_r[start : start + CHUNK].astype(np.float64)
            chunk_a = flat_a[start : start + CHUNK].astype(np.float64)
            same = (chunk_a == chunk_r) | (np.isnan(chunk_r) & np.isnan(chunk_a))
            with np.errstate(invalid="ignore"):
                diff = np.where(same, 0.0, np.abs(chunk_a - chunk_r))
            diff = np.where(np.isnan(diff), np.inf, diff)
            max_abs = max(max_abs, float(diff.max()))
            magnitude = np.abs(chunk_r)
            scale = np.where(np.isfinite(chunk_r), magnitude, np.inf)
            with np.errstate(invalid="ignore"):
                rel = np.where(same, 0.0, diff / np.maximum(scale, np.finfo(np.float64).tiny))
                need = np.where(same, 0.0, diff / (1.0 + magnitude))
            max_rel = max(max_rel, float(np.nan_to_num(rel, nan=np.inf).max()))
            needed = max(needed, float(np.nan_to_num(need, nan=np.inf).max()))
    return max_abs, max_rel, needed
