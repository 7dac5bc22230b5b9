"""Containment of workers, supervisor side: scratch folders and what records say about it.

A worker contains the kernel it runs (kbd/worker/contain.py): it may write only beneath its
scratch folder and the job's extra writable paths, has no network, and holds no descriptor but
its own. It reports each mechanism in its record's limits under the keys of `KEYS`; a value
starting with `NOT_ENFORCED` means the mechanism was missing, with the reason. No torch here.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kbd.results.record import Record

KEYS = ("filesystem", "network")
NOT_ENFORCED = "not enforced: "


def missing(limits: dict[str, str]) -> dict[str, str]:
    """The containment mechanisms a record's limits say were not enforced: key -> reason."""
    return {
        key: limits[key][len(NOT_ENFORCED) :]
        for key in KEYS
        if limits.get(key, "").startswith(NOT_ENFORCED)
    }


def summary_lines(records: list[Record]) -> list[str]:
    """One line per missing mechanism and reason, with how many kernels ran without it."""
    tally = Counter(
        (key, reason) for record in records for key, reason in missing(record.limits).items()
    )
    return [
        f"containment: {key} not enforced for {count} kernel{'s' if count > 1 else ''}: {reason}"
        for (key, reason), count in sorted(tally.items())
    ]


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
