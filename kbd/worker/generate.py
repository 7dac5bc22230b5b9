"""The torch side of `kbd levels generate`: measure one KernelBench problem in a worker.

For a `Generate` task the worker parses the problem file, builds `Model(*get_init_inputs())` in
eval mode under torch.no_grad() and seed 0, and runs one forward (on the meta device when the
model allows it) to learn the output shapes, the bytes and the FLOPs. Over budget, it reduces
the file's size constants by the policy of `kbd.worker.knobs` and measures again. It then draws
the inputs once for real at the chosen shapes to name their initializations, and answers with
one `Generated`.

FLOPs: torch's FlopCounterMode at the chosen shapes; when it counts 0 (elementwise ops,
reductions, norms, activations, losses and scans are not counted), one FLOP per element of the
largest operand of every non-view aten op of the forward.

Initializations, from one real get_inputs() call: integer tensors made by torch.randint(low,
high) -> `rnd<high>` (class indices); other integer tensors -> `rnd<max+1>`; bool -> `rnd`;
floats: all 0 -> `0`, all 1 -> `1`, identity -> `id`, square upper/lower triangular ->
`triu`/`tril`, only -1/+1 -> `sign`, square symmetric -> `sym`, positive rows summing to 1 ->
`prob`, any negative value -> `randn`, else `rnd`; a Python number -> itself, init `scalar`.

Further entry fields come from FIELD_STEPS, functions that get the measured `Problem` and return
fields: `family`, the schedule family of the exported graph (kbd.worker.families).
"""

from __future__ import annotations

import ast
import contextlib
import sys
import traceback
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from kbd.shared.protocol import Budget, Generate, Generated, Result
from kbd.worker import families, knobs

DTYPE_NAMES = {
    torch.float64: "f64",
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.bool: "i1",
}
_TORCH_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}
INPUT_BYTES_MAX = 2**30  # inputs are drawn once for real to name their initializations


class GenError(Exception):
    """A problem file that cannot be turned into a levels entry."""


@dataclass
class Measure:
    """One forward of a model at some shapes."""

    input_bytes: int
    param_bytes: int
    output_bytes: int
    counted_flops: int
    estimated_flops: int
    outputs: list[tuple[int, ...]]
    init_args: list
    # Builds the model and its inputs again, on the devices this measure ran on (meta if it could).
    rebuild: Callable[[], tuple[torch.nn.Module, list]] | None = None

    @property
    def nbytes(self) -> int:
        return self.input_bytes + self.param_bytes + self.output_bytes

    @property
    def flops(self) -> int:
        return self.counted_flops or self.estimated_flops

    def fits(self, budget: Budget) -> bool:
        return self.nbytes <= budget.nbytes and self.flops <= budget.flops


@dataclass
class Problem:
    """What FIELD_STEPS get: the task, the module at the chosen shapes and its measure."""

    task: Generate
    module: types.ModuleType
    measure: Measure


def family_field(problem: Problem) -> dict[str, Any]:
    """`family`: the schedule family of the exported graph at the chosen shapes, when it has one
    (kbd.worker.families); a model that does not export gets none, and the log says why."""
    try:
        with _quiet():
            model, inputs = problem.measure.rebuild()
            family = families.family_of(model, inputs)
    except Exception as exc:
        print(f"kbd: no family: the model does not export: {type(exc).__name__}: {exc}")
        return {}
    return {"family": family} if family else {}


FIELD_STEPS: list[Callable[[Problem], dict[str, Any]]] = [family_field]


def answer(
    task: Generate, announce: Callable[[str], None], limits_enforced: dict[str, str]
) -> Generated | Result:
    """The worker's answer to `task`: the measurement, or an `error`/`memory` Result."""
    phase = ["load"]

    def step(name: str) -> None:
        phase[0] = name
        announce(name)

    try:
        return run(task, step)
    except BaseException as exc:  # the problem's failure, whatever it raises, is data
        traceback.print_exception(exc)  # the whole traceback goes to the log
        lines = [line for line in str(exc).splitlines() if line.strip()]
        return Result(
            outcome="memory" if isinstance(exc, MemoryError) else "error",
            phase=phase[0],
            message=f"{type(exc).__name__}: {lines[0].strip()}" if lines else type(exc).__name__,
            limits_enforced=limits_enforced,
        )


