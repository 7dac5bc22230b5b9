"""A process's descendants and their memory, read from /proc cheaply (supervisor side).

The memory watch samples every worker's process tree ten times a second. psutil finds children
by reading the status of every process on the machine (about 5 ms with 90 processes, more on a
busy host), which costs the supervisor a noticeable share of a core that the workers need.
Linux lists each thread's children in `/proc/PID/task/TID/children`, so walking a tree costs a
few small reads per process in it. Kernels built without CONFIG_PROC_CHILDREN lack that file;
then psutil does it the slow way.
"""

from __future__ import annotations

import contextlib
import os

import psutil

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_HAS_CHILDREN_FILE = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def children(pid: int) -> list[int]:
    """The pids of `pid`'s direct children (none when it is gone)."""
    if not _HAS_CHILDREN_FILE:
        with contextlib.suppress(psutil.Error):
            return [p.pid for p in psutil.Process(pid).children()]
        return []
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in threads:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
            found.extend(int(child) for child in f.read().split())
    return found


def descendants(pid: int) -> list[int]:
    """The pids of every process below `pid` (children first)."""
    found: list[int] = []
    pending = children(pid)
    while pending:
        child = pending.pop()
        found.append(child)
        pending.extend(children(child))
    return found


def rss(pid: int) -> int:
    """Resident memory of one process in bytes (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0


def tree_rss(pid: int) -> int:
    """Resident memory of `pid` and all its descendants, summed (shared pages count in each)."""
    return sum(rss(p) for p in (pid, *descendants(pid)))
