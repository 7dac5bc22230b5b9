"""A KernelBench-style problem that `kbd doctor` runs in real workers to test enforcement.

`Model(check)` performs one check in forward() from inside the worker, after the worker has
applied its limits and containment, and ends by raising `RuntimeError(PREFIX + json)` with what
it found (kbd doctor reads the record's message). The memory check instead ends the way an
over-limit kernel does, and the timeout check never ends.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time

import torch
import torch.nn as nn

PREFIX = "kbd-probe "
TARGETS_ENV = "KBD_PROBE_TARGETS"  # os.pathsep-separated folders a kernel must not write
STORE_ENV = "KBD_PROBE_STORE"  # a results database the kernel must not even read
MARKER = "86400.456"  # argument of the sleeps the cleanup check leaves behind


def _filesystem() -> dict:
    written, denied = [], {}
    for folder in filter(None, os.environ.get(TARGETS_ENV, "").split(os.pathsep)):
        path = os.path.join(folder, f".kbd-probe-{os.getpid()}")
        try:
            with open(path, "x"):
                pass
        except OSError as exc:
            denied[folder] = f"{type(exc).__name__}: {exc.strerror}"
        else:
            os.unlink(path)
            written.append(folder)
    try:
        with tempfile.NamedTemporaryFile() as scratch:
            scratch.write(b"ok")
        scratch_state = f"writable ({tempfile.gettempdir()})"
    except OSError as exc:
        scratch_state = f"not writable: {exc}"
    try:
        with open(os.environ[STORE_ENV], "rb") as store:
            store.read(16)
        store_state = "ok"
    except OSError as exc:
        store_state = f"{type(exc).__name__}: {exc.strerror}"
    return {"written": written, "denied": denied, "scratch": scratch_state, "store": store_state}


def _network() -> dict:
    found = {}

    def attempt(name, action):
        try:
            action()
            found[name] = "ok"
        except OSError as exc:
            found[name] = f"{type(exc).__name__}: {exc.strerror or exc}"

    def tcp_loopback():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            socket.create_connection(server.getsockname(), timeout=2).close()

    def udp_out():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.sendto(b"x", ("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere real

    attempt("tcp loopback connect", tcp_loopback)
    attempt("udp send", udp_out)
    attempt("unix socket", lambda: socket.socket(socket.AF_UNIX).close())
    return found


def _descriptors() -> dict:
    fds = {}
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, already closed
    return {"fds": fds}


def _cores() -> dict:
    return {
        "affinity": sorted(os.sched_getaffinity(0)),
        "threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
    }


def _memory() -> dict:
    tensor = torch.empty(4 << 30, dtype=torch.uint8)  # fails under a smaller RLIMIT_DATA
    return {"allocated": tensor.numel()}


def _timeout() -> dict:
    while True:
        time.sleep(60)


def _cleanup() -> dict:
    children = [
        subprocess.Popen(["sleep", MARKER]),
        subprocess.Popen(["sleep", MARKER], start_new_session=True),
    ]
    return {"pids": [c.pid for c in children]}


CHECKS = {
    "filesystem": _filesystem,
    "network": _network,
    "descriptors": _descriptors,
    "cores": _cores,
    "memory": _memory,
    "timeout": _timeout,
    "cleanup": _cleanup,
}


class Model(nn.Module):
    def __init__(self, check: str):
        super().__init__()
        self.check = check

    def forward(self, x):
        raise RuntimeError(PREFIX + json.dumps(CHECKS[self.check]()))


def get_inputs():
    return [torch.zeros(1)]


def get_init_inputs():
    return ["filesystem"]
