"""The daemon: `kbd daemon run`. Foreground, logs to stderr, fit for systemd (Type=notify).

Start-up order matters: state directory (0700) -> single-instance lock -> socket (0600; binding
removes a stale socket file, which is safe only while holding the lock) -> daemon.json ->
READY. Every connection must come from this user (SO_PEERCRED) and start with a `Hello` within
a few seconds; frames from clients are bounded, and anything malformed closes that connection
only. The daemon exits after `idle_timeout` seconds without clients or work, on SIGTERM/SIGINT,
on `kbd daemon stop`, and when its state directory or daemon.json vanishes or names another
process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import struct
import time
from pathlib import Path

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from kbd.daemon.state import InstanceLock, StatePaths, rotate_log
from kbd.daemon.wire import (
    DAEMON_PROTOCOL,
    MAX_CLIENT_FRAME,
    AttachRequest,
    CancelRequest,
    DaemonRequest,
    DaemonStatus,
    Done,
    Hello,
    Refused,
    StatusRequest,
    StopRequest,
    SubmitTune,
    Welcome,
)
from kbd.daemon.work import Work
from kbd.shared import identity, protocol
from kbd.shared.errors import InputError

log = logging.getLogger("kbd.daemon")

HELLO_TIMEOUT_S = 5.0
WATCH_INTERVAL_S = 2.0


def run(paths: StatePaths, *, idle_timeout: float, log_file: Path | None, work: Work) -> int:
    """Run a daemon in this process until it stops; returns the exit status."""
    paths.ensure()
    if log_file is not None:
        rotate_log(paths)
        try:
            fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:
            raise InputError(f"--log {log_file}: cannot open ({exc.strerror})") from None
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s kbd-daemon[%(process)d] %(message)s"
    )
    lock = InstanceLock(paths)  # raises AlreadyRunning: checked before anything is bound
    try:
        daemon = Daemon(paths, idle_timeout=idle_timeout, log_file=log_file, work=work)
        anyio.run(daemon.serve)
    finally:
        with contextlib.suppress(OSError):
            if (paths.read_info() or {}).get("pid") == os.getpid():
                paths.info.unlink()
                paths.socket.unlink()
        lock.release()
    log.info("stopped")
    return 0


class Daemon:
    def __init__(
        self, paths: StatePaths, *, idle_timeout: float, log_file: Path | None, work: Work
    ):
        self.paths = paths
        self.idle_timeout = idle_timeout
        self.log_file = str(log_file) if log_file else None
        self.identity = identity.current()
        self.started = time.time()
        self.work = work
        self.clients = 0
        self.last_active = time.monotonic()
        self.stopping = anyio.Event()

    async def serve(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.paths.socket.unlink()  # stale: we hold the lock, so nobody serves it
        listener = await anyio.create_unix_listener(self.paths.socket, mode=0o600)
        self._write_info()
        log.info(
            "serving %s on %s (code %s, idle timeout %gs)",
            self.paths.store,
            self.paths.socket,
            self.identity.code_hash,
            self.idle_timeout,
        )
        async with listener, anyio.create_task_group() as group:
            await group.start(self.work.run)
            _sd_notify("READY=1")
            group.start_soon(self._watch_signals)
            group.start_soon(self._watch_idle_and_state)
            group.start_soon(listener.serve, self._connection)
            await self.stopping.wait()
            _sd_notify("STOPPING=1")
            await self.work.drain()
            group.cancel_scope.cancel()

    # --- connections ------------------------------------------------------------------------

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            pid, uid = _peer(stream)
            if uid != os.geteuid():
                log.warning("refused a connection from uid %d (pid %d)", uid, pid)
                return
            self.clients += 1
            try:
                await self._converse(stream, pid)
            except (
                anyio.EndOfStream,
                anyio.IncompleteRead,
                anyio.BrokenResourceError,
                anyio.ClosedResourceError,
                ConnectionError,
            ):
                pass
            except protocol.ProtocolError as exc:
                log.warning("closed the connection of pid %d: %s", pid, exc)
            except TimeoutError:
                log.warning(
                    "closed the connection of pid %d: no Hello within %gs", pid, HELLO_TIMEOUT_S
                )
            except Exception:  # a kbd bug costs this connection, never the daemon
                log.exception("closed the connection of pid %d after an internal error", pid)
            finally:
                self.clients -= 1
                self.last_active = time.monotonic()

    async def _converse(self, stream: anyio.abc.SocketStream, pid: int) -> None:
        frames = BufferedByteReceiveStream(stream)
        with anyio.fail_after(HELLO_TIMEOUT_S):
            hello = await protocol.receive(frames, Hello, MAX_CLIENT_FRAME)
        await stream.send(protocol.encode(self._welcome()))
        if hello.protocol != DAEMON_PROTOCOL:
            return
        while True:
            try:
                request = await protocol.receive(frames, DaemonRequest, MAX_CLIENT_FRAME)
            except InputError as exc:  # a submitted SweepSpec failed its own checks
                await stream.send(protocol.encode(Refused(str(exc), exit_status=2)))
                return
            self.last_active = time.monotonic()
            if isinstance(request, StatusRequest):
                await stream.send(protocol.encode(self._status()))
            elif isinstance(request, StopRequest):
                log.info("stop requested by pid %d%s", pid, " (now)" if request.now else "")
                await stream.send(protocol.encode(Done("stopping")))
                self.work.stop(kill=request.now)
                self.stopping.set()
            elif isinstance(request, CancelRequest):
                reply = self.work.cancel(request.sweep_id, kill=request.kill, tune=request.tune)
                await stream.send(protocol.encode(reply))
            elif isinstance(request, AttachRequest):
                await self.work.follow(request.sweep_id, stream, tune=request.tune)
                return
            else:
                if self.stopping.is_set():
                    await stream.send(protocol.encode(Refused("the daemon is stopping")))
                    return
                if isinstance(request, SubmitTune):
                    await self.work.submit_tune(request, stream)
                else:
                    await self.work.submit(request, stream, frames)
                return

    def _welcome(self) -> Welcome:
        return Welcome(
            protocol=DAEMON_PROTOCOL,
            identity=self.identity,
            pid=os.getpid(),
            started=self.started,
            store=str(self.paths.store),
            log=self.log_file,
        )

    def _status(self) -> DaemonStatus:
        return DaemonStatus(
            pid=os.getpid(),
            started=self.started,
            identity=self.identity,
            store=str(self.paths.store),
            state_dir=str(self.paths.directory),
            log=self.log_file,
            idle_timeout=self.idle_timeout,
            clients=self.clients,
            **self.work.status(),
        )

    # --- lifetime ---------------------------------------------------------------------------

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                log.info("%s: stopping", signal.Signals(signum).name)
                self.work.stop(kill=signum != signal.SIGHUP)
                self.stopping.set()

    async def _watch_idle_and_state(self) -> None:
        while not self.stopping.is_set():
            await anyio.sleep(WATCH_INTERVAL_S)
            info = self.paths.read_info()
            if info is None or info.get("pid") != os.getpid() or not self.paths.socket.exists():
                log.info("state directory %s is gone or taken over: stopping", self.paths.directory)
                self.work.stop(kill=True)
                self.stopping.set()
            idle_for = time.monotonic() - self.last_active
            if self.work.busy() or self.clients:
                self.last_active = time.monotonic()
            elif self.idle_timeout > 0 and idle_for >= self.idle_timeout:
                log.info("idle for %.0fs: stopping", idle_for)
                self.stopping.set()

    def _write_info(self) -> None:
        info = {
            "pid": os.getpid(),
            "started": self.started,
            "store": str(self.paths.store),
            "socket": str(self.paths.socket),
            "log": self.log_file,
            "identity": {f: getattr(self.identity, f) for f in self.identity.__struct_fields__},
        }
        tmp = self.paths.info.with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        tmp.chmod(0o600)
        os.replace(tmp, self.paths.info)


def _peer(stream: anyio.abc.SocketStream) -> tuple[int, int]:
    """(pid, uid) of the connected process, from SO_PEERCRED (fixed at connect time)."""
    sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def _sd_notify(message: str) -> None:
    """Tell systemd (Type=notify) about readiness or stopping; nothing without $NOTIFY_SOCKET."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(message.encode(), address)
