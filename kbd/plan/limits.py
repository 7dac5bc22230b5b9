"""Sizes, the machine's resources, and per-kernel memory estimates (supervisor side)."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from kbd.shared.errors import InputError
from kbd.shared.protocol import THREAD_ENV, Sized, Tensor

if TYPE_CHECKING:
    from kbd.plan.catalog import Entry

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1 << 20,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1 << 30,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")

# A forked worker starts with the template's private data (torch and torch-mlir imported) and
# makes its own allocations during import and JIT; kernel buffers come on top of this estimate.
WORKER_BASE_BYTES = 700 << 20
# The smallest --mem-limit a worker can live with: the template's private data and what
# importing a kernel needs.
MIN_MEM_LIMIT = 512 << 20
BUDGET_FRACTION = 0.75
RESERVE_BYTES = 2 << 30


def parse_size(text: str, option: str) -> int:
    """`2GiB`, `512M`, `1.5g`, `1000000` -> bytes; decimal (k, M, G) and binary (KiB...) units."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise InputError(f"{option}: {text!r} is not a size like 2GiB, 512M or 1000000")
    value = round(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise InputError(f"{option}: size must be positive")
    return value


def format_size(n: int | float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def usable_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def default_budget() -> int:
    """Memory all running workers may use together: a fraction of what is available now,
    keeping a reserve for the system."""
    import psutil  # here: clients that only talk to a daemon never need it

    available = psutil.virtual_memory().available
    return max(1 << 30, min(int(available * BUDGET_FRACTION), available - RESERVE_BYTES))


def estimate(entry: Entry) -> int:
    """Predicted peak memory of a worker running `entry` at its levels entry's shapes (`footprint`).
    Kernels without shapes (get_inputs) get only the base, until sized (`estimate_sized`)."""
    sizes = [i.shape.nbytes for i in entry.inputs or [] if isinstance(i, Tensor)]
    outputs = sum(o.nbytes for o in entry.outputs) if entry.outputs is not None else None
    return footprint(sizes, outputs)


def estimate_sized(sized: Sized) -> int:
    """Predicted peak memory of a worker running a problem at its own shapes, as measured
    without making them (`--shapes kernelbench`, kbd.worker.sizing)."""
    return footprint(sized.input_bytes, sized.output_bytes, sized.param_bytes)


def footprint(inputs: list[int], outputs: int | None, params: int = 0) -> int:
    """Predicted peak memory of a worker whose inputs take `inputs` bytes each, its outputs
    `outputs` bytes together (None: unknown) and its parameters `params` bytes.

    Inputs are held once by numpy (shared with torch) and again while the eager reference
    runs; each output exists as the compiled buffer and the eager result (the check compares
    them in small chunks); parameters are held once (the compiled code reads the model's own).
    Unknown outputs: assume one as large as the largest input.
    """
    if outputs is None:
        outputs = max(inputs, default=0)
    return WORKER_BASE_BYTES + 2 * sum(inputs) + 2 * outputs + params


def thread_env(cores: int) -> dict[str, str]:
    """Environment that makes OpenMP, MKL and OpenBLAS use `cores` threads."""
    return {name: str(cores) for name in THREAD_ENV}
