"""Process-level safety applied inside kbd's own processes (no torch here).

A worker applies its limits to itself right after it is forked and before any kernel code runs:
memory (RLIMIT_DATA; RLIMIT_AS would break torch's virtual reservations), no core dumps, core
affinity with matching thread counts, and death when its parent goes away.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal

from kbd.shared.protocol import THREAD_ENV

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent(expected_parent: int) -> None:
    """SIGKILL this process when its parent dies; exit now if it already has."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != expected_parent:  # the parent died before prctl took effect
        os._exit(1)


def become_subreaper() -> None:
    """Orphaned descendants are re-parented to us instead of init, so we can kill and reap them."""
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def disable_core_dumps() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def limit_memory(limit_bytes: int | None) -> str:
    """Cap private data (heap and anonymous mmaps) at `limit_bytes`; returns what is enforced."""
    if limit_bytes is None:
        return "none"
    resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, limit_bytes))
    return f"RLIMIT_DATA={limit_bytes}"


def limit_file_size(limit_bytes: int) -> None:
    """Bound what the kernel can write to any file; writes past it fail instead of killing us."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))


def pin(cores: tuple[int, ...]) -> str:
    """Pin to `cores` and set thread-count variables for anything started later."""
    if not cores:
        return "none"
    os.sched_setaffinity(0, cores)
    for name in THREAD_ENV:
        os.environ[name] = str(len(cores))
    return ",".join(map(str, cores))


# --- containment: filesystem, network, descriptors --------------------------------------------

CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
SCRATCH_ENV = ("TMPDIR", "TMP", "TEMP")
# Written by ordinary library code; writing them reaches nothing outside the worker.
WRITABLE_FILES = ("/dev/null", "/dev/zero", "/dev/full")


def keep_only_fds(keep: tuple[int, ...]) -> None:
    """Close every descriptor but stdin/stdout/stderr and `keep`: whatever the template held
    (the store is never among them, but nothing else should reach a kernel either)."""
    floor = 3
    for fd in sorted(keep):
        os.closerange(floor, fd)
        floor = fd + 1
    os.closerange(floor, os.sysconf("SC_OPEN_MAX"))


def use_scratch(scratch: str) -> None:
    """Point temporary files and caches at the worker's scratch folder."""
    import tempfile

    for name in SCRATCH_ENV:
        os.environ[name] = scratch
    os.environ["XDG_CACHE_HOME"] = os.path.join(scratch, ".cache")
    # torch fixed its compile cache under the template's /tmp while warming up
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(scratch, "torchinductor")
    tempfile.tempdir = scratch  # the template may have cached /tmp already


def isolate_network() -> str:
    """Move this thread into a fresh network namespace: only a loopback device, left down.

    As root (CAP_SYS_ADMIN) directly; otherwise inside a new unprivileged user namespace.
    Returns how; raises OSError with the reason when neither works.
    """
    if _libc.unshare(CLONE_NEWNET) == 0:
        return "netns"
    first = ctypes.get_errno()
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        return "userns+netns"
    second = ctypes.get_errno()
    raise OSError(
        second,
        f"no network namespace: unshare(CLONE_NEWNET): {os.strerror(first)}; "
        f"with a user namespace: {os.strerror(second)}",
    )


def threads() -> int:
    return len(os.listdir("/proc/self/task"))
