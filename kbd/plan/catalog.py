"""The kernel catalog: levels files (`levels/*.yaml`), KernelBench lookup and kernel selection.

A levels file is a YAML list of entries; see README "Levels files" for the schema. Everything is
validated here, at the edge: an error names the file, the entry and the field.
"""

from __future__ import annotations

import ast
import functools
import operator
import os
from pathlib import Path
from typing import Any

import msgspec
import yaml

from kbd.plan import schema
from kbd.shared.errors import InputError
from kbd.shared.outcomes import CODES, EXPECTABLE
from kbd.shared.protocol import Input, Scalar, Tensor
from kbd.shared.shapes import DTYPE_BYTES, Shape, parse_dims, parse_shape

REPO_ROOT = schema.REPO_ROOT
LEVELS_DIR = schema.LEVELS_DIR
DEFAULT_KERNELBENCH = REPO_ROOT / "third_party" / "KernelBench" / "KernelBench"


class Expectation(msgspec.Struct, frozen=True):
    """An expected failure: outcome, phase and the start of the message, all from evidence."""

    outcome: str
    phase: str | None = None
    message: str | None = None
    dtype: str | None = None  # expected only when the kernel runs in this element type

    def matches(self, outcome: str, phase: str, message: str) -> bool:
        """Same outcome, same phase (if given) and, where the outcome table says the message is
        a stable fingerprint, a message starting with the expected one (if given)."""
        return (
            outcome == self.outcome
            and (self.phase is None or phase == self.phase)
            and (
                self.message is None
                or not CODES[outcome].fingerprint_message
                or message.startswith(self.message)
            )
        )

    def __str__(self) -> str:
        parts = [self.outcome, self.phase or "", self.message or ""]
        return " / ".join(p for p in parts if p)


class Entry(msgspec.Struct, frozen=True):
    """One kernel of a levels file, validated."""

    kernel: str  # path under the KernelBench root, e.g. level1/2_Standard_matrix_multiplication_.py
    levels_file: str
    inputs: list[Input] | None
    outputs: list[Shape] | None
    init_args: Any
    gflops: float | None
    pipeline: str | None  # hand-set schedule family; replaces `family`
    dtype: str
    xfail: Expectation | None
    family: str | None = None  # the schedule family of the exported graph (generated)
    # hand-set note shown before the kernel's line, as lighthouse's levels files use it
    warning: str | None = None

    @property
    def name(self) -> str:
        return self.kernel.removesuffix(".py")

    @property
    def expectation(self) -> Expectation | None:
        """The entry's expected failure when it applies to the element type it runs in."""
        if self.xfail is None or self.xfail.dtype not in (None, self.dtype):
            return None
        return self.xfail

    @property
    def schedule_family(self) -> str | None:
        """The family whose schedule the finder looks for: hand-set `pipeline`, else `family`."""
        return self.pipeline or self.family


def kernelbench_root(option: str | None) -> Path:
    """`--kernelbench DIR`, else $KBD_KERNELBENCH, else the submodule.

    Any folder will do: `check_sources` then requires each selected kernel's file under it."""
    if option:
        root, origin = Path(option), "--kernelbench"
    elif os.environ.get("KBD_KERNELBENCH"):
        root, origin = Path(os.environ["KBD_KERNELBENCH"]), "KBD_KERNELBENCH"
    else:
        root, origin = DEFAULT_KERNELBENCH, "default location"
    if not root.is_dir():
        raise InputError(
            f"KernelBench not found at {root} ({origin}): run `git submodule update --init` "
            "or pass --kernelbench DIR (the folder holding the kernels' level1/, level2/, ...)"
        )
    return root.resolve()


def default_levels_files(shapes: str = "smoke") -> list[Path]:
    """The whole catalog: levels/level*.yaml, or levels/bench/level*.yaml for benchmark shapes
    (ci.yaml is selected with --levels). KernelBench's own shapes select from levels/level*.yaml
    (which kernels, their family, pipeline, dtype and xfail); their inputs are the problems'."""
    if shapes in ("smoke", "kernelbench"):
        return sorted(LEVELS_DIR.glob("level*.yaml"))
    files = sorted((LEVELS_DIR / "bench").glob("level*.yaml"))
    if not files:
        raise InputError(f"no benchmark-shape levels files in {LEVELS_DIR / 'bench'}")
    return files


