"""kbd's runtime symbols: memrefCopy, called through its ctypes callback with real descriptors;
allocation failures of compiled code (from the JIT and from a compile cache library), which end
a kernel as `memory`; the OpenMP runtime's settings."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

from kbd.worker import runtime
from tests.conftest import FIXTURE_KB, json_records, kbd

COPY = runtime.SYMBOLS["memrefCopy"]


class MemRef:
    """A ranked memref descriptor over `base`'s buffer, wrapped as an unranked memref.

    offset, sizes and strides are in elements, as MLIR lays them out. Keeps the descriptor
    alive as long as the wrapper.
    """

    def __init__(self, base: np.ndarray, offset: int, sizes, strides):
        assert len(sizes) == len(strides)
        self.base = base
        pointer = base.ctypes.data
        fields = [pointer, pointer, offset, *sizes, *strides]
        self.ranked = (ctypes.c_int64 * len(fields))(*fields)
        self.unranked = runtime._UnrankedMemRef(len(sizes), ctypes.addressof(self.ranked))

    @classmethod
    def of(cls, view: np.ndarray, base: np.ndarray) -> MemRef:
        """A descriptor of `view`, a view into the contiguous array `base`."""
        item = base.itemsize
        offset, rest = divmod(view.ctypes.data - base.ctypes.data, item)
        assert rest == 0
        strides = []
        for stride in view.strides:
            assert stride % item == 0
            strides.append(stride // item)
        return cls(base, offset, view.shape, strides)


def copy(src: MemRef, dst: MemRef, elem_size: int) -> None:
    COPY(elem_size, ctypes.byref(src.unranked), ctypes.byref(dst.unranked))


def contiguous(array: np.ndarray) -> MemRef:
    assert array.flags.c_contiguous
    return MemRef.of(array, array)


def test_contiguous_2d_f32():
    src = np.arange(12, dtype=np.float32).reshape(3, 4) * 1.5
    dst = np.zeros_like(src)
    copy(contiguous(src), contiguous(dst), 4)
    np.testing.assert_array_equal(dst, src)


def test_contiguous_f64_and_i8():
    src = np.random.default_rng(0).standard_normal((5, 2, 3))
    dst = np.zeros_like(src)
    copy(contiguous(src), contiguous(dst), 8)
    np.testing.assert_array_equal(dst, src)
    small = np.arange(-5, 5, dtype=np.int8)
    out = np.zeros_like(small)
    copy(contiguous(small), contiguous(out), 1)
    np.testing.assert_array_equal(out, small)


def test_transposed_source_into_contiguous_destination():
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    source = base.T  # sizes (4, 3), strides (1, 4) elements
    dst = np.zeros((4, 3), dtype=np.float32)
    copy(MemRef.of(source, base), contiguous(dst), 4)
    np.testing.assert_array_equal(dst, base.T)


def test_sliced_source_with_offset():
    base = np.arange(30, dtype=np.float32).reshape(5, 6)
    source = base[1:4, 2:5]
    memref = MemRef.of(source, base)
    assert list(memref.ranked) == [base.ctypes.data, base.ctypes.data, 8, 3, 3, 6, 1]
    dst = np.zeros((3, 3), dtype=np.float32)
    copy(memref, contiguous(dst), 4)
    np.testing.assert_array_equal(dst, base[1:4, 2:5])


def test_strided_destination_with_offset():
    src = np.arange(6, dtype=np.float32).reshape(2, 3) + 100
    base = np.zeros((4, 8), dtype=np.float32)
    target = base[1:3, 1:7:2]
    copy(contiguous(src), MemRef.of(target, base), 4)
    expected = np.zeros((4, 8), dtype=np.float32)
    expected[1:3, 1:7:2] = src
    np.testing.assert_array_equal(base, expected)


def test_negative_stride_source():
    base = np.arange(12, dtype=np.float32).reshape(4, 3)
    source = base[::-1, ::-1]
    dst = np.zeros((4, 3), dtype=np.float32)
    copy(MemRef(base, 11, (4, 3), (-3, -1)), contiguous(dst), 4)
    np.testing.assert_array_equal(dst, source)


def test_broadcast_source_stride_zero():
    base = np.array([7.0, 8.0, 9.0], dtype=np.float32)
    dst = np.zeros((4, 3), dtype=np.float32)
    copy(MemRef(base, 0, (4, 3), (0, 1)), contiguous(dst), 4)
    np.testing.assert_array_equal(dst, np.broadcast_to(base, (4, 3)))


def test_zero_dimensional():
    base = np.arange(5, dtype=np.float64)
    dst = np.zeros((), dtype=np.float64)
    copy(MemRef(base, 3, (), ()), MemRef(dst, 0, (), ()), 8)
    assert dst[()] == 3.0


def test_empty():
    src = np.zeros((0, 4), dtype=np.float32)
    dst = np.full((1,), 5.0, dtype=np.float32)  # a real buffer that must stay untouched
    copy(MemRef(src, 0, (0, 4), (4, 1)), MemRef(dst, 0, (0, 4), (4, 1)), 4)
    assert dst[0] == 5.0


@pytest.mark.parametrize("elem_size", [2, 4, 8])
def test_copies_raw_bytes_of_any_element_size(elem_size):
    src = np.frombuffer(bytes(range(24)), dtype=f"V{elem_size}").copy()
    dst = np.zeros_like(src)
    copy(contiguous(src), contiguous(dst), elem_size)
    assert dst.tobytes() == src.tobytes()


def test_a_buffer_that_was_not_allocated_is_a_memory_error_for_the_failure_handler():
    """Code whose allocations are not checked (no hook installed) may pass memrefCopy a NULL
    buffer, which it must not write through (SIGSEGV) but hand the worker a MemoryError."""
    src = np.arange(6, dtype=np.float32).reshape(2, 3)
    null = (ctypes.c_int64 * 7)(0, 0, 0, 2, 3, 3, 1)
    not_allocated = runtime._UnrankedMemRef(2, ctypes.addressof(null))
    source, target = contiguous(src), contiguous(np.zeros_like(src))
    failures: list[BaseException] = []
    with runtime.on_failure(failures.append):  # the worker's handler does not return
        COPY(4, ctypes.byref(source.unranked), ctypes.byref(not_allocated))
        COPY(4, ctypes.byref(not_allocated), ctypes.byref(target.unranked))
    assert [type(f) for f in failures] == [MemoryError, MemoryError]
    assert [str(f) for f in failures] == [
        "memrefCopy: its destination (2x3, 4-byte elements) was not allocated",
        "memrefCopy: its source (2x3, 4-byte elements) was not allocated",
    ]


def test_compiled_code_whose_allocation_fails_ends_the_kernel_as_memory_in_its_phase(tmp_path):
    """A real kernel under a real --mem-limit: traced, it concatenates 64 copies of its input
    (4 GiB), whose malloc returns NULL under the cap. The checked allocation reports it:
    `memory` in the run phase, naming the size (it was a SIGSEGV crash, then a MemoryError from
    memrefCopy writing the buffer). (Compile mode's first forward runs the graph in eager,
    whose allocation fails first.)"""
    levels = tmp_path / "levels.yaml"
    levels.write_text("- kernel: level9/19_copy_hog_traced.py\n")
    args = ["--kernelbench", str(FIXTURE_KB), "--levels", str(levels), "-j", "1", "--json"]
    result = kbd("run", *args, "-O", "0", "--mem-limit", "1GiB", cwd=tmp_path)
    record = json_records(result.stdout)["level9/19_copy_hog_traced"]
    assert (record["outcome"], record["phase"], record["signal"]) == ("memory", "run", None)
    assert record["message"] == (
        "MemoryError: compiled code's allocation of 4294967360 bytes (4.0 GiB) failed "
        "(limit 1.0 GiB)"
    )


def test_openmp_runtime_gets_one_thread_per_pinned_core():
    libraries = runtime.openmp_libraries()
    if not runtime.OPENMP_LIBRARY.is_file():
        pytest.skip("intel-openmp is not installed")
    assert libraries == [str(runtime.OPENMP_LIBRARY)]
    openmp = ctypes.CDLL(str(runtime.OPENMP_LIBRARY))
    assert openmp.omp_get_max_threads() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(("environment", "blocktime"), [({}, 1), ({"KMP_BLOCKTIME": "7"}, 7)])
def test_openmp_threads_sleep_after_1_ms_unless_the_user_said_otherwise(environment, blocktime):
    """In a fresh process: the runtime reads KMP_BLOCKTIME once, when it is loaded."""
    if not runtime.OPENMP_LIBRARY.is_file():
        pytest.skip("intel-openmp is not installed")
    probe = (
        "import ctypes; from kbd.worker import runtime; runtime.openmp_libraries(); "
        "print(ctypes.CDLL(str(runtime.OPENMP_LIBRARY)).kmp_get_blocktime())"
    )
    env = {k: v for k, v in os.environ.items() if k != "KMP_BLOCKTIME"} | environment
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == [str(blocktime)]


_ALLOCATING = """
import os, shutil, subprocess, sys
from pathlib import Path