def run(task: Generate, announce: Callable[[str], None]) -> Generated:
    """Measure the problem of `task`; raises GenError (or the problem's own error) on failure."""
    announce("load")
    path = Path(task.source)
    tree = ast.parse(task.source_text, str(path))
    module = load_module(path, tree)
    announce("measure")
    if task.input_shapes is not None or task.init_args is not None:
        return _from_override(task, path, tree, module, announce)
    return _search(task, path, tree, module, announce)


def _search(task: Generate, path: Path, tree: ast.Module, module, announce) -> Generated:
    """KernelBench's shapes if they fit the budget, else the reduction of kbd.worker.knobs."""
    found = knobs.find_knobs(tree)
    before = measure(module)
    values = {k.index: k.value for k in found}
    best, best_module = before, module
    for category, floor in knobs.STAGES:
        group = [k for k in found if category in (k.category, "all") and k.category != "fixed"]
        while group and not best.fits(task.budget):
            cand = dict(values)
            for k in group:
                if category == "all":
                    hard = knobs.HARD_FLOORS[k.category]
                    cand[k.index] = knobs.halve_knob(values[k.index], k.value, hard)
                else:
                    cand[k.index] = knobs.halve_knob(values[k.index], k.value, floor, strict=True)
            if cand == values or None in cand.values():
                break
            try:
                cand_module = load_module(path, knobs.apply_overrides(tree, cand))
                cand_measure = measure(cand_module, model_module=module)
            except Exception:
                break
            values, best, best_module = cand, cand_measure, cand_module
        if best.fits(task.budget):
            break
    if best.input_bytes > INPUT_BYTES_MAX:
        raise GenError(f"inputs still need {best.input_bytes} bytes after reduction")
    announce("inputs")
    shapes, inits = detect_inputs(best_module)
    reductions = [(k.name, k.value, values[k.index]) for k in found if values[k.index] != k.value]
    return _generated(task, best_module, before, best, shapes, inits, reductions)


def _from_override(task: Generate, path: Path, tree: ast.Module, module, announce) -> Generated:
    """Measure at the shapes and/or constructor args given in overrides.yaml."""
    if task.input_shapes is None:  # only init_args given: KernelBench's shapes as searched
        searched = msgspec.structs.replace(task, input_shapes=None, init_args=None)
        base = _search(searched, path, tree, module, announce)
        shapes, inits = base.input_shapes, base.initializations
    else:
        shapes = list(task.input_shapes)
        inits = ["scalar" if isinstance(s, int | float) else "rnd" for s in shapes]
    with _quiet():
        init_args = task.init_args if task.init_args is not None else module.get_init_inputs()
    measured = measure(module, explicit=(list(init_args), [_parse_spec(s) for s in shapes]))
    given = ", ".join(
        name
        for name, value in (("input_shapes", task.input_shapes), ("init_args", task.init_args))
        if value is not None
    )
    reductions = [("overrides.yaml", "", given)]
    return _generated(task, module, measured, measured, shapes, inits, reductions)


def _generated(task, module, before: Measure, best: Measure, shapes, inits, reductions):
    fields: dict[str, Any] = {}
    for step in FIELD_STEPS:
        fields.update(step(Problem(task, module, best)))
    return Generated(
        input_shapes=shapes,
        initializations=inits,
        outputs=best.outputs,
        init_args=_plain(best.init_args, task.kernel),
        flops=best.flops,
        nbytes=best.nbytes,
        original_flops=before.flops,
        original_nbytes=before.nbytes,
        reductions=reductions,
        fits=best.fits(task.budget),
        fields=fields,
    )


# --- loading and measuring ------------------------------------------------------------------


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def load_module(path: Path, tree: ast.Module) -> types.ModuleType:
    """Execute a (possibly rewritten) problem file as module `<stem>`; sys.path is untouched."""
    name = path.stem
    module = types.ModuleType(name)
    module.__file__ = str(path)
    code = compile(tree, str(path), "exec")
    saved = sys.modules.get(name)
    sys.modules[name] = module  # dataclasses & co. look their module up while executing
    try:
        with _quiet():
            exec(code, module.__dict__)
    finally:
        if saved is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = saved
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, attr):
            raise GenError(f"{path.name} defines no {attr}")
    return module


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


