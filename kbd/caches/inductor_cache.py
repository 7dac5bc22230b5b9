"""Inductor's own caches for the `--baseline inductor` side: one folder per kernel, kept under
.kbd/inductor-cache/ (supervisor side).

With `--baseline inductor`, each of a kernel's benchmark processes (`--bench-processes`) calls
`torch.compile(model)` once before timing. Compiling a whole network with Inductor takes minutes
(its C++ kernels are built one by one in the worker), and in a fresh cache every process and every
sweep would pay that again. In a folder kept for the kernel, Inductor's FX-graph and AOT caches
turn every compile after the first into a load: ResNet18 at bench shapes, 43 s then 3 s.

Unlike kbd's import and compile caches, these folders are written by the workers: Inductor
writes them itself, in its own format, and validates its own keys (torch's version, the graph,
its configuration, the C++ compiler and the CPU's ISA). Containment is kept per kernel: a
kernel's folder is keyed by its source, and only that kernel's workers may write it
(`Limits.writable`), so what a kernel leaves there reaches only its own Inductor figure, which
its code could change anyway. Folders are removed least recently used first beyond
`DEFAULT_MAX_BYTES`.

Without the cache (`--no-compile-cache`, and tuning) a kernel still gets a folder for its
processes, removed when it ends (`runner.run_kernel`), so that only its first process compiles.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
from pathlib import Path

import msgspec

from kbd.shared.protocol import Job

DIRECTORY = "inductor-cache"  # under .kbd/
DEFAULT_MAX_BYTES = 4 << 30
FORMAT = "kbd-inductor-cache 1"  # part of every key: a new layout starts afresh


def folder(directory: Path, job: Job) -> Path:
    """The kernel's folder in the cache at `directory`: its name, then a key of its source and
    element type (what makes Inductor's graphs differ between two runs of one problem file)."""
    key = hashlib.sha256(f"{FORMAT}\0{job.dtype}\0{job.source_text}".encode()).hexdigest()
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(job.kernel).stem)[:60]
    return directory / f"{name}-{key[:16]}"


def attach(job: Job, directory: Path) -> Job:
    """`job` naming its kernel's folder in the cache at `directory` (made when the kernel runs:
    `ready`)."""
    assert job.bench is not None
    bench = msgspec.structs.replace(job.bench, inductor_cache=str(folder(directory, job)))
    return msgspec.structs.replace(job, bench=bench)


def ready(path: Path) -> bool:
    """Make a kernel's folder (on the node it runs on) and mark it just used; False when it
    cannot be made (the kernel then gets a temporary one: `runner.run_kernel`)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        os.utime(path)  # recently used: evicted last
    except OSError:
        return False
    return True


def evict(directory: Path, max_bytes: int, keep: frozenset[Path] = frozenset()) -> None:
    """Remove whole kernel folders, least recently used first, until the cache holds at most
    `max_bytes`; never those in `keep` (the one a kernel just used)."""
    if not directory.is_dir():
        return
    found = []
    for path in directory.iterdir():
        if path.is_dir() and not path.is_symlink():
            with contextlib.suppress(OSError):
                found.append((path.stat().st_mtime, _size(path), path))
    total = sum(size for _, size, _ in found)
    for _, size, path in sorted(found):
        if total <= max_bytes:
            break
        if path in keep:
            continue
        shutil.rmtree(path, ignore_errors=True)
        total -= size


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total
