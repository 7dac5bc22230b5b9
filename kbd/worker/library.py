"""The worker's side of the compile cache (kbd.caches.compile_cache): build a shared library from
the JIT's code and run the kernel from it, or load the library the supervisor found in the cache.

The ExecutionEngine keeps the object code it generated (`dump_to_object_file`); the system linker
turns it into a shared library: `ld -shared -Bsymbolic`, so that the library's references to its
own functions bind to them and never to a same-named symbol of the process (the interpreter's
`main`, say). JIT code uses the large code model, whose absolute addresses become relocations
the dynamic loader applies to the library's text when loading it (`-z notext`). Its remaining
references (libc, libm, the OpenMP runtime) resolve against the process, exactly as the JIT
resolves them.

The code that runs is the code that is cached: a kernel compiled on a miss runs from the library
it sends to the supervisor, so every cached library has passed through a run and a check once.
What cannot be a library runs from the JIT as before, and its record says why it was not cached:
code calling kbd's runtime symbols (`memrefCopy`, which only the engine provides), no linker on
the machine, a library the loader refuses (e.g. a scratch folder on a noexec mount), or one
too large for a frame.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from kbd.shared.protocol import MAX_FRAME, Job, Library, Signature
from kbd.worker import mlir, runtime

MAX_LIBRARY_BYTES = MAX_FRAME - (64 << 10)  # the frame also carries the key and signature
LINK_TIMEOUT_S = 60
NOT_CACHED = "not cached: "


def signature(out_types, in_types, mutated) -> Signature:
    return Signature(
        outputs=[(t.dims, t.dtype) for t in out_types],
        inputs=[(t.dims, t.dtype) for t in in_types],
        mutated=tuple(mutated),
    )


def buffer_types(sig: Signature) -> tuple[list[mlir.BufferType], list[mlir.BufferType]]:
    """(outputs, inputs) of a signature, as `mlir.results_to_out_params` returns them."""
    outputs = [mlir.BufferType(tuple(dims), dtype) for dims, dtype in sig.outputs]
    inputs = [mlir.BufferType(tuple(dims), dtype) for dims, dtype in sig.inputs]
    return outputs, inputs


def load_cached(job: Job) -> mlir.Compiled | None:
    """The cached library the supervisor put in the job, loaded; None when there is none or it
    does not load (the kernel is then compiled afresh and the entry replaced)."""
    cache = job.compile_cache
    if cache is None or cache.library is None or cache.signature is None:
        return None
    try:
        return mlir.Compiled.from_library(
            Path(cache.library), openmp=runtime.uses_openmp(job.stages)
        )
    except (OSError, RuntimeError) as exc:
        print(f"[kbd] cached library unusable, compiling again: {exc}", file=sys.stderr)
        return None


def offer(
    job: Job, compiled: mlir.Compiled, module, sig: Signature, send: Callable[[Library], None]
) -> tuple[mlir.Compiled, str]:
    """After the JIT: link its code into a library, load it and send it to the supervisor.

    Returns what to run (the library, or the JIT's code when there is no library) and the
    record's `compile_cache` note ("miss", or why nothing was cached).
    """
    assert job.compile_cache is not None and job.limits.scratch is not None
    needs = mlir.external_functions(module) & set(runtime.SYMBOLS)
    if needs:
        return compiled, NOT_CACHED + f"calls kbd's runtime ({', '.join(sorted(needs))})"
    linker = shutil.which("ld")
    if linker is None:
        return compiled, NOT_CACHED + "no linker (ld) on PATH"
    try:
        data, loaded = _link_and_load(job, compiled, linker)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return compiled, NOT_CACHED + str(exc)
    if len(data) > MAX_LIBRARY_BYTES:
        return compiled, NOT_CACHED + f"library of {len(data)} bytes is too large"
    send(Library(key=job.compile_cache.key, data=data, signature=sig))
    return loaded, "miss"


def _link_and_load(job: Job, compiled: mlir.Compiled, linker: str):
    """(the library's bytes, the library loaded); raises with the reason when either fails."""
    scratch = Path(job.limits.scratch)
    obj, library = scratch / "kernel.o", scratch / "kernel.so"
    compiled.write_object(obj)
    linked = subprocess.run(
        [linker, "-shared", "-Bsymbolic", "-z", "notext", "-o", str(library), str(obj)],
        capture_output=True,
        text=True,
        timeout=LINK_TIMEOUT_S,
    )
    if linked.returncode != 0:
        first = (linked.stderr.strip().splitlines() or ["failed"])[0]
        raise RuntimeError(f"ld: {first}")
    data = library.read_bytes()
    try:
        loaded = mlir.Compiled.from_library(library, openmp=runtime.uses_openmp(job.stages))
    except (OSError, RuntimeError) as exc:
        raise RuntimeError(f"the library does not load ({exc})") from None
    return data, loaded