_COPY_OR_VIEW = frozenset(
    {
        "empty", "zeros", "ones", "full", "rand", "randn", "randint", "arange", "linspace",
        "scalar_tensor", "lift_fresh", "detach", "alias", "clone", "_to_copy", "copy", "view",
        "_unsafe_view", "reshape", "expand", "t", "transpose", "permute", "unsqueeze", "squeeze",
        "slice", "select", "as_strided", "split", "split_with_sizes", "chunk", "unbind",
        "contiguous", "_reshape_alias", "new_empty", "new_zeros", "new_ones", "zeros_like",
        "ones_like", "empty_like", "fill", "set", "resize", "unfold",
    }
)  # fmt: skip


class _ElementCounter(TorchDispatchMode):
    """Sums, per non-view aten op, the element count of its largest operand."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__.strip("_")
        if not func.is_view and name not in _COPY_OR_VIEW:
            leaves = tree_leaves((args, kwargs, out))
            self.count += max((t.numel() for t in leaves if isinstance(t, torch.Tensor)), default=0)
        return out


def count_forward(model, inputs) -> tuple[object, int, int]:
    """One forward under kbd's FLOP counting: (its result, torch's FLOP count, the elements of
    the largest operand of every non-view aten op). A kernel's FLOPs are the first when it is
    not 0, else the second (`Measure.flops`); `kbd run --shapes kernelbench` counts the same."""
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter, _ElementCounter() as elements:
        out = model(*inputs)
    return out, int(counter.get_total_flops()), int(elements.count)


def _forward(model, inputs, init_args) -> Measure:
    out, counted, estimated = count_forward(model, inputs)
    outs = list(out) if isinstance(out, tuple | list) else [out]
    if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
        raise GenError(f"forward returned {type(out).__name__}, not tensors")
    seen, param_bytes = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            param_bytes += _nbytes(t)
    return Measure(
        input_bytes=sum(_nbytes(t) for t in inputs if isinstance(t, torch.Tensor)),
        param_bytes=param_bytes,
        output_bytes=sum(_nbytes(t) for t in outs),
        counted_flops=counted,
        estimated_flops=estimated,
        outputs=[tuple(o.shape) for o in outs],
        init_args=list(init_args),
    )


def measure(module: types.ModuleType, model_module=None, explicit=None) -> Measure:
    """Build the model and run one forward, on the meta device when possible.

    Init args and inputs come from `module` (possibly with reduced constants), the Model class
    from `model_module` (default: `module`): the unmodified file, as kbd will import it, so a
    model that reads a module constant itself (L3/33 reads `batch_size`) rejects the reduction.
    `explicit` = (init_args, input_specs) replaces get_init_inputs()/get_inputs() (overrides).
    Order of attempts: all on meta; model built on CPU then moved to meta (constructors that call
    .item()); all on CPU.
    """

    def build(device):
        torch.manual_seed(0)
        with torch.device(device):
            init_args = module.get_init_inputs() if explicit is None else explicit[0]
            model = (model_module or module).Model(*init_args)
        return model.eval(), init_args

    def inputs(device):
        torch.manual_seed(0)
        if explicit is not None:
            return [_spec_tensor(s, device) for s in explicit[1]]
        with torch.device(device):
            return module.get_inputs()

    errors = []
    with _quiet():
        for build_dev, run_dev in (("meta", "meta"), ("cpu", "meta"), ("cpu", "cpu")):
            try:

                def rebuild(build_dev=build_dev, run_dev=run_dev):
                    """The model and its inputs built again, on the devices that worked."""
                    return build(build_dev)[0].to(run_dev), inputs(run_dev)

                model, init_args = build(build_dev)
                found = _forward(model.to(run_dev), inputs(run_dev), init_args)
                found.rebuild = rebuild
                return found
            except GenError:
                raise
            except Exception as exc:
                errors.append(f"{build_dev}/{run_dev}: {type(exc).__name__}: {exc}")
                if "meta" not in str(exc).lower():
                    break  # a real error, not a meta-device limitation: CPU would fail too
    raise GenError("; ".join(e.splitlines()[0][:300] for e in errors))


def _parse_spec(text):
    """`64x128[xTYPE]` -> ((64, 128), TYPE); numbers pass through (scalar inputs)."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return text
    tokens = str(text).split("x")
    dims = tuple(int(t) for t in tokens if t.isdigit())
    rest = [t for t in tokens if not t.isdigit()]
    return dims, rest[0] if rest else "f32"


