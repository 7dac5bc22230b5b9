"""The warm template: imports torch and torch-mlir once, then forks one fresh worker per kernel.

Started by the supervisor as `python -m kbd.worker.template CONTROL_FD SUPERVISOR_PID`. The
control channel is a SOCK_SEQPACKET socket (one frame per message). For each `Spawn` frame,
which carries the worker's socket and output pipe as SCM_RIGHTS, the template forks a worker
in a new session and answers `Spawned`; when the worker is reaped it kills what is left of
the worker's process group and answers `Exited` with the status and peak RSS from wait4.

The template never runs a kernel itself. It dies with the supervisor (PDEATHSIG) and, when the
control channel closes, kills every worker before exiting. As a child subreaper it also adopts
and kills descendants that escaped their worker's process group.
"""

from __future__ import annotations

import contextlib
import gc
import os
import selectors
import signal
import socket
import sys

from kbd.shared import proctree, protocol
from kbd.shared.protocol import Exited, Ready, Spawn, Spawned
from kbd.worker import sandbox

MAX_FDS = 4


def main() -> None:
    control_fd, supervisor_pid = int(sys.argv[1]), int(sys.argv[2])
    sandbox.die_with_parent(supervisor_pid)
    sandbox.become_subreaper()
    sandbox.disable_core_dumps()
    control = socket.socket(fileno=control_fd)
    # The collector is off while the template warms up (as Python's gc docs advise for a
    # process that forks workers): nearly all it allocates (torch, torch-mlir, sympy: ~400k
    # objects) lives as long as the template, so the collections its imports trigger, which
    # scan ever more of those objects, would find little and cost ~0.7 s of the ~4.5 s start.
    gc.disable()
    _warm_up()
    # Frozen, a worker's full collections skip all of it: without this, the collection an
    # import triggers scans it all (~0.2 s per kernel) and dirties shared pages.
    gc.freeze()
    gc.enable()  # in the template and, through fork, in every worker
    control.send(protocol.encode(Ready()))
    _Template(control).serve()


def _warm_up() -> None:
    """Import everything a worker needs and pay the first-import costs once, here."""
    import torch

    from kbd.worker import child, mlir  # noqa: F401  (the whole worker side, torch_mlir too)

    class _Warm(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) + 1.0

    module = mlir.import_model(_Warm().eval(), [torch.zeros(2, 2)])
    # the import cache's path: print, parse and rewrite once (first calls load dialect modules)
    mlir.results_to_out_params(mlir.parse_module(mlir.module_text(module)))


class _Template:
    def __init__(self, control: socket.socket):
        self.control = control
        self.workers: set[int] = set()
        self.wakeup_r, wakeup_w = os.pipe()
        os.set_blocking(wakeup_w, False)
        signal.set_wakeup_fd(wakeup_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: self._shutdown())

    def serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.control, selectors.EVENT_READ, self._on_control)
        selector.register(self.wakeup_r, selectors.EVENT_READ, self._on_signal)
        while True:
            for key, _ in selector.select():
                key.data()

    def _on_control(self) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(self.control, protocol.MAX_FRAME + 4, MAX_FDS)
        except OSError:
            data, fds = b"", []
        if not data:
            self._shutdown()
        spawn = protocol.decode(data[4:], Spawn)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._become_worker(fds)
        for fd in fds:
            os.close(fd)
        self.workers.add(pid)
        self.control.send(protocol.encode(Spawned(token=spawn.token, pid=pid)))

    def _become_worker(self, fds: list[int]) -> None:
        from kbd.worker import child  # already imported by _warm_up: workers run that code

        parent = os.getppid()
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self.control.close()
            os.close(self.wakeup_r)
            worker_fd, output_fd = fds
            os.setsid()
            os.dup2(output_fd, 1)
            os.dup2(output_fd, 2)
            os.close(output_fd)
            sandbox.keep_only_fds((worker_fd,))  # nothing of the template reaches a kernel
            code = child.main(socket.socket(fileno=worker_fd), parent)
        except BaseException:
            code = 70
        os._exit(code)

    def _on_signal(self) -> None:
        os.read(self.wakeup_r, 4096)
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.workers:
                self.workers.discard(pid)
                _kill_group(pid)
                exited = Exited(
                    pid=pid,
                    returncode=os.waitstatus_to_exitcode(status),
                    peak_rss_bytes=usage.ru_maxrss * 1024,
                )
                self.control.send(protocol.encode(exited))
            self._kill_orphans()

    def _kill_orphans(self) -> None:
        """Kill adopted descendants of finished workers (they escaped the worker's group)."""
        for pid in proctree.children(os.getpid()):
            if pid not in self.workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def _shutdown(self) -> None:
        for pid in self.workers:
            _kill_group(pid)
        for pid in proctree.descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os._exit(0)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


if __name__ == "__main__":
    main()