import numpy as np
from torch_mlir import ir, passmanager

from kbd.worker import mlir, runtime

TEXT = '''
func.func @main(%out: memref<1xf32>, %n: memref<1xi64>) attributes {llvm.emit_c_interface} {
  %c0 = arith.constant 0 : index
  %size = memref.load %n[%c0] : memref<1xi64>
  %count = arith.index_cast %size : i64 to index
  %buffer = memref.alloc(%count) : memref<?xf32>
  %value = arith.constant 3.5 : f32
  memref.store %value, %buffer[%c0] : memref<?xf32>
  %back = memref.load %buffer[%c0] : memref<?xf32>
  memref.store %back, %out[%c0] : memref<1xf32>
  memref.dealloc %buffer : memref<?xf32>
  return
}
'''
LOWER = "builtin.module(finalize-memref-to-llvm,convert-to-llvm,reconcile-unrealized-casts)"

with ir.Context():
    module = ir.Module.parse(TEXT)
    passmanager.PassManager.parse(LOWER).run(module.operation)
    compiled = mlir.Compiled(module, 0)  # at -O2 LLVM elides a buffer it can see through
if sys.argv[1] == "library":  # as the compile cache links and loads it (kbd.worker.library)
    scratch = Path(sys.argv[2])
    compiled.write_object(scratch / "kernel.o")
    subprocess.run([shutil.which("ld"), "-shared", "-Bsymbolic", "-z", "notext", "-o",
                    str(scratch / "kernel.so"), str(scratch / "kernel.o")], check=True)
    compiled = mlir.Compiled.from_library(scratch / "kernel.so")
