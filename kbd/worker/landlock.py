"""Landlock through raw syscalls (ctypes): restrict this thread and its future children.

Landlock is additive: a ruleset names the access rights it *handles*, and everything handled is
denied except beneath paths given a rule. kbd handles every filesystem right the kernel knows,
grants read and execute on `/` and full rights beneath the writable paths, handles TCP bind and
connect with no port rules (so both are denied), and, from ABI 6, scopes abstract Unix sockets
and signals to the worker's own domain.

The restriction applies to the calling thread and to threads and processes it creates later, so
it must be applied while the worker is still single-threaded. No torch here.
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # same on every arch
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2
PR_SET_NO_NEW_PRIVS = 38

# Filesystem rights, by the ABI that introduced them.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_ABI1_FS = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
REFER, TRUNCATE = 1 << 13, 1 << 14
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE  # the rights valid on a file rule
READ_ONLY = EXECUTE | READ_FILE | READ_DIR
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in the UAPI header
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class LandlockError(OSError):
    """Landlock is missing or refused the ruleset; the message says which step and why."""


@dataclass(frozen=True)
class Applied:
    """What a successful `restrict` enforces, for the record's limits."""

    abi: int
    writable: tuple[str, ...]
    hidden: tuple[str, ...]  # not even readable
    net: bool  # TCP bind and connect denied
    scoped: bool  # abstract Unix sockets and signals confined to the worker

    def describe_fs(self) -> str:
        text = f"landlock ABI {self.abi}: read-only except {', '.join(self.writable)}"
        return text + (f"; unreadable {_brace(self.hidden)}" if self.hidden else "")


def abi_version() -> int:
    """The kernel's Landlock ABI version; raises LandlockError when Landlock is unavailable."""
    version = _libc.syscall(_SYS_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION)
    if version < 0:
        code = ctypes.get_errno()
        reason = {
            errno.ENOSYS: "the kernel has no Landlock syscalls",
            errno.EOPNOTSUPP: "Landlock is disabled at boot (lsm=)",
        }.get(code, os.strerror(code))
        raise LandlockError(code, f"Landlock unavailable: {reason}")
    return version


def restrict(writable: list[str], files: list[str], hidden: list[str] = ()) -> Applied:
    """Make everything read-only except beneath the `writable` directories and the `files`
    (e.g. /dev/null), and the `hidden` paths not even readable; deny TCP bind/connect when
    the ABI can. Irreversible for this process."""
    abi = abi_version()
    # IOCTL_DEV (ABI 5) is left unhandled: device ioctls are not file writes.
    handled = _ABI1_FS | (REFER if abi >= 2 else 0) | (TRUNCATE if abi >= 3 else 0)
    attr = _RulesetAttr(
        handled_access_fs=handled,
        handled_access_net=(NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 else 0,
        scoped=(SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0,
    )
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # the attribute grew with the ABI
    ruleset = _libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        raise _error("landlock_create_ruleset")
    try:
        for path, access in readable(hidden):
            _allow(ruleset, path, access, optional=path != "/")
        for path in writable:
            _allow(ruleset, path, handled)
        for path in files:
            _allow(ruleset, path, (FILE_RIGHTS & handled) & ~EXECUTE)
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _error("prctl(PR_SET_NO_NEW_PRIVS)")
        if _libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) != 0:
            raise _error("landlock_restrict_self")
    finally:
        os.close(ruleset)
    return Applied(
        abi=abi, writable=(*writable, *files), hidden=tuple(hidden), net=abi >= 4, scoped=abi >= 6
    )


def readable(hidden: list[str]) -> list[tuple[str, int]]:
    """Read rules covering the whole tree but the `hidden` paths.

    Rules only ever grant, and a rule covers everything beneath its path, so a hidden path's
    ancestors get none: each ancestor's other entries get read/execute rules of their own.
    Directories stay listable everywhere (READ_DIR on `/`); entries created in an ancestor
    after this runs are not readable. (A hard link to a hidden file elsewhere would stay
    readable: only the store's owner could make one.)
    """
    if not hidden:
        return [("/", READ_ONLY)]
    hidden_set = {os.path.realpath(p) for p in hidden}
    ancestors = {"/"}
    for path in hidden_set:
        parent = os.path.dirname(path)
        while parent not in ancestors:
            ancestors.add(parent)
            parent = os.path.dirname(parent)
    rules = [("/", READ_DIR)]
    for ancestor in sorted(ancestors):
        with os.scandir(ancestor) as entries:
            for entry in entries:
                # Landlock judges the resolved path, so symlinks need no rule of their own; and
                # opening one would put the rule on its target, perhaps a hidden path's ancestor
                if entry.is_symlink() or entry.path in ancestors or entry.path in hidden_set:
                    continue
                rules.append((entry.path, EXECUTE | READ_FILE))
    return rules


def _brace(paths: tuple[str, ...]) -> str:
    """`/a/db{,-wal,-shm}` for paths sharing the first one as a prefix, else a list."""
    first = paths[0]
    if len(paths) > 1 and all(p.startswith(first) for p in paths):
        return first + "{" + ",".join(p[len(first) :] for p in paths) + "}"
    return ", ".join(paths)


def _allow(ruleset: int, path: str, access: int, *, optional: bool = False) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        if optional:  # a dangling symlink, or an entry removed meanwhile
            return
        raise
    try:
        rule = _PathBeneathAttr(allowed_access=access, parent_fd=fd)
        if _libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise _error(f"landlock_add_rule({path})")
    finally:
        os.close(fd)


def _error(step: str) -> LandlockError:
    code = ctypes.get_errno()
    return LandlockError(code, f"{step} failed: {os.strerror(code)}")
