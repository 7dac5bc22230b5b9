"""Run a command as if on an older kernel: no Landlock and no namespaces.

`python tests/old_kernel.py CMD...` installs a seccomp filter that makes landlock_create_ruleset
fail with ENOSYS (as on a kernel without Landlock) and unshare with EPERM (as without the
privilege to create namespaces), then executes CMD; kbd's workers inherit the filter.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys

# machine -> (AUDIT_ARCH_*, __NR_unshare); landlock_create_ruleset is 444 everywhere.
ARCHES = {"x86_64": (0xC000003E, 272), "aarch64": (0xC00000B7, 97)}
NR_LANDLOCK_CREATE_RULESET = 444
LD_W_ABS, JEQ_K, RET_K = 0x20, 0x15, 0x06
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000


class Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]  # fmt: skip


class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]


def main() -> None:
    arch, nr_unshare = ARCHES[platform.machine()]
    program = [
        (LD_W_ABS, 0, 0, 4),  # arch
        (JEQ_K, 1, 0, arch),
        (RET_K, 0, 0, RET_ALLOW),
        (LD_W_ABS, 0, 0, 0),  # syscall number
        (JEQ_K, 0, 1, NR_LANDLOCK_CREATE_RULESET),
        (RET_K, 0, 0, RET_ERRNO | errno.ENOSYS),
        (JEQ_K, 0, 1, nr_unshare),
        (RET_K, 0, 0, RET_ERRNO | errno.EPERM),
        (RET_K, 0, 0, RET_ALLOW),
    ]
    filters = (Filter * len(program))(*(Filter(*insn) for insn in program))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
    prog = Program(len(program), filters)
    assert libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0, os.strerror(ctypes.get_errno())
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
