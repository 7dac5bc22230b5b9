"""A worker's life after the template forked it: take the job, sandbox, run, report.

stdout and stderr already point at the output pipe the supervisor drains into the kernel's log.
The worker exits when the supervisor closes its socket (or dies): a listener thread reads the
supervisor's frames until end-of-file, then kills the worker's whole process group. The only frame
after the task is `QuietGranted`: a job benchmarked alone waits for it at its bench phase
(kbd/bench/quiet.py).
"""

from __future__ import annotations

import faulthandler
import functools
import os
import signal
import socket
import sys
import threading
from typing import NoReturn

import torch

from kbd.shared import containment, protocol
from kbd.shared.protocol import (
    BENCH_PHASE,
    SANDBOX_PHASE,
    Generate,
    Job,
    Phase,
    QuietGranted,
    Replay,
    Result,
    Size,
    Sized,
    Task,
)
from kbd.worker import generate, sandbox
from kbd.worker import job as job_runner
from kbd.worker.contain import contain

LOG_FILE_LIMIT = 1 << 30  # any single file the kernel writes


def main(sock: socket.socket, parent: int) -> int:
    """Run one task received on `sock`; returns the exit status."""
    sandbox.die_with_parent(parent)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    job: Task = protocol.receive_blocking(sock, Task)
    enforced = _apply_limits(job)
    quiet = threading.Event()
    threading.Thread(target=_listen, args=(sock, quiet), daemon=True).start()
    alone = isinstance(job, Job) and job.timed_alone

    def announce(phase: str) -> None:
        print(f"[kbd] phase {phase}", file=sys.stderr, flush=True)
        protocol.send_blocking(sock, Phase(phase))
        if phase == BENCH_PHASE and alone:
            quiet.wait()  # the supervisor pauses the other workers, then says so

    missing = containment.missing(enforced)
    if isinstance(job, Generate):
        result = generate.answer(job, announce, enforced)
    elif isinstance(job, Replay):
        result = job_runner.replay(job, announce, enforced)
    elif job.limits.require_sandbox and missing:
        announce(SANDBOX_PHASE)
        result = Result(
            outcome="error",
            phase=SANDBOX_PHASE,
            message="containment required but not enforced: "
            + "; ".join(f"{key}: {reason}" for key, reason in missing.items()),
            limits_enforced=enforced,
        )
    elif isinstance(job, Size):  # runs the problem's code: contained as a job is
        result = job_runner.size(job, announce, enforced)
    else:
        result = job_runner.run(
            job,
            announce,
            enforced,
            lambda message: protocol.send_blocking(sock, message),
            functools.partial(_end, sock),
        )
    _report(sock, result)
    return 0


def _report(sock: socket.socket, result: Result | Sized) -> None:
    """Send the task's result, once what the task printed is in the log."""
    sys.stdout.flush()
    sys.stderr.flush()
    protocol.send_blocking(sock, result)


def _end(sock: socket.socket, result: Result) -> NoReturn:
    """Report `result` and exit at once: from where the task cannot be returned to (compiled
    code that called a failing runtime symbol, kbd.worker.runtime)."""
    _report(sock, result)
    os._exit(0)


def _apply_limits(job: Task) -> dict[str, str]:
    sandbox.disable_core_dumps()
    sandbox.limit_file_size(LOG_FILE_LIMIT)
    cores = sandbox.pin(job.limits.cores)
    contained = contain(job.limits)  # before anything can start a thread
    if job.limits.cores:
        torch.set_num_threads(len(job.limits.cores))
    memory = sandbox.limit_memory(job.limits.mem_limit)
    return {
        "memory": memory,
        "cores": cores,
        "threads": str(torch.get_num_threads()),
        **contained,
    }


def _listen(sock: socket.socket, quiet: threading.Event) -> None:
    """Set `quiet` on each QuietGranted; on end-of-file (or a frame that is not one), kill the
    worker's group."""
    try:
        while True:
            protocol.receive_blocking(sock, QuietGranted)
            quiet.set()
    except (EOFError, OSError, protocol.ProtocolError):
        pass
    os.killpg(0, signal.SIGKILL)
