"""The import step with the import cache: use the module the supervisor sent, or import afresh.

The supervisor owns the cache (kbd.caches.import_cache): it verifies an entry before putting its
text in the job, and stores what a worker sends back in an `Imported` frame. A worker never writes
to the cache, so a faulty or hostile kernel cannot poison other kernels' entries.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from kbd.shared.protocol import MAX_FRAME, Imported, Job
from kbd.worker import mlir

# Modules larger than this are not sent back (the frame, key and tags must fit in MAX_FRAME).
MAX_CACHED_TEXT = MAX_FRAME - (64 << 10)


def import_module(job: Job, model, args, send: Callable[[Imported], None]):
    """The imported MLIR module of `model` called with `args` (parameters already lifted)."""
    cache = job.import_cache
    if cache is not None and cache.module is not None:
        try:
            return mlir.parse_module(cache.module)
        except Exception as exc:  # verified by checksum, yet unusable: import again
            print(f"[kbd] cached import unusable, importing again: {exc}", file=sys.stderr)
    module = mlir.import_model(model, args)
    if cache is not None:
        text = mlir.module_text(module)
        if len(text.encode()) <= MAX_CACHED_TEXT:
            send(Imported(key=cache.key, module=text))
    return module
