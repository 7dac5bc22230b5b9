"""Where a daemon lives: one owner-only state directory per user and results store.

`$XDG_RUNTIME_DIR/kbd/<hash of the store's absolute path>/`, or `/tmp/kbd-<uid>/<hash>/` when
there is no runtime directory. Both levels are created with mode 0700 and refused when they are
owned by someone else or open to others (like tmux). The directory holds:

- `lock`: flock'ed by the daemon for its whole life (pid, argv, cwd written in it for humans).
  The kernel releases it when the daemon dies, even by SIGKILL, so it is never stale.
- `sock`: the daemon's socket (mode 0600). Bound only after the lock is held, because binding
  removes an existing socket file; a socket nobody listens on is stale and removed then.
- `daemon.json`: pid, start time, identity, store and log, written once the socket is bound.
- `daemon.log`: the daemon's output when it was started by `kbd daemon start` or a command.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kbd.shared.errors import InputError

LOG_CAP_BYTES = 8 << 20  # a log past this is rotated to daemon.log.1 when a daemon starts


@dataclass(frozen=True)
class StatePaths:
    directory: Path
    store: Path  # absolute path of the results database this daemon serves

    @classmethod
    def for_store(cls, store: Path) -> StatePaths:
        store = store.expanduser().resolve()
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        if runtime and Path(runtime).is_dir():
            base = Path(runtime) / "kbd"
        else:
            base = Path("/tmp") / f"kbd-{os.geteuid()}"
        name = hashlib.sha256(str(store).encode()).hexdigest()[:16]
        return cls(directory=base / name, store=store)

    @property
    def lock(self) -> Path:
        return self.directory / "lock"

    @property
    def socket(self) -> Path:
        return self.directory / "sock"

    @property
    def info(self) -> Path:
        return self.directory / "daemon.json"

    @property
    def log(self) -> Path:
        return self.directory / "daemon.log"

    def ensure(self) -> None:
        """Create the state directory (and its parent) owner-only; refuse unsafe ones."""
        for directory in (self.directory.parent, self.directory):
            with contextlib.suppress(FileExistsError):
                directory.mkdir(mode=0o700)
            _check_private(directory)

    def read_info(self) -> dict | None:
        try:
            return json.loads(self.info.read_text())
        except (OSError, ValueError):
            return None

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _check_private(directory: Path) -> None:
    st = directory.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise InputError(
            f"{directory}: unsafe daemon state directory (must be a directory owned by uid "
            f"{os.geteuid()} with mode 0700); remove it or fix its permissions"
        )


class AlreadyRunning(Exception):
    """Another daemon holds the lock of this state directory."""


class InstanceLock:
    """The daemon's single-instance lock, held for its whole life."""

    def __init__(self, paths: StatePaths):
        self._fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 4096, 0).decode("utf-8", "replace").strip()
            os.close(self._fd)
            raise AlreadyRunning(holder) from None
        note = f"pid={os.getpid()}\nargv={' '.join(sys.argv)}\ncwd={os.getcwd()}\n"
        note += f"started={time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, note.encode(), 0)

    def release(self) -> None:
        os.close(self._fd)


def is_locked(paths: StatePaths) -> bool:
    """Whether a daemon (or one starting) holds the lock; never takes it for long."""
    try:
        fd = os.open(paths.lock, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def rotate_log(paths: StatePaths) -> None:
    with contextlib.suppress(OSError):
        if paths.log.stat().st_size > LOG_CAP_BYTES:
            os.replace(paths.log, paths.log.with_name(paths.log.name + ".1"))
