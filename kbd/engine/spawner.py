"""Supervisor-side client of the warm template process (kbd.worker.template).

The template is started once per command; it imports torch and torch-mlir and forks a fresh
worker per kernel. This module never imports torch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc

from kbd.plan import limits
from kbd.shared import protocol
from kbd.shared.errors import TemplateError
from kbd.shared.protocol import Exited, Ready, Spawn, Spawned, TemplateMessage

STARTUP_TIMEOUT = 120.0


def template_env(cores_per_worker: int, **extra: str) -> dict[str, str]:
    """The template's environment: this process's, with thread counts matching the cores each
    worker is pinned to, Python's fault handler on (a kernel that crashes leaves its stack in its
    log), and `extra`."""
    return {
        **os.environ,
        **limits.thread_env(cores_per_worker),
        "PYTHONFAULTHANDLER": "1",
        **extra,
    }


@dataclass
class Worker:
    """A forked worker: its pid (= process group), its channel and its output pipe."""

    pid: int
    channel: anyio.abc.SocketStream
    output_fd: int


@dataclass
class _Waiters:
    spawned: dict[int, Spawned] = field(default_factory=dict)
    exited: dict[int, Exited] = field(default_factory=dict)
    changed: anyio.Event = field(default_factory=anyio.Event)

    def notify(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


class Spawner:
    """Forks workers through the template. Get one with `Spawner.started(...)`."""

    def __init__(self, env: dict[str, str], log_path: Path):
        self._env = env
        self._log_path = log_path
        self._waiters = _Waiters()
        self._next_token = 0
        self._dead: str | None = None
        self._ready_message: Ready | None = None
        self._send_lock = anyio.Lock()
        self.pid = 0  # the template's pid, once started

    @classmethod
    @contextlib.asynccontextmanager
    async def started(cls, env: dict[str, str], log_path: Path) -> AsyncIterator[Spawner]:
        """Start the template, wait until it is warm, and stop it (and all workers) on exit."""
        spawner = cls(env, log_path)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        spawner._control = ours
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            process = await anyio.open_process(
                [
                    sys.executable,
                    "-m",
                    "kbd.worker.template",
                    str(theirs.fileno()),
                    str(os.getpid()),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        theirs.close()
        spawner.pid = process.pid
        async with anyio.create_task_group() as group:
            group.start_soon(spawner._read_control)
            try:
                with anyio.fail_after(STARTUP_TIMEOUT):
                    await spawner._wait_ready()
                yield spawner
            finally:
                with anyio.CancelScope(shield=True):
                    await _stop(process, ours)
                group.cancel_scope.cancel()

    @property
    def dead(self) -> str | None:
        """Why the template is gone, or None while it serves."""
        return self._dead

    async def spawn(self) -> Worker:
        """Fork a fresh worker; returns once its pid is known."""
        self._check_alive()
        token = self._next_token
        self._next_token += 1
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe()
        try:
            frame = protocol.encode(Spawn(token=token))
            async with self._send_lock:
                while True:
                    try:
                        socket.send_fds(self._control, [frame], [theirs.fileno(), out_w])
                        break
                    except BlockingIOError:
                        await anyio.wait_writable(self._control)
        finally:
            theirs.close()
            os.close(out_w)
        os.set_blocking(out_r, False)
        while token not in self._waiters.spawned:
            self._check_alive()
            await self._waiters.changed.wait()
        pid = self._waiters.spawned.pop(token).pid
        channel = await anyio.abc.UNIXSocketStream.from_socket(ours)
        return Worker(pid=pid, channel=channel, output_fd=out_r)

    async def wait(self, pid: int) -> Exited:
        """Wait until the template has reaped worker `pid` (and killed its group)."""
        while pid not in self._waiters.exited:
            self._check_alive()
            await self._waiters.changed.wait()
        return self._waiters.exited.pop(pid)

    def _check_alive(self) -> None:
        if self._dead:
            raise TemplateError(self._dead)

    async def _wait_ready(self) -> Ready:
        while self._ready_message is None:
            self._check_alive()
            await self._waiters.changed.wait()
        return self._ready_message

    async def _read_control(self) -> None:
        try:
            while True:
                await anyio.wait_readable(self._control)
                try:
                    data = self._control.recv(protocol.MAX_FRAME + 4)
                except BlockingIOError:
                    continue
                if not data:
                    break
                message = protocol.decode(data[4:], TemplateMessage)
                if isinstance(message, Ready):
                    self._ready_message = message
                elif isinstance(message, Spawned):
                    self._waiters.spawned[message.token] = message
                else:
                    self._waiters.exited[message.pid] = message
                self._waiters.notify()
        except (OSError, protocol.ProtocolError) as exc:
            self._dead = f"worker template failed: {exc}"
        else:
            self._dead = f"worker template exited; see {self._log_path}"
        self._waiters.notify()


async def _stop(process: anyio.abc.Process, control: socket.socket) -> None:
    """Close the control channel (the template then kills every worker and exits); kill the
    template's group if it does not go within a few seconds."""
    control.close()
    with anyio.move_on_after(5):
        await process.wait()
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
