"""Runtime symbols that JIT-compiled code calls and the torch-mlir wheel does not ship.

Parallel loops lowered to OpenMP call the `__kmpc_*` entry points of an LLVM/Intel OpenMP
runtime, which torch's libgomp lacks: kbd loads `libiomp5.so` from the `intel-openmp` wheel
(installed next to the interpreter, in `<prefix>/lib`) into the execution engine of a pipeline
that lowers to OpenMP, with as many threads as the worker has pinned cores.

Upstream these live in libmlir_c_runner_utils, which the wheel lacks. Lowered code calls them by
their plain C name (`memrefCopy`), so they are registered with `raw_register_runtime`; the
convenience `register_runtime` would prepend `_mlir_ciface_` and never match.

Compiled code's allocations are checked (kbd.worker.mlir.allocations): one that returns NULL
calls `allocation_failed` with the requested size, through the module's hook global, which
`install_allocation_hook` fills once the code is loaded.

A symbol that fails cannot raise into the compiled code that called it, nor return: that code
would go on with a buffer that was never allocated (a NULL buffer reaching memrefCopy, from code
whose allocations are not checked) or never filled. Inside `on_failure(handler)` (the worker's
job) the failure goes to `handler`, which ends the process with the failure as its result: an
allocation failure ends as `memory`, as a Python `MemoryError` does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import numpy as np


class _UnrankedMemRef(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int64), ("descriptor", ctypes.c_void_p)]


def _strided_view(memref: _UnrankedMemRef, elem_size: int, what: str) -> np.ndarray:
    """A numpy view (raw bytes per element) of a ranked memref descriptor; MemoryError for a
    buffer that was not allocated (`what` names it in the message).

    Descriptor layout: allocated ptr, aligned ptr, offset, sizes[rank], strides[rank].
    """
    rank = memref.rank
    fields = (ctypes.c_int64 * (3 + 2 * rank)).from_address(memref.descriptor)
    aligned, offset = fields[1], fields[2]
    sizes = tuple(fields[3 : 3 + rank])
    strides = tuple(s * elem_size for s in fields[3 + rank : 3 + 2 * rank])
    start = aligned + offset * elem_size
    if 0 in sizes:
        return np.empty(sizes, dtype=f"V{elem_size}")
    if aligned == 0:  # malloc returned NULL and the compiled code went on
        shape = "x".join(map(str, sizes)) or "scalar"
        raise MemoryError(f"{what} ({shape}, {elem_size}-byte elements) was not allocated")
    span = elem_size + sum((n - 1) * abs(s) for n, s in zip(sizes, strides, strict=True))
    lowest = start + sum((n - 1) * s for n, s in zip(sizes, strides, strict=True) if s < 0)
    raw = (ctypes.c_char * span).from_address(lowest)
    first = np.frombuffer(raw, dtype=np.uint8)[start - lowest :].view(f"V{elem_size}")
    return np.lib.stride_tricks.as_strided(first, shape=sizes, strides=strides)


def _memref_copy(elem_size: int, src, dst) -> None:
    try:
        source = _strided_view(src.contents, elem_size, "memrefCopy: its source")
        target = _strided_view(dst.contents, elem_size, "memrefCopy: its destination")
        np.copyto(target, source)
    except BaseException as exc:
        _fail("memrefCopy", exc)


_handler: Callable[[BaseException], NoReturn] | None = None
_failing = threading.Lock()  # compiled code may call from several threads: one failure ends it


@contextlib.contextmanager
def on_failure(handler: Callable[[BaseException], NoReturn]) -> Iterator[None]:
    """While inside, a runtime symbol that fails calls `handler` with the exception, from the
    thread that called the symbol; `handler` must not return (see the module docstring).
    Outside, the handler of an enclosing `on_failure` applies; outside all, ctypes prints the
    exception and the symbol returns."""
    global _handler
    outer, _handler = _handler, handler
    try:
        yield
    finally:
        _handler = outer


def _fail(symbol: str, exc: BaseException) -> None:
    exc.add_note(f"(in kbd's runtime symbol {symbol}, called by compiled code)")
    with _failing:  # held until the process ends: a second failure waits for that
        if _handler is None:
            raise exc
        _handler(exc)


_MEMREF_COPY_TYPE = ctypes.CFUNCTYPE(
    None, ctypes.c_int64, ctypes.POINTER(_UnrankedMemRef), ctypes.POINTER(_UnrankedMemRef)
)
# Module-level references keep the callbacks alive as long as any engine may call them.
SYMBOLS = {"memrefCopy": _MEMREF_COPY_TYPE(_memref_copy)}


def _allocation_failed(size: int) -> None:
    gib = size / (1 << 30)
    _fail(
        "allocation_failed",
        MemoryError(f"compiled code's allocation of {size} bytes ({gib:.1f} GiB) failed"),
    )


ALLOCATION_FAILED = ctypes.CFUNCTYPE(None, ctypes.c_int64)(_allocation_failed)


def install_allocation_hook(address: int) -> None:
    """Point the hook global at `address` (a module's `FAILURE_HOOK`) to `allocation_failed`."""
    ctypes.c_void_p.from_address(address).value = ctypes.cast(
        ALLOCATION_FAILED, ctypes.c_void_p
    ).value


def register(engine) -> None:
    """Make kbd's runtime symbols visible to code JIT-compiled by `engine`."""
    for name, callback in SYMBOLS.items():
        engine.raw_register_runtime(name, ctypes.cast(callback, ctypes.c_void_p))


OPENMP_LIBRARY = Path(sys.prefix) / "lib" / "libiomp5.so"
OPENMP_PASS = "convert-scf-to-openmp"
# How long an idle OpenMP thread spins for the next parallel loop before it sleeps. The runtime's
# default, 200 ms, keeps a pinned core busy long after a kernel returns: during a benchmark it
# spins through eager's whole batch of calls (eager's second thread then shares its core), and
# it takes the core from whatever the process runs next. 1 ms still covers the gap between
# back-to-back calls of a timing batch; 0 would make every call wake its threads (~45 us per call
# measured on a 256x256 matmul on 2 cores, against ~170 us for the call).
OPENMP_BLOCKTIME_MS = 1


def uses_openmp(stages) -> bool:
    """Whether a pipeline lowers parallel loops to OpenMP (its code then calls __kmpc_*)."""
    return any(stage.kind == "pass" and stage.name == OPENMP_PASS for stage in stages)


def openmp_libraries() -> list[str]:
    """The OpenMP runtime to load into an execution engine, when installed, with its thread
    count set to the cores this process may run on and idle threads sleeping after
    OPENMP_BLOCKTIME_MS, unless the user set KMP_BLOCKTIME (starting it costs some 40 ms)."""
    if not OPENMP_LIBRARY.is_file():
        return []
    openmp = ctypes.CDLL(str(OPENMP_LIBRARY), mode=ctypes.RTLD_GLOBAL)
    openmp.omp_set_num_threads(len(os.sched_getaffinity(0)))
    if "KMP_BLOCKTIME" not in os.environ:  # the runtime reads the user's own setting
        openmp.kmp_set_blocktime(OPENMP_BLOCKTIME_MS)
    return [str(OPENMP_LIBRARY)]
