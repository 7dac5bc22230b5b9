"""From a KernelBench problem file to a torch model, its inputs and its eager reference."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import ml_dtypes
import numpy as np
import torch

from kbd.shared.protocol import Input, Scalar, Tensor
from kbd.shared.shapes import Shape, int_range

NUMPY_DTYPES = {
    "f64": np.float64,
    "f32": np.float32,
    "f16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "i64": np.int64,
    "i32": np.int32,
    "i16": np.int16,
    "i8": np.int8,
    "i1": np.bool_,
}
TORCH_DTYPES = {
    "f64": torch.float64,
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
}
DEFAULT_INT_RANGE = 10


def seed_everything(seed: int) -> None:
    """Seed numpy and torch so weights and inputs are the same on every run."""
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_problem(path: str, text: str) -> ModuleType:
    """Run a KernelBench problem's source `text` (from `path`) as a module; it must define
    Model, get_inputs and get_init_inputs."""
    name = "kbd_problem_" + Path(path).stem
    module = ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module  # dataclasses and pickling look their module up here
    exec(compile(text, path, "exec"), module.__dict__)
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, attr):
            raise AttributeError(f"{Path(path).name} defines no {attr}")
    return module


def make_buffer(shape: Shape, rng: np.random.Generator) -> np.ndarray:
    """A numpy buffer filled as the shape string's INIT says.

    Values are drawn in the buffer's own precision (float64 only for f64; f16 and bf16 via
    float32) and transformed in place, so a large input costs about its own size, not the
    several float64 copies a draw-then-cast would make.
    """
    dtype = NUMPY_DTYPES[shape.dtype]
    dims = shape.dims
    init = shape.init
    if init == "0":
        return np.zeros(dims, dtype)
    if init == "1":
        return np.ones(dims, dtype)
    if init == "id":
        return np.eye(dims[0], dtype=dtype)
    if shape.dtype == "i1":
        return rng.integers(0, 2, size=dims, dtype=np.uint8).view(np.bool_)
    if np.issubdtype(dtype, np.integer):
        high = int_range(init) or DEFAULT_INT_RANGE
        return rng.integers(0, high, size=dims, dtype=dtype)
    draw = np.float64 if shape.dtype == "f64" else np.float32
    if init in ("randn", "prob"):
        values = rng.standard_normal(dims, dtype=draw)
    else:
        values = rng.random(dims, dtype=draw)
    if init == "triu":
        values = np.triu(values)
    elif init == "tril":
        values = np.tril(values)
    elif init == "sym":
        values = (values + values.T) / 2
    elif init == "sign":
        values = np.where(values < 0.5, draw(-1), draw(1))
    elif init == "prob":
        values -= values.max(axis=-1, keepdims=True)
        np.exp(values, out=values)
        values /= values.sum(axis=-1, keepdims=True)
    return values if values.dtype == dtype else values.astype(dtype)


def make_inputs(specs: list[Input], seed: int) -> tuple[list, list[np.ndarray]]:
    """Build the model arguments and the numpy buffers that back the tensor ones.

    Tensor arguments share memory with their numpy buffers (bf16 through a uint16 view).
    """
    rng = np.random.default_rng(seed)
    args: list = []
    buffers: list[np.ndarray] = []
    for spec in specs:
        if isinstance(spec, Scalar):
            args.append(spec.value)
            continue
        assert isinstance(spec, Tensor)
        buffer = np.ascontiguousarray(make_buffer(spec.shape, rng))
        buffers.append(buffer)
        args.append(to_torch(buffer))
    return args, buffers


def to_torch(buffer: np.ndarray) -> torch.Tensor:
    if buffer.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(buffer.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(buffer)


def buffers_from_args(args: list) -> list[np.ndarray]:
    """Numpy buffers for the tensor arguments of `get_inputs()` (scalars are baked in)."""
    buffers = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            tensor = arg.detach().contiguous()
            if tensor.dtype == torch.bfloat16:
                buffers.append(tensor.view(torch.uint16).numpy().view(ml_dtypes.bfloat16))
            else:
                buffers.append(tensor.numpy())
    return buffers


def build_model(problem: ModuleType, init_args, dtype: str) -> torch.nn.Module:
    """Instantiate Model in eval mode with the given (or the problem's own) init args."""
    if init_args is None:
        init_args = problem.get_init_inputs()
    model = problem.Model(*init_args)
    if dtype != "f32":
        model = model.to(TORCH_DTYPES[dtype])
    return model.eval()


def cast_floating(args: list, dtype: str) -> list:
    """`get_inputs()`'s arguments in element type `dtype`: floating-point tensors are cast,
    integer tensors and Python scalars kept."""
    target = TORCH_DTYPES[dtype]
    return [
        a.to(target) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args
    ]


def has_floating(model: torch.nn.Module, args: list) -> bool:
    """Does anything the kernel computes with (an input tensor, a parameter, a buffer) hold
    floating-point values? Without one, an element type cannot apply to it."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [a for a in args if isinstance(a, torch.Tensor)]
    return any(t.is_floating_point() for t in tensors)


def reference(model: torch.nn.Module, args: list) -> list[np.ndarray]:
    """Eager outputs as float64 numpy arrays (inputs are cloned so in-place ops can't leak)."""
    cloned = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    with torch.no_grad():
        out = model(*cloned)
    return outputs(out)


def outputs(out) -> list[np.ndarray]:
    """A forward's result (a tensor, a scalar or a tuple of them) as numpy arrays."""
    values = out if isinstance(out, tuple | list) else [out]
    return [to_numpy(torch.as_tensor(o)) for o in values]


class _ScalarsBound(torch.nn.Module):
    """The model with its Python scalar arguments fixed, so only tensors reach the import."""

    def __init__(self, model: torch.nn.Module, args: list):
        super().__init__()
        self.model = model
        self.template = [None if isinstance(a, torch.Tensor) else a for a in args]

    def forward(self, *tensors):
        it = iter(tensors)
        return self.model(*[next(it) if a is None else a for a in self.template])


def bind_scalars(model: torch.nn.Module, args: list) -> tuple[torch.nn.Module, list]:
    """(model, tensor args) where non-tensor arguments are baked into the model as constants."""
    if all(isinstance(a, torch.Tensor) for a in args):
        return model, args
    bound = _ScalarsBound(model, args).eval()
    return bound, [a for a in args if isinstance(a, torch.Tensor)]


class _ParametersAsInputs(torch.nn.Module):
    """Calls the model with its parameters and buffers passed in as leading arguments.

    The model is deliberately not a registered submodule, so export sees no parameters: the
    imported function takes the weights as memref arguments instead of embedding them as
    constants, which keeps the IR, the compile time and the compile memory small.
    """

    def __init__(self, model: torch.nn.Module, names: list[str]):
        super().__init__()
        self.wrapped = [model]
        self.names = names

    def forward(self, *args):
        count = len(self.names)
        state = dict(zip(self.names, args[:count], strict=True))
        return torch.func.functional_call(self.wrapped[0], state, args[count:])


def lift_parameters(model: torch.nn.Module, args: list) -> tuple[torch.nn.Module, list]:
    """(model, args) where the model's parameters and buffers come first among the args."""
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    if not state:
        return model, args
    weights = [t.detach().contiguous() for t in state.values()]
    return _ParametersAsInputs(model, list(state)).eval(), [*weights, *args]


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach()
    if tensor.dtype in (torch.bfloat16, torch.float16):
        tensor = tensor.to(torch.float32)
    return tensor.numpy()
