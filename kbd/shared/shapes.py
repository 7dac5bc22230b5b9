"""Shape strings: `DIMSxTYPExINIT`, e.g. `64x128xf32xrnd`.

The grammar is the reference tool's, extended where KernelBench needs more:

- DIMS: one or more positive integers separated by `x`.
- TYPE: f64, f32, f16, bf16, i64, i32, i16, i8, i1.
- INIT: `0`, `1`, `rnd`, `id` as in the reference; `rnd` on integer types gives integers in
  [0, 10) and `rndN` gives integers in [0, N) (class indices); `rnd` on `i1` gives a random mask;
  `randn` gives standard normal floats; `triu` / `tril` give random upper / lower triangular
  matrices, `sym` a random symmetric one; `sign` gives random -1 / +1 (hinge targets);
  `prob` gives positive rows that sum to 1 over the last dimension (probabilities).

Pure Python: the supervisor uses it to validate levels files and estimate memory without numpy.
"""

from __future__ import annotations

import math
import re

import msgspec

from kbd.shared.errors import InputError

DTYPE_BYTES = {
    "f64": 8,
    "f32": 4,
    "f16": 2,
    "bf16": 2,
    "i64": 8,
    "i32": 4,
    "i16": 2,
    "i8": 1,
    "i1": 1,
}
FLOAT_TYPES = ("f64", "f32", "f16", "bf16")
INITS = ("0", "1", "rnd", "randn", "id", "triu", "tril", "sym", "sign", "prob")
_INT_RANGE = re.compile(r"^rnd(\d+)$")


class Shape(msgspec.Struct, frozen=True):
    """One tensor buffer: dimensions, element type and how to fill it."""

    dims: tuple[int, ...]
    dtype: str
    init: str = "0"

    @property
    def nbytes(self) -> int:
        return math.prod(self.dims) * DTYPE_BYTES[self.dtype]

    def __str__(self) -> str:
        return "x".join([*map(str, self.dims), self.dtype, self.init])


def int_range(init: str) -> int | None:
    """The exclusive upper bound of an integer `rndN` init, or None for other inits."""
    match = _INT_RANGE.match(init)
    return int(match.group(1)) if match else None


def parse_dims(text: str, where: str) -> tuple[int, ...]:
    """Parse `64x128` (or a bare `64`) into a tuple of positive dimensions."""
    parts = str(text).strip().split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise InputError(f"{where}: bad dimensions {text!r} (expected e.g. 64x128)") from None
    if not dims or any(d <= 0 for d in dims):
        raise InputError(f"{where}: dimensions must be positive integers, got {text!r}")
    return dims


def parse_shape(
    text: str, where: str, default_dtype: str = "f32", default_init: str = "0"
) -> Shape:
    """Parse `DIMS[xTYPE[xINIT]]`; missing parts take the given defaults."""
    tokens = str(text).strip().split("x")
    dims_tokens: list[str] = []
    rest: list[str] = []
    for i, tok in enumerate(tokens):
        if tok.isdigit():
            dims_tokens.append(tok)
        else:
            rest = tokens[i:]
            break
    if not dims_tokens:
        raise InputError(f"{where}: shape {text!r} has no dimensions")
    dims = parse_dims("x".join(dims_tokens), where)
    if len(rest) > 2:
        raise InputError(f"{where}: shape {text!r} is not DIMSxTYPExINIT")
    dtype = rest[0] if rest else default_dtype
    init = rest[1] if len(rest) > 1 else default_init
    shape = Shape(dims, dtype, init)
    validate(shape, f"{where}: shape {text!r}")
    return shape


def validate(shape: Shape, where: str) -> None:
    """Check type and init of a shape; raises InputError naming `where`."""
    if shape.dtype not in DTYPE_BYTES:
        known = ", ".join(DTYPE_BYTES)
        raise InputError(f"{where}: unknown element type {shape.dtype!r} (known: {known})")
    if shape.init not in INITS and int_range(shape.init) is None:
        raise InputError(
            f"{where}: unknown initialization {shape.init!r} (known: {', '.join(INITS)}, rndN)"
        )
    if int_range(shape.init) == 0:
        raise InputError(f"{where}: {shape.init!r} is an empty range")
    if int_range(shape.init) is not None and shape.dtype in FLOAT_TYPES:
        raise InputError(f"{where}: {shape.init!r} needs an integer element type")
    if shape.init == "id" and (len(shape.dims) != 2 or shape.dims[0] != shape.dims[1]):
        raise InputError(f"{where}: 'id' needs a square 2-D shape")
    if shape.init in ("triu", "tril") and len(shape.dims) < 2:
        raise InputError(f"{where}: {shape.init!r} needs at least 2 dimensions")
    if shape.init == "sym" and (len(shape.dims) != 2 or shape.dims[0] != shape.dims[1]):
        raise InputError(f"{where}: 'sym' needs a square 2-D shape")
    if shape.init in ("sym", "sign", "prob", "randn", "triu", "tril") and (
        shape.dtype not in FLOAT_TYPES
    ):
        raise InputError(f"{where}: {shape.init!r} needs a floating-point element type")
