"""Verified files of a content-addressed cache, with least-recently-used eviction (supervisor side).

The import cache and the compile cache keep one file per entry, `<dir>/<key[:2]>/<key><suffix>`:
a header line naming the cache's format, the body's size and its sha256, then the body. An entry
whose header, size or checksum does not match is deleted and reported absent, never used.
Writes go to a temporary file renamed into place; after each write the least recently used
entries are evicted until the cache is within its bound. Reading an entry marks it used.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path


def path(directory: str | Path, key: str, suffix: str) -> Path:
    return Path(directory) / key[:2] / f"{key}{suffix}"


def read(entry: Path, form: str) -> bytes | None:
    """The verified body of `entry`, or None (absent, or damaged: removed)."""
    try:
        data = entry.read_bytes()
    except OSError:
        return None
    body = _verified(data, form)
    if body is None:
        with contextlib.suppress(OSError):
            entry.unlink()
        return None
    with contextlib.suppress(OSError):
        os.utime(entry)  # recently used: evicted last
    return body


def write(entry: Path, form: str, body: bytes, max_bytes: int) -> None:
    """Write an entry atomically, then evict the least recently used beyond `max_bytes`."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_header(form, body) + body)
        os.replace(tmp, entry)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    evict(entry.parent.parent, entry.suffix, max_bytes)


def evict(directory: Path, suffix: str, max_bytes: int) -> None:
    """Remove least recently used entries until the cache holds at most `max_bytes`."""
    found = []
    for entry in directory.glob(f"*/*{suffix}"):
        with contextlib.suppress(OSError):
            st = entry.stat()
            found.append((st.st_mtime, st.st_size, entry))
    total = sum(size for _, size, _ in found)
    for _, size, entry in sorted(found):
        if total <= max_bytes:
            break
        with contextlib.suppress(OSError):
            entry.unlink()
        total -= size


def _header(form: str, body: bytes) -> bytes:
    return f"{form} size={len(body)} sha256={hashlib.sha256(body).hexdigest()}\n".encode()


def _verified(data: bytes, form: str) -> bytes | None:
    header, newline, body = data.partition(b"\n")
    if not newline or header + newline != _header(form, body):
        return None
    return body