out = np.zeros(1, np.float32)
compiled([out, np.array([4], np.int64)])  # the fast path: allocated, written, read
print("allocated", out[0], flush=True)


def report(exc):
    print(f"{type(exc).__name__}: {exc}", flush=True)
    os._exit(3)


with runtime.on_failure(report):
    compiled([out, np.array([1 << 60], np.int64)])  # 4 EiB: malloc returns NULL
print("not reported", flush=True)
"""


@pytest.mark.parametrize("loaded", ["jit", "library"])
def test_a_failed_allocation_reaches_the_failure_handler_from_the_jit_and_a_library(
    tmp_path, loaded
):
    """Compiled code calls the failure hook with the size malloc could not give, from the
    ExecutionEngine and from a shared library of its object code (what the compile cache
    stores): the library holds the checking wrapper, and loading it installs the hook."""
    done = subprocess.run(
        [sys.executable, "-c", _ALLOCATING, loaded, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == [
        "allocated 3.5",
        "MemoryError: compiled code's allocation of 4611686018427387904 bytes (4294967296.0 "
        "GiB) failed",
    ]


def test_benchmarks_run_with_an_allocator_that_keeps_freed_memory():
    """bench.steady_allocator (called before the first sample): a 16 MiB and a 64 MiB block,
    written, freed, asked for and written again, fault no page in again: they stay in the
    heap (glibc's default maps them afresh and unmaps them on free, and maps blocks of 32 MiB
    and more whatever its threshold). In a process of its own: the setting lasts for the
    process."""
    program = """
import ctypes, resource
from kbd.worker import bench
assert bench.steady_allocator()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
for size in (16 << 20, 64 << 20):
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    libc.free(block)
    print(size, faults < 64)
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == [str(16 << 20), "True", str(64 << 20), "True"]


def test_benchmark_sides_are_called_until_the_heap_stops_growing():
    """bench._settle calls the sides in turn until a round faults (almost) no page in: a
    side that keeps 64 MiB more on each of its first 3 calls (as a side whose large blocks the
    allocator has not found room for yet) is called 4 times, the other side with it; a side
    that grows nothing is called once. In a process of its own, whose faults are its own."""
    program = """
from kbd.worker import bench
kept, calls = [], {"growing": 0, "steady": 0}
def growing(batch):
    calls["growing"] += 1
    if len(kept) < 3:
        kept.append(bytearray(64 << 20))  # zero-filled: its pages are touched
    return 1.0
def steady(batch):
    calls["steady"] += 1
    return 1.0
bench._settle([growing, steady])
print(calls["growing"], calls["steady"])
calls["steady"] = 0
bench._settle([steady])
print(calls["steady"])
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == ["4", "4", "1"]
