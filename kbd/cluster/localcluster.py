"""A real multi-node Ray cluster on this machine, started as users start one (`ray start`).

For the tests and scripts/bench-cluster: each node is its own raylet (its own `ray start`),
pinned to its own cores with `taskset`, with its own ports, under one private temp dir, and
with the settings the README asks of kbd nodes (memory monitor off, niceness 0). `stop()`
ends exactly the processes of this cluster (found by its temp dir), never another cluster.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

NODE_ENV = {"RAY_memory_monitor_refresh_ms": "0", "RAY_worker_niceness": "0"}
PORT_ATTEMPTS = 3
STOP_GRACE_S = 1.0
_PORT_TAKEN = re.compile(r"port number \d+ that is used|[Aa]ddress already in use")


class LocalCluster:
    """`with LocalCluster([(0,), (1,)]) as cluster:` one node per core tuple, 1 CPU per core."""

    def __init__(self, nodes: list[tuple[int, ...]], env: dict[str, str] | None = None):
        self.nodes = nodes
        self.env = {**os.environ, **NODE_ENV, **(env or {})}
        # Short: Ray puts Unix sockets under it (108-byte path limit).
        self.temp_dir = Path(tempfile.mkdtemp(prefix="kbdray", dir="/tmp"))
        self.address = f"127.0.0.1:{_free_port()}"
        self.started = 0

    def __enter__(self) -> LocalCluster:
        try:
            for cores in self.nodes:
                self.add_node(cores)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def add_node(self, cores: tuple[int, ...], env: dict[str, str] | None = None) -> None:
        """Start one more node (the first one is the head) on `cores`.

        Ports are picked free, then bound by Ray a moment later; another cluster starting at the
        same time (two test modules, two users) can take one meanwhile, and Ray then refuses
        ("trying to use a port number ... that is used by other components"). Such a start is
        tried again with fresh ports, up to PORT_ATTEMPTS times."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            result = self._start_node(cores, env)
            if result.returncode == 0:
                break
            output = f"{result.stdout}\n{result.stderr}"
            if attempt == PORT_ATTEMPTS or not _PORT_TAKEN.search(output):
                raise RuntimeError(f"ray start failed:\n{output}")
            if self.started == 0:  # the head's own port may be the one taken
                self.address = f"127.0.0.1:{_free_port()}"
        self.started += 1
        self.wait_for_nodes(self.started)

    def _start_node(self, cores: tuple[int, ...], env: dict[str, str] | None):
        command = [
            "taskset", "-c", ",".join(map(str, cores)),
            str(Path(sys.executable).with_name("ray")), "start",
            "--num-cpus", str(len(cores)), "--num-gpus", "0",
            "--object-store-memory", str(80 << 20),
            "--node-ip-address", "127.0.0.1",
            "--disable-usage-stats",
            "--dashboard-agent-listen-port", str(_free_port()),
            "--dashboard-agent-grpc-port", str(_free_port()),
            "--metrics-export-port", str(_free_port()),
            "--runtime-env-agent-port", str(_free_port()),
        ]  # fmt: skip
        if self.started == 0:
            port = self.address.rsplit(":", 1)[1]
            command += ["--head", "--port", port, "--include-dashboard", "false"]
            command += ["--temp-dir", str(self.temp_dir)]
        else:
            command += ["--address", self.address]
        return subprocess.run(
            command,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=120,
            start_new_session=True,
        )

    def wait_for_nodes(self, count: int, timeout: float = 60.0) -> None:
        """Wait until `count` nodes are alive (asked through `ray status`-free Python: GCS)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.alive_nodes() >= count:
                return
            time.sleep(0.5)
        raise RuntimeError(f"{count} Ray nodes not alive after {timeout:g} s")

    def alive_nodes(self) -> int:
        """Raylets of this cluster that are running."""
        return len(self.raylets())

    def raylets(self) -> list[psutil.Process]:
        """This cluster's raylet processes (one per node)."""
        return [p for p in self.processes() if _name(p) == "raylet"]

    def processes(self) -> list[psutil.Process]:
        """Every process of this cluster: those whose command line names its temp dir, and
        their descendants (Ray renames its workers' command lines)."""
        found: dict[int, psutil.Process] = {}
        marker = str(self.temp_dir)
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if any(marker in arg for arg in proc.info["cmdline"] or ()):
                    found[proc.pid] = proc
                    for child in proc.children(recursive=True):
                        found[child.pid] = child
        found.pop(os.getpid(), None)
        return list(found.values())

    def stop(self) -> None:
        """TERM, then KILL, every process of this cluster; remove its temp dir.

        The cluster is thrown away, so its processes get one second to exit: the GCS and the
        raylets take longer than five to act on SIGTERM while their peers are going too."""
        procs = self.processes()
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=STOP_GRACE_S)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=5)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _name(proc: psutil.Process) -> str | None:
    """The process's name, or None when it has just exited."""
    try:
        return proc.name()
    except psutil.Error:
        return None