def load(files: list[Path]) -> list[Entry]:
    """Load and validate levels files; a kernel may appear only once across them."""
    if not files:
        raise InputError(f"no levels files found in {LEVELS_DIR}; pass --levels FILE")
    seen: dict[str, str] = {}
    entries = []
    for path in files:
        for entry in load_file(path):
            if entry.kernel in seen:
                raise InputError(
                    f"{path}: kernel {entry.kernel} is also listed in {seen[entry.kernel]}"
                )
            seen[entry.kernel] = str(path)
            entries.append(entry)
    return entries


def load_file(path: Path) -> list[Entry]:
    return list(_parsed(read_levels_text(path), path))


@functools.lru_cache(maxsize=32)
def _parsed(text: str, path: Path) -> tuple[Entry, ...]:
    """Parsing the whole catalog takes 0.1-0.3 s; a daemon parses each version of a file once
    (the key is the file's text, so an edited file is parsed again)."""
    return tuple(load_text(text, path))


def read_levels_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise InputError(f"{path}: cannot read levels file ({exc.strerror})") from None


def load_text(text: str, path: Path) -> list[Entry]:
    """Validate the text of levels file `path` (not read from disk: e.g. before writing it)."""
    try:
        data = yaml.load(text, Loader=schema.Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise InputError(f"{path}: malformed YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return []
    if not isinstance(data, list):
        raise InputError(f"{path}: a levels file is a YAML list of entries")
    return [_entry(path, i, raw) for i, raw in enumerate(data)]


FLOATING = ("f64", "f32", "f16", "bf16")


def with_dtype(entry: Entry, dtype: str) -> Entry:
    """The entry run in element type `dtype` (`--dtype`): its model, and every floating-point
    input and output; integer inputs (indices, labels) keep theirs."""

    def retyped(shape: Shape) -> Shape:
        return msgspec.structs.replace(shape, dtype=dtype) if shape.dtype in FLOATING else shape

    inputs = entry.inputs
    if inputs is not None:
        inputs = [Tensor(retyped(i.shape)) if isinstance(i, Tensor) else i for i in inputs]
    outputs = [retyped(o) for o in entry.outputs] if entry.outputs is not None else None
    return msgspec.structs.replace(entry, dtype=dtype, inputs=inputs, outputs=outputs)


def own_shapes(entry: Entry) -> Entry:
    """The entry run at its problem's own shapes (`--shapes kernelbench`): get_inputs() and
    get_init_inputs() as they are. Its input_shapes, initializations, init_args, output_shape
    and gflops describe other shapes, so they go; which kernel it is, its family, pipeline,
    dtype, warning and xfail stay."""
    return msgspec.structs.replace(entry, inputs=None, init_args=None, outputs=None, gflops=None)


def select(entries: list[Entry], prefixes: list[str]) -> list[Entry]:
    """Entries whose kernel path starts with any prefix (all entries when none is given)."""
    if not prefixes:
        return entries
    chosen = []
    for prefix in prefixes:
        matched = [e for e in entries if e.kernel.startswith(prefix)]
        if not matched:
            raise InputError(f"no kernel in the selected levels files matches {prefix!r}")
        chosen.extend(e for e in matched if e not in chosen)
    return chosen


def check_sources(entries: list[Entry], root: Path) -> None:
    for entry in entries:
        if not (root / entry.kernel).is_file():
            raise InputError(
                f"{entry.levels_file}: kernel {entry.kernel} does not exist in "
                f"KernelBench at {root}"
            )


def _entry(path: Path, index: int, raw: Any) -> Entry:
    where = f"{path}: entry {index + 1}"
    if not isinstance(raw, dict):
        raise InputError(f"{where}: expected a mapping with a 'kernel' field")
    kernel = raw.get("kernel")
    if not isinstance(kernel, str) or not kernel.endswith(".py"):
        raise InputError(f"{where}: field 'kernel' must be a path like level1/2_Name.py")
    where = f"{path}: {kernel}"
    unknown = set(raw) - set(schema.FIELDS)
    if unknown:
        raise InputError(f"{where}: unknown field {sorted(map(str, unknown))[0]!r}")
    dtype = raw.get("dtype", "f32")
    if dtype not in DTYPE_BYTES:
        raise InputError(f"{where}: field 'dtype': unknown type {dtype!r}")
    return Entry(
        kernel=kernel,
        levels_file=str(path),
        inputs=_inputs(raw, where, dtype),
        outputs=_outputs(raw.get("output_shape"), where, dtype),
        init_args=_init_args(raw.get("init_args"), where),
        gflops=_gflops(raw.get("gflops"), where),
        pipeline=_optional_str(raw, "pipeline", where),
        dtype=dtype,
        xfail=_xfail(raw.get("xfail"), where),
        family=_optional_str(raw, "family", where),
        warning=_optional_str(raw, "warning", where) or None,  # "" shows nothing, as lighthouse
    )


def _inputs(raw: dict, where: str, dtype: str) -> list[Input] | None:
    shapes = raw.get("input_shapes")
    inits = raw.get("initializations")
    if shapes is None:
        if inits is not None:
            raise InputError(f"{where}: field 'initializations' given without 'input_shapes'")
        return None
    if not isinstance(shapes, list):
        raise InputError(f"{where}: field 'input_shapes' must be a list")
    if not isinstance(inits, list) or len(inits) != len(shapes):
        raise InputError(
            f"{where}: field 'initializations' must list one init per input ({len(shapes)} inputs)"
        )
    inputs: list[Input] = []
    for i, (shape, init) in enumerate(zip(shapes, inits, strict=True)):
        field = f"{where}: input_shapes[{i}]"
        if str(init) == "scalar":
            if isinstance(shape, bool) or not isinstance(shape, int | float):
                raise InputError(f"{field}: a 'scalar' input must be a number, got {shape!r}")
            inputs.append(Scalar(shape))
            continue
        if isinstance(shape, float):
            raise InputError(f"{field}: {shape!r} is a number; its initialization must be 'scalar'")
        inputs.append(Tensor(parse_shape(f"{shape}", field, dtype, str(init))))
    return inputs


def _outputs(value: Any, where: str, dtype: str) -> list[Shape] | None:
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    outputs = []
    for i, item in enumerate(items):
        field = (
            f"{where}: output_shape[{i}]" if isinstance(value, list) else f"{where}: output_shape"
        )
        if str(item) == "scalar":
            outputs.append(Shape((), dtype))
        else:
            outputs.append(Shape(parse_dims(str(item), field), dtype))
    return outputs


def _init_args(value: Any, where: str) -> Any:
    if value is None or value == "None":
        return None
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise InputError(
                f"{where}: field 'init_args' {value!r} is not a literal like (128,[128],128)"
            ) from None
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list):
        value = [value]
    return value


_ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}


