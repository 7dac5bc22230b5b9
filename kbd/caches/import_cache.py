"""The import cache: imported MLIR by content address, under .kbd/import-cache/ (supervisor side).

The import (torch.export plus torch-mlir's FX importer, about 0.8 s per kernel) depends only on
the kernel's source, its input and init specs (or, at its problem's own shapes, the input shapes
sizing found), dtype and seed, the torch and torch-mlir versions
and kbd's ingress code; pipelines come after it. So a re-sweep with another pipeline, or a rerun,
can skip it. An entry is the module as imported *after* the parameters were lifted into
arguments (kbd.worker.ingress.lift_parameters): the weights still come from the model at run time.

Entry files are `<dir>/<key[:2]>/<key>.mlir`, verified as kbd.caches.entries says: an entry whose
header, size or checksum does not match is deleted and rebuilt, never used; the least recently
used entries are evicted beyond the cache's bound.

Only the supervisor reads and writes entries: it puts a verified entry's text in the job, and
stores the module a worker sends back (`Imported`) under the key it chose itself. Workers need no
access to the cache directory at all.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import msgspec

from kbd.caches import entries
from kbd.shared import identity
from kbd.shared.protocol import ImportCache, Job

FORMAT = "kbd-import-cache 1"
DEFAULT_MAX_BYTES = 1 << 30
DIRECTORY = "import-cache"  # under .kbd/
SUFFIX = ".mlir"
# kbd code the imported module depends on (hashed into every key).
_INGRESS_CODE = (
    "worker/ingress.py",
    "worker/decompositions.py",
    "worker/norms.py",
    "worker/low_precision.py",
    "worker/transposed_convs.py",
    "worker/mlir/__init__.py",  # the whole package, as when it was one module
    "worker/mlir/importer.py",
    "worker/mlir/scans.py",
    "worker/mlir/walk.py",
    "worker/mlir/convention.py",
    "worker/mlir/rewrites.py",
    "worker/mlir/apply.py",
    "worker/mlir/execution.py",
    "worker/state.py",
)
_KBD_DIR = Path(__file__).resolve().parent.parent


def key(job: Job) -> str:
    """The content address of the job's imported module."""
    digest = hashlib.sha256()
    digest.update(_environment())
    digest.update(job.source_text.encode())
    # a job at its problem's own shapes has no input specs: the shapes sizing found stand in
    # for them (the worker checks that get_inputs() makes exactly those)
    sized = job.sized.inputs if job.sized is not None else None
    spec = (job.inputs, job.init_args, job.dtype, job.seed, sized)
    digest.update(msgspec.msgpack.encode(spec))
    return digest.hexdigest()


def attach(job: Job, directory: Path, max_bytes: int) -> Job:
    """The job with its import cache settings (directory absolute, no module yet)."""
    settings = ImportCache(key=key(job), directory=str(directory.resolve()), max_bytes=max_bytes)
    return msgspec.structs.replace(job, import_cache=settings)


def lookup(cache: ImportCache) -> str | None:
    """The verified text of the entry for `cache.key`, or None (absent, or corrupt: removed)."""
    body = entries.read(_path(cache), FORMAT)
    if body is None:
        return None
    try:
        return body.decode()
    except UnicodeDecodeError:
        return None


def store(cache: ImportCache, module: str) -> None:
    """Write an entry atomically, then evict the least recently used beyond the bound."""
    entries.write(_path(cache), FORMAT, module.encode(), cache.max_bytes)


def evict(directory: Path, max_bytes: int) -> None:
    """Remove least recently used entries until the cache holds at most `max_bytes`."""
    entries.evict(directory, SUFFIX, max_bytes)


def _path(cache: ImportCache) -> Path:
    return entries.path(cache.directory, cache.key, SUFFIX)


@functools.cache
def _environment() -> bytes:
    """Tool versions and a hash of kbd's ingress code: part of every key."""
    tools = identity.current()
    parts = [FORMAT, f"torch={tools.torch}", f"torch-mlir={tools.torch_mlir}"]
    for relative in _INGRESS_CODE:
        parts.append(hashlib.sha256((_KBD_DIR / relative).read_bytes()).hexdigest())
    return "\n".join(parts).encode()
