"""Sizing a problem at its own shapes without making its inputs (`--shapes kernelbench`).

For a `Size` task the worker runs the problem's get_init_inputs(), Model(...) and get_inputs()
under torch's meta device, where tensors have shapes and element types but no storage, and one
forward there (also under the meta device, so what it creates has no storage either) to learn
its outputs and count its FLOPs as `kbd levels generate` does (`generate.count_forward`). Nothing
the size of the inputs is allocated: a problem whose inputs take many GiB is measured in well
under a second, and the supervisor skips it before any worker makes them (kbd.engine.scheduler).
Where the meta device cannot go:

- a constructor that needs real tensors (`.item()` on a weight) builds the model on the CPU,
  under the worker's memory cap, and moves it to meta;
- a get_inputs() that fails on meta is called for real, under the cap (inputs beyond it end the
  kernel as `memory`, never the machine);
- a forward that fails on meta leaves the outputs and FLOPs unknown: the estimate then assumes
  one output as large as the largest input (kbd.plan.limits) and the record has no GFLOPS.

`Sized.note` says which of these happened. The job later checks that get_inputs() made exactly
the inputs measured here (`check_inputs`), so the caches, which key on them, key on what ran.
"""

from __future__ import annotations

import contextlib
import warnings
from types import ModuleType

import torch

from kbd.shared.protocol import Sized
from kbd.worker import generate, ingress, state


def size(problem: ModuleType, dtype: str) -> Sized:
    """The problem's own inputs in element type `dtype` (as the job casts them) and what one
    forward at them costs."""
    notes: list[str] = []
    with _quiet():
        args = _inputs(problem, dtype, notes)
        model = _model(problem, dtype, notes)
        output_bytes, flops = _forward(model, args, notes)
    seen: set[int] = set()
    param_bytes = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            param_bytes += _nbytes(tensor)
    return Sized(
        inputs=[describe(a) for a in args],
        input_bytes=[_nbytes(a) if isinstance(a, torch.Tensor) else 0 for a in args],
        output_bytes=output_bytes,
        param_bytes=param_bytes,
        flops=flops,
        note="; ".join(notes),
    )


def describe(value) -> str:
    """An input as `Sized.inputs` writes it: a tensor as DIMSxTYPE, anything else as its repr."""
    if not isinstance(value, torch.Tensor):
        return repr(value)
    dtype = generate.DTYPE_NAMES.get(value.dtype, str(value.dtype).removeprefix("torch."))
    return "x".join([*map(str, value.shape), dtype])


def check_inputs(args: list, sized: Sized) -> None:
    """get_inputs() must make what sizing measured (a problem whose shapes change between calls
    would otherwise run at shapes its estimate and its cache keys never saw)."""
    made = [describe(a) for a in args]
    if made != sized.inputs:
        raise ValueError(
            f"get_inputs() made {', '.join(made)}; sizing it had found {', '.join(sized.inputs)}"
        )


def _inputs(problem: ModuleType, dtype: str, notes: list[str]) -> list:
    try:
        with torch.device("meta"):
            args = list(problem.get_inputs())
    except MemoryError:
        raise
    except Exception as exc:
        notes.append(f"get_inputs() called for real, it fails on the meta device ({_line(exc)})")
        args = list(problem.get_inputs())
    return ingress.cast_floating(args, dtype) if dtype != "f32" else args


def _model(problem: ModuleType, dtype: str, notes: list[str]) -> torch.nn.Module:
    try:
        with torch.device("meta"):
            model = ingress.build_model(problem, None, dtype)
    except MemoryError:
        raise
    except Exception as exc:
        notes.append(f"model built on the CPU, it fails on the meta device ({_line(exc)})")
        model = ingress.build_model(problem, None, dtype).to("meta")
    if state.register_tensor_attributes(model) and dtype != "f32":
        model = model.to(ingress.TORCH_DTYPES[dtype])  # as the job does
    return model


def _forward(model: torch.nn.Module, args: list, notes: list[str]) -> tuple[int | None, int | None]:
    """(bytes of the outputs, FLOPs) of one forward on the meta device, or (None, None)."""
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    try:
        with torch.device("meta"):
            out, counted, estimated = generate.count_forward(model, meta)
    except MemoryError:
        raise
    except Exception as exc:
        why = _line(exc)
        notes.append(f"outputs and FLOPs unknown: the forward fails on the meta device ({why})")
        return None, None
    outs = out if isinstance(out, tuple | list) else [out]
    output_bytes = sum(_nbytes(o) for o in outs if isinstance(o, torch.Tensor))
    return output_bytes, counted or estimated


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0][:160]}" if lines else type(exc).__name__


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
