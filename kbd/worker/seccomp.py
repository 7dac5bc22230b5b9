"""A seccomp filter that makes socket(2) fail with EPERM, built as classic BPF (no libseccomp).

Every address family is denied, AF_UNIX included (a root worker could otherwise connect to
sockets such as the Docker daemon's). Existing sockets (the worker's channel to the supervisor)
and socketpair(2) keep working. Syscalls of a foreign ABI (i386 or x32 on x86-64) are denied
too, since they would bypass a filter keyed on native syscall numbers. No torch here.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data
_X32_BIT = 0x40000000

# machine -> (AUDIT_ARCH_*, __NR_socket)
_ARCHES = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}


class _Filter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Filter))]


_libc = ctypes.CDLL(None, use_errno=True)


class SeccompError(OSError):
    """The filter could not be installed; the message says why."""


def deny_sockets() -> None:
    """Install the filter on this thread and everything it starts later."""
    machine = platform.machine()
    if machine not in _ARCHES:
        raise SeccompError(errno.ENOTSUP, f"no socket filter for architecture {machine}")
    arch, nr_socket = _ARCHES[machine]
    deny = _RET_ERRNO | errno.EPERM
    program = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ_K, 1, 0, arch),  # native ABI: go on; otherwise deny
        (_RET_K, 0, 0, deny),
        (_LD_W_ABS, 0, 0, _NR),
        (_JGE_K, 2, 0, _X32_BIT),  # x32 syscall numbers: deny
        (_JEQ_K, 1, 0, nr_socket),
        (_RET_K, 0, 0, _RET_ALLOW),
        (_RET_K, 0, 0, deny),
    ]
    filters = (_Filter * len(program))(*(_Filter(*insn) for insn in program))
    fprog = _Program(len(program), filters)
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _error("prctl(PR_SET_NO_NEW_PRIVS)")
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise _error("prctl(PR_SET_SECCOMP)")


def _error(step: str) -> SeccompError:
    code = ctypes.get_errno()
    return SeccompError(code, f"{step} failed: {os.strerror(code)}")
