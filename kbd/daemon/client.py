"""Finding, starting, asking and stopping a daemon (client side, blocking sockets)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from kbd.daemon.state import StatePaths, is_locked
from kbd.daemon.wire import DAEMON_PROTOCOL, DaemonReply, Hello, Welcome
from kbd.shared import identity, protocol

HANDSHAKE_TIMEOUT_S = 10.0
START_TIMEOUT_S = 120.0  # the daemon warms a template before it answers
EXIT_ALREADY_RUNNING = 3  # `kbd daemon run` when another daemon holds the lock


class DaemonError(Exception):
    """The daemon could not be reached, started or understood; the message says what to do."""


class Connection:
    """One connection to a daemon, after the Hello/Welcome handshake."""

    def __init__(self, sock: socket.socket, welcome: Welcome, paths: StatePaths):
        self.sock = sock
        self.welcome = welcome
        self.paths = paths

    def send(self, message) -> None:
        protocol.send_blocking(self.sock, message)

    def receive(self, kind=DaemonReply):
        """The next frame; raises DaemonLost when the daemon went away."""
        try:
            return protocol.receive_blocking(self.sock, kind)
        except (EOFError, ConnectionError) as exc:
            raise DaemonLost(self) from exc

    def request(self, message):
        self.send(message)
        return self.receive()

    def differences(self) -> list[str]:
        """What differs between the daemon and this kbd, e.g. "torch: daemon 2.12.0, this kbd
        2.13.0"; empty when the daemon runs this very kbd."""
        return identity.differences(
            self.welcome.identity, identity.current(), "{label}: daemon {theirs}, this kbd {ours}"
        )

    def close(self) -> None:
        self.sock.close()


class DaemonLost(DaemonError):
    """The connection ended: the daemon died or was stopped."""

    def __init__(self, connection: Connection):
        tail = connection.paths.log_tail()
        where = connection.welcome.log or "its stderr (e.g. journalctl --user)"
        message = f"lost the daemon (pid {connection.welcome.pid}); its log is {where}"
        if tail and connection.welcome.log:
            message += "; last lines:\n" + "\n".join("  " + line for line in tail.splitlines())
        super().__init__(message)


def connect(paths: StatePaths) -> Connection | None:
    """A handshaken connection to the running daemon, or None when none runs."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(paths.socket))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None  # no daemon, or a stale socket (the next daemon removes it)
    except OSError as exc:
        sock.close()
        raise DaemonError(f"cannot connect to {paths.socket}: {exc}") from None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    if uid != os.geteuid():
        sock.close()
        raise DaemonError(f"{paths.socket} is served by uid {uid} (pid {pid}), not by you")
    sock.settimeout(HANDSHAKE_TIMEOUT_S)
    try:
        protocol.send_blocking(sock, Hello(DAEMON_PROTOCOL, identity.current(), os.getpid()))
        welcome = protocol.receive_blocking(sock, DaemonReply)
    except (OSError, EOFError, protocol.ProtocolError) as exc:
        sock.close()
        raise DaemonError(
            f"the daemon (pid {pid}) did not answer the handshake ({exc}); see {paths.log}, "
            f"or stop it with `kbd daemon stop`"
        ) from None
    sock.settimeout(None)
    if not isinstance(welcome, Welcome) or welcome.protocol != DAEMON_PROTOCOL:
        sock.close()
        raise DaemonError(
            f"the daemon (pid {pid}) speaks another protocol; stop it with `kbd daemon stop`"
        )
    return Connection(sock, welcome, paths)


def start(paths: StatePaths, *, idle_timeout: float, announce=None) -> Connection:
    """Start a daemon in the background (its own session) and connect once it is ready.

    Two clients starting one at once is fine: the loser exits (the lock is taken) and both
    connect to the winner.
    """
    paths.ensure()
    paths.store.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "kbd",
        "daemon",
        "run",
        "--db",
        str(paths.store),
        "--idle-timeout",
        f"{idle_timeout:g}",
        "--log",
        str(paths.log),
    ]
    with open(paths.log, "ab") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # no SIGHUP or Ctrl-C from this terminal
            cwd=paths.store.parent,
        )
    if announce:
        announce(f"kbd: starting a daemon (pid {process.pid}, log {paths.log})")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        connection = connect(paths)
        if connection is not None:
            return connection
        code = process.poll()
        if code is not None and code != EXIT_ALREADY_RUNNING:
            tail = paths.log_tail()
            raise DaemonError(
                f"the daemon exited with status {code} while starting; log {paths.log}:\n{tail}"
            )
        time.sleep(0.05)
    raise DaemonError(
        f"the daemon did not become ready within {START_TIMEOUT_S:g}s; see {paths.log}"
    )


def wait_gone(paths: StatePaths, pid: int | None = None) -> None:
    """Wait until no process holds the daemon lock and process `pid` (the daemon) has exited."""
    while is_locked(paths):
        time.sleep(0.05)
    deadline = time.monotonic() + 5  # it released the lock: only the interpreter's exit is left
    while pid is not None and _running(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def terminate_recorded(paths: StatePaths) -> int | None:
    """SIGTERM the daemon recorded in daemon.json, if that pid really is a kbd daemon.

    For a daemon that cannot be talked to (another protocol, hung handshake). Never by name:
    the pid comes from the state directory and its command line is checked first.
    """
    info = paths.read_info() or {}
    pid = info.get("pid")
    if not isinstance(pid, int):
        return None
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if b"kbd" not in argv or b"daemon" not in argv or b"run" not in argv:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    return pid


def ensure(paths: StatePaths, *, idle_timeout: float, announce) -> Connection:
    """A connection to a daemon running this very kbd: the running one, or a new one.

    A daemon with a different identity is never used: when idle it is stopped and replaced
    (saying why); when busy, this raises DaemonError naming what differs.
    """
    from kbd.daemon.wire import DaemonStatus, StatusRequest, StopRequest

    connection = connect(paths)
    if connection is None:
        return start(paths, idle_timeout=idle_timeout, announce=announce)
    differences = connection.differences()
    if not differences:
        return connection
    status = connection.request(StatusRequest())
    pid = connection.welcome.pid
    if isinstance(status, DaemonStatus) and status.sweeps:
        connection.close()
        raise DaemonError(
            f"the daemon (pid {pid}) runs different code ({'; '.join(differences)}) and is busy; "
            f"stop it with `kbd daemon stop` once its sweeps end, or use --no-daemon"
        )
    announce(f"kbd: replacing the daemon (pid {pid}): {'; '.join(differences)}")
    connection.request(StopRequest())
    connection.close()
    wait_gone(paths, pid)
    return start(paths, idle_timeout=idle_timeout, announce=announce)
