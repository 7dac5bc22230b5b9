"""Scratch folders of workers, and the files no worker may open (supervisor side).

Each worker gets a fresh private folder for its temporary files (its only writable place when
contained: kbd/worker/contain.py), removed when the kernel ends, whatever the kernel did to it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path


def store_files(db: Path) -> tuple[str, ...]:
    """The files of an SQLite database, which no worker may open."""
    db = db.resolve()
    return tuple(str(db) + suffix for suffix in ("", "-wal", "-shm", "-journal"))


@contextlib.contextmanager
def scratch_folder(kernel: str) -> Iterator[Path]:
    """A fresh, private folder for one worker's temporary files, removed afterwards."""
    label = re.sub(r"[^A-Za-z0-9_.-]+", "-", kernel)[:60]
    path = Path(tempfile.mkdtemp(prefix=f"kbd-{label}-"))
    try:
        yield path
    finally:
        remove_tree(path)


def remove_tree(path: Path) -> None:
    """Remove what a kernel left, even folders it made read-only (as a non-root user)."""

    def make_writable_and_retry(function, name, _exc):
        with contextlib.suppress(OSError):
            parent = os.path.dirname(name)
            os.chmod(parent, os.stat(parent).st_mode | stat.S_IRWXU)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, stat.S_IRWXU)
                shutil.rmtree(name, ignore_errors=True)
            else:
                function(name)

    shutil.rmtree(path, onerror=make_writable_and_retry)
