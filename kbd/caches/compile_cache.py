"""The compile cache: compiled kernels as shared libraries by content address, under
.kbd/compile-cache/ (supervisor side).

After the import, a kernel's pipeline and the JIT (LLVM at -O3 takes 0.1-0.3 s even for a
ReLU, much more for real kernels) produce machine code that depends only on the imported module
(the import cache's key: the kernel's source, its input and init specs or the input shapes
sizing found, dtype, seed, the torch
and torch-mlir versions and kbd's ingress code), the pipeline's stages (with their transform
scripts), the optimisation level, whether timing loops were added (--benchmark), the CPU the
JIT targets (the host's) and kbd's own code. That is this cache's key: any change of kbd's code
(its code hash, kbd.shared.identity) or of the CPU makes a new key, so no entry outlives
the code that built it.

A library holds everything the JIT compiled, kbd's checked allocations included
(kbd.worker.mlir.allocations; their hook is set when the worker loads it), and any change to
that code is a change of kbd's code hash, hence of every key.

The worker links the JIT's object code into a shared library (kbd.worker.library), runs the
kernel from that library, and sends it back in a `Library` frame; the supervisor stores it with
its calling signature. On a hit the supervisor verifies the entry (kbd.caches.entries: size and
sha256), copies the library into the worker's scratch folder and names it in the job; the
worker loads it instead of importing, lowering and compiling. Workers never write the cache.
"""

from __future__ import annotations

import functools
import hashlib
import platform
from pathlib import Path

import msgspec

from kbd.caches import entries, import_cache
from kbd.shared import identity
from kbd.shared.protocol import CompileCache, Job, Library

FORMAT = "kbd-compile-cache 1"
DEFAULT_MAX_BYTES = 1 << 30
DIRECTORY = "compile-cache"  # under .kbd/
SUFFIX = ".so.entry"
LIBRARY_NAME = "cached-kernel.so"  # in the worker's scratch folder


def key(job: Job) -> str:
    """The content address of the job's compiled code."""
    digest = hashlib.sha256()
    digest.update(_environment())
    digest.update(import_cache.key(job).encode())
    digest.update(msgspec.msgpack.encode((job.stages, job.opt_level, job.bench is not None)))
    return digest.hexdigest()


def attach(job: Job, directory: Path, max_bytes: int) -> Job:
    """The job with its compile cache settings (directory absolute, no library yet)."""
    settings = CompileCache(key=key(job), directory=str(directory.resolve()), max_bytes=max_bytes)
    return msgspec.structs.replace(job, compile_cache=settings)


def lookup(cache: CompileCache) -> Library | None:
    """The verified entry for `cache.key`, or None (absent, or damaged: removed)."""
    body = entries.read(_path(cache), FORMAT)
    if body is None:
        return None
    try:
        library = msgspec.msgpack.decode(body, type=Library)
    except msgspec.DecodeError:
        return None
    return library if library.key == cache.key else None


def install(job: Job, library: Library, scratch: Path) -> Job:
    """The job with `library` copied into the worker's scratch folder and named in it."""
    path = scratch / LIBRARY_NAME
    path.write_bytes(library.data)
    settings = msgspec.structs.replace(
        job.compile_cache, library=str(path), signature=library.signature
    )
    return msgspec.structs.replace(job, compile_cache=settings)


def store(cache: CompileCache, library: Library) -> None:
    """Write an entry atomically, then evict the least recently used beyond the bound."""
    entries.write(_path(cache), FORMAT, msgspec.msgpack.encode(library), cache.max_bytes)


def _path(cache: CompileCache) -> Path:
    return entries.path(cache.directory, cache.key, SUFFIX)


@functools.cache
def _environment() -> bytes:
    """kbd's code hash and the host CPU (the JIT generates code for it): part of every key."""
    return "\n".join([FORMAT, identity.current().code_hash, *_host_cpu()]).encode()


def _host_cpu() -> list[str]:
    """The machine, CPU model and feature flags, as /proc/cpuinfo names them."""
    lines = [platform.machine()]
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return lines
    for field in ("model name", "flags"):
        found = next((line for line in text.splitlines() if line.startswith(field)), None)
        if found:
            lines.append(found.split(":", 1)[1].strip())
    return lines
