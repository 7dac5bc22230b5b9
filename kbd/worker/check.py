"""Compare compiled outputs with the eager reference."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
    """`allclose(rtol=atol=tolerance)` on every output, as the reference tool does.

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
    ref = [np.asarray(r, dtype=np.float64) for r in reference]
    out = [np.asarray(a).astype(np.float64) for a in actual]
    for i, (r, a) in enumerate(zip(ref, out, strict=True)):
        if r.shape != a.shape:
            return Comparison(
                False,
                None,
                float("inf"),
                float("inf"),
                f"output {i} has shape {a.shape}, eager has {r.shape}",
            )
    max_abs, max_rel = _errors(ref, out)
    if _close(ref, out, tolerance):
        return Comparison(True, tolerance, max_abs, max_rel, "")
    passing = _smallest_passing(ref, out, tolerance, max_tolerance)
    hint = f"passes at {passing:g}" if passing is not None else f"fails even at {max_tolerance:g}"
    message = (
        f"max abs error {max_abs:.3g}, max rel error {max_rel:.3g}; "
        f"fails at tolerance {tolerance:g}, {hint}"
    )
    return Comparison(False, passing, max_abs, max_rel, message)


def _close(ref: list[np.ndarray], out: list[np.ndarray], tol: float) -> bool:
    return all(
        np.allclose(a, r, rtol=tol, atol=tol, equal_nan=True) for r, a in zip(ref, out, strict=True)
    )


def _smallest_passing(ref, out, tolerance: float, max_tolerance: float) -> float | None:
    exponent = 1
    while True:
        candidate = float(f"{tolerance * 10**exponent:.12g}")
        if candidate > max_tolerance * (1 + 1e-9):
            return None
        if _close(ref, out, candidate):
            return candidate
        exponent += 1


def _errors(ref: list[np.ndarray], out: list[np.ndarray]) -> tuple[float, float]:
    max_abs = 0.0
    max_rel = 0.0
    for r, a in zip(ref, out, strict=True):
        if r.size == 0:
            continue
        same = (a == r) | (np.isnan(r) & np.isnan(a))  # equal infinities, NaN == NaN
        with np.errstate(invalid="ignore"):
            diff = np.where(same, 0.0, np.abs(a - r))
        diff = np.where(np.isnan(diff), np.inf, diff)
        max_abs = max(max_abs, float(diff.max()))
        scale = np.where(np.isfinite(r), np.abs(r), np.inf)
        with np.errstate(invalid="ignore"):
            rel = np.where(same, 0.0, diff / np.maximum(scale, np.finfo(np.float64).tiny))
        max_rel = max(max_rel, float(np.nan_to_num(rel, nan=np.inf).max()))
    return max_abs, max_rel