def _spec_tensor(spec, device):
    if not isinstance(spec, tuple):
        return spec
    dims, dtype = spec
    return torch.zeros(dims, dtype=_TORCH_DTYPES[dtype], device=device)


# --- describing inputs ----------------------------------------------------------------------


def detect_inputs(module: types.ModuleType) -> tuple[list, list]:
    """(input_shapes, initializations) from one real get_inputs() call (seed 0)."""
    real_randint = torch.randint
    made: dict[int, int] = {}

    def randint(*args, **kwargs):
        out = real_randint(*args, **kwargs)
        ints = [a for a in args if knobs.is_int(a)]
        high = kwargs.get("high", ints[1] if len(ints) >= 2 else ints[0] if ints else None)
        if high is not None:
            made[id(out)] = int(high)
        return out

    torch.manual_seed(0)
    torch.randint = randint
    try:
        with _quiet():
            values = module.get_inputs()
    finally:
        torch.randint = real_randint
    shapes, inits = [], []
    for pos, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int | float | torch.Tensor):
            raise GenError(f"input {pos} is a {type(v).__name__}")
        if not isinstance(v, torch.Tensor):
            shapes.append(v)
            inits.append("scalar")
            continue
        if v.dim() == 0:
            raise GenError(f"input {pos} is a 0-d tensor (not expressible)")
        dtype = DTYPE_NAMES.get(v.dtype)
        if dtype is None:
            raise GenError(f"input {pos} has unsupported dtype {v.dtype}")
        dims = "x".join(map(str, v.shape))
        shapes.append(dims if dtype == "f32" else f"{dims}x{dtype}")
        inits.append(_init_of(v, dtype, made.get(id(v))))
    return shapes, inits


def _init_of(t: torch.Tensor, dtype: str, randint_high: int | None) -> str:
    if dtype == "i1":
        return "rnd"
    if not t.dtype.is_floating_point:
        high = randint_high if randint_high is not None else int(t.max()) + 1
        return f"rnd{max(high, 1)}"
    if bool((t == 0).all()):
        return "0"
    if bool((t == 1).all()):
        return "1"
    if t.dim() == 2 and t.shape[0] == t.shape[1] and torch.equal(t, torch.eye(len(t))):
        return "id"
    if t.dim() >= 2 and t.shape[-1] == t.shape[-2] >= 2:  # square matrices only
        if torch.equal(t, torch.triu(t)) and not torch.equal(t, torch.tril(t)):
            return "triu"
        if torch.equal(t, torch.tril(t)) and not torch.equal(t, torch.triu(t)):
            return "tril"
    if bool(((t == 1) | (t == -1)).all()):
        return "sign"
    if t.dim() == 2 and t.shape[0] == t.shape[1] >= 2 and torch.equal(t, t.T):
        return "sym"
    if t.dim() >= 1 and bool((t > 0).all()) and t.shape[-1] >= 2:
        sums = t.to(torch.float64).sum(-1)
        if torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
            return "prob"
    if bool((t < 0).any()):
        return "randn"
    return "rnd"


def _plain(values, kernel: str) -> list:
    """Constructor args as plain data for the levels file (tuples become lists)."""
    out = []
    for v in values:
        if isinstance(v, tuple | list):
            out.append(_plain(v, kernel))
        elif v is None or isinstance(v, bool | int | float | str):
            out.append(v)
        else:
            raise GenError(f"init arg of type {type(v).__name__} cannot be written")
    return out
