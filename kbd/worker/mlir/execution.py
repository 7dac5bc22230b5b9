"""Running compiled code: JIT-compiled by the ExecutionEngine or loaded from a shared library,
called through ctypes with memref descriptors (`Compiled`, `BenchTimer`), its allocations
checked (kbd.worker.mlir.allocations); plus what goes with it on a module lowered to LLVM (its
target features, the functions it leaves external)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from torch_mlir import ir
from torch_mlir.execution_engine import ExecutionEngine

from kbd.worker import runtime
from kbd.worker.mlir import allocations
from kbd.worker.mlir.convention import (
    BENCH_ENTRY,
    CIFACE_PREFIX,
    ENTRY,
    NOOP_BENCH_ENTRY,
    PACKED_PREFIX,
)


def set_target_features(module: ir.Module, features: Sequence[str]) -> None:
    """Generate code for these CPU features (LLVM names, e.g. `+avx512f`) rather than only the
    host's: sets `target_features` on every `llvm.func` of a module lowered to LLVM. Code built
    for features the host lacks can be compiled and written out, but not run."""
    with module.context:
        attribute = ir.Attribute.parse(
            "#llvm.target_features<[" + ", ".join(f'"{f}"' for f in features) + "]>"
        )
        for op in module.body.operations:
            if op.operation.name == "llvm.func":
                op.attributes["target_features"] = attribute


class Compiled:
    """Compiled code whose entry takes (outputs..., inputs...) as memrefs: JIT-compiled by the
    ExecutionEngine, or loaded from a shared library built from the JIT's object code
    (`from_library`, see kbd.worker.library)."""

    def __init__(self, module: ir.Module, opt_level: int, *, openmp: bool = False):
        """`openmp`: load the OpenMP runtime (the module has parallel loops lowered to it). The
        module's allocations are checked first (kbd.worker.mlir.allocations: the module
        changes)."""
        libraries = runtime.openmp_libraries() if openmp else []
        allocations.check_allocations(module)
        self._engine = ExecutionEngine(module, opt_level=opt_level, shared_libs=libraries)
        runtime.register(self._engine)
        hook = self._engine.raw_lookup(allocations.HOOK_LOOKUP)
        if hook:
            runtime.install_allocation_hook(hook)
        self._address = lambda name: self._engine.raw_lookup(CIFACE_PREFIX + name)
        self._entry = self._function(ENTRY)  # forces compilation now, not at first call

    @classmethod
    def from_library(cls, path: Path, *, openmp: bool = False) -> Compiled:
        """Load a library `kbd.worker.library.link` built; raises OSError when it does not load
        (e.g. a symbol the process lacks)."""
        if openmp:
            runtime.openmp_libraries()  # its __kmpc_* symbols resolve the library's calls
        library = ctypes.CDLL(str(path))  # RTLD_LOCAL: its symbols stay its own
        with contextlib.suppress(ValueError):  # no hook: the code allocates nothing
            hook = ctypes.c_void_p.in_dll(library, allocations.FAILURE_HOOK)
            runtime.install_allocation_hook(ctypes.addressof(hook))

        def address(name: str) -> int | None:
            symbol = getattr(library, PACKED_PREFIX + CIFACE_PREFIX + name, None)
            return ctypes.cast(symbol, ctypes.c_void_p).value if symbol is not None else None

        self = cls.__new__(cls)
        self._library = library
        self._address = address
        self._entry = self._function(ENTRY)
        return self

    def write_object(self, path: Path) -> None:
        """Write the JIT-compiled machine code as an object file (e.g. for objdump -d)."""
        self._engine.dump_to_object_file(str(path))

    def __call__(self, buffers: Sequence[np.ndarray]) -> None:
        self._entry(_Packed(buffers).array)

    def timer(self, buffers: Sequence[np.ndarray], *, noop: bool = False) -> BenchTimer:
        """The module's timing loop (see `add_bench_wrappers`) bound to these buffers."""
        return BenchTimer(self._function(NOOP_BENCH_ENTRY if noop else BENCH_ENTRY), buffers)

    def _function(self, name: str):
        """The packed-interface wrapper of function `name` (emitted with a C interface)."""
        address = self._address(name)
        if not address:
            raise RuntimeError(f"the compiled code has no function {name}")
        return ctypes.CFUNCTYPE(None, ctypes.c_void_p)(address)


def external_functions(module: ir.Module) -> set[str]:
    """Names of the functions a module lowered to LLVM declares without defining them."""
    names = set()
    for op in module.body.operations:
        if op.operation.name == "llvm.func" and not op.regions[0].blocks:
            names.add(ir.StringAttr(op.attributes["sym_name"]).value)
    return names


class _Packed:
    """The packed-interface argument array for memref buffers, plus optional index scalars.

    Holds every ctypes object it points to, so the array stays valid while this object lives.
    """

    def __init__(self, buffers: Sequence[np.ndarray], extra: Sequence[object] = ()):
        self._keep = [ctypes.pointer(_descriptor(b)) for b in buffers]
        self._keep += list(extra)
        self.array = (ctypes.c_void_p * len(self._keep))()
        for i, obj in enumerate(self._keep):
            self.array[i] = ctypes.cast(ctypes.pointer(obj), ctypes.c_void_p)


@functools.cache
def _descriptor_type(rank: int) -> type[ctypes.Structure]:
    """The C layout of a ranked memref descriptor: allocated and aligned pointers, offset, then
    sizes and strides (in elements) for rank > 0. One class per rank, made once: compile mode
    calls compiled subgraphs on every forward, and making a ctypes class costs ~100 us."""
    fields = [
        ("allocated", ctypes.c_void_p),
        ("aligned", ctypes.c_void_p),
        ("offset", ctypes.c_int64),
    ]
    if rank:
        fields += [("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    return type(f"MemRefDescriptor{rank}", (ctypes.Structure,), {"_fields_": fields})


def _descriptor(array: np.ndarray) -> ctypes.Structure:
    """The memref descriptor of a numpy array (which must outlive it)."""
    descriptor = _descriptor_type(array.ndim)()
    descriptor.allocated = descriptor.aligned = array.ctypes.data
    if array.ndim:
        descriptor.sizes[:] = array.shape
        descriptor.strides[:] = [stride // array.itemsize for stride in array.strides]
    return descriptor


class BenchTimer:
    """Calls a compiled timing loop: `timer(samples, batch)` -> nanoseconds of each sample."""

    def __init__(self, function, buffers: Sequence[np.ndarray]):
        self._function = function
        self._buffers = list(buffers)

    def __call__(self, samples: int, batch: int) -> np.ndarray:
        ns = np.zeros(samples, np.int64)
        scalars = [ctypes.c_void_p(ns.ctypes.data), ctypes.c_int64(samples), ctypes.c_int64(batch)]
        packed = _Packed(self._buffers, scalars)
        self._function(packed.array)
        return ns