def _gflops(value: Any, where: str) -> float | None:
    """A number, or an arithmetic expression like `(2048 * 8192 * 4096 * 2) / 1e9`."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)

    def evaluate(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
            left, right = evaluate(node.left), evaluate(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError  # 9**9**9 would never finish
            return float(_ARITHMETIC[type(node.op)](left, right))
        raise ValueError

    try:
        return float(evaluate(ast.parse(str(value), mode="eval").body))
    except (ValueError, SyntaxError, ZeroDivisionError, OverflowError):
        raise InputError(
            f"{where}: field 'gflops' {value!r} is not a number or arithmetic"
        ) from None


def _optional_str(raw: dict, field: str, where: str) -> str | None:
    value = raw.get(field)
    if value is not None and not isinstance(value, str):
        raise InputError(f"{where}: field {field!r} must be a string")
    return value


def _xfail(value: Any, where: str) -> Expectation | None:
    if value is None:
        return None
    if not isinstance(value, dict) or "outcome" not in value:
        raise InputError(f"{where}: field 'xfail' must be a mapping with at least 'outcome'")
    unknown = set(value) - set(schema.XFAIL_FIELDS)
    if unknown:
        raise InputError(f"{where}: field 'xfail' has unknown key {sorted(map(str, unknown))[0]!r}")
    if value["outcome"] not in EXPECTABLE:
        raise InputError(
            f"{where}: xfail outcome {value['outcome']!r} is not one of {', '.join(EXPECTABLE)}"
        )
    return Expectation(
        outcome=value["outcome"],
        phase=None if value.get("phase") is None else str(value["phase"]),
        message=None if value.get("message") is None else str(value["message"]),
        dtype=_xfail_dtype(value.get("dtype"), where),
    )


def _xfail_dtype(value: Any, where: str) -> str | None:
    if value is not None and value not in DTYPE_BYTES:
        raise InputError(f"{where}: xfail dtype {value!r} is not an element type")
    return value
