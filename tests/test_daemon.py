"""The daemon's lifecycle and security, with real daemon processes on real sockets."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from kbd.daemon import client
from kbd.daemon.state import StatePaths
from kbd.daemon.wire import (
    DAEMON_PROTOCOL,
    DaemonEvent,
    DaemonReply,
    DaemonRequest,
    DaemonStatus,
    Hello,
    KernelFinished,
    Refused,
    StatusRequest,
    SubmitRequest,
    Welcome,
)
from kbd.plan.spec import Shard, SweepSpec
from kbd.results.record import Record
from kbd.shared import identity, protocol
from kbd.shared.protocol import BenchOptions
from tests import clusters
from tests.conftest import ROOT, kbd


def _paths(tmp_path: Path) -> StatePaths:
    return StatePaths.for_store(tmp_path / ".kbd" / "results.db")


def _started_daemon(cwd: Path):
    """A daemon started in `cwd` as users start it; stopped (by pid, if need be) afterwards."""
    started = kbd("daemon", "start", "--idle-timeout", "120", cwd=cwd, timeout=60)
    assert started.returncode == 0, started.stderr
    paths = _paths(cwd)
    yield paths
    kbd("daemon", "stop", "--now", cwd=cwd, timeout=60)
    info = paths.read_info()
    if info:  # stop failed: do not leave it behind
        with pytest.raises(ProcessLookupError):
            os.kill(info["pid"], signal.SIGKILL)


@pytest.fixture(scope="module")
def shared_daemon(tmp_path_factory):
    """One daemon for the tests that only talk to it (each must leave it running and sound)."""
    yield from _started_daemon(tmp_path_factory.mktemp("shared-daemon"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_status_and_stop_never_start_a_daemon(tmp_path):
    status = kbd("daemon", "status", cwd=tmp_path)
    assert status.returncode == 3
    assert "no daemon running" in status.stdout
    stop = kbd("daemon", "stop", cwd=tmp_path)
    assert stop.returncode == 0
    assert "no daemon running" in stop.stdout
    assert not _paths(tmp_path).socket.exists()


def test_start_status_kill_9_recovery_stop_and_idle_exit(tmp_path):
    """A daemon's life cycle, as users meet it, in one folder (each daemon start warms a
    template: seconds of torch import). Three starts at once make one daemon; status describes
    it and another start finds it; stop ends it and removes its socket and info; after a kill -9
    the stale socket is recovered by the next start; a daemon idle past its timeout exits."""
    paths = _paths(tmp_path)
    command = [sys.executable, "-m", "kbd", "daemon", "start", "--idle-timeout", "120"]
    starts = [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE) for _ in range(3)]
    pids = []
    try:
        outputs = [p.communicate(timeout=60)[0].decode() for p in starts]
        info = paths.read_info()
        pids.append(info["pid"])
        assert all(f"(pid {info['pid']}," in out for out in outputs), outputs

        directory = paths.directory
        assert directory.stat().st_mode & 0o777 == 0o700
        assert directory.parent.stat().st_mode & 0o777 == 0o700
        assert paths.socket.stat().st_mode & 0o777 == 0o600
        status = kbd("daemon", "status", "--json", cwd=tmp_path)
        assert status.returncode == 0
        record = json.loads(status.stdout)
        assert record["pid"] == info["pid"]
        assert record["store"] == str(tmp_path / ".kbd" / "results.db")
        human = kbd("daemon", "status", cwd=tmp_path).stdout
        assert "(same as this kbd)" in human
        again = kbd("daemon", "start", cwd=tmp_path)
        assert f"pid {info['pid']}" in again.stdout  # the same daemon, not a second one
        stop = kbd("daemon", "stop", cwd=tmp_path)
        assert stop.returncode == 0
        assert not _alive(info["pid"])
        assert not paths.socket.exists() and not paths.info.exists()

        started = kbd("daemon", "start", "--idle-timeout", "120", cwd=tmp_path, timeout=60)
        assert started.returncode == 0, started.stderr
        pid = paths.read_info()["pid"]
        pids.append(pid)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert paths.socket.exists()  # stale: nobody listens
        assert kbd("daemon", "status", cwd=tmp_path).returncode == 3
        started = kbd("daemon", "start", "--idle-timeout", "0.5", cwd=tmp_path, timeout=60)
        assert started.returncode == 0, started.stderr
        # from what start prints: idle, this daemon may be gone before its info could be read
        pid = int(re.search(r"\(pid (\d+),", started.stdout).group(1))
        pids.append(pid)
        assert pid != pids[1]

        deadline = time.monotonic() + 30  # nobody uses it: it exits after 0.5 s idle
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid)
        assert "idle for" in paths.log.read_text()
    finally:
        kbd("daemon", "stop", "--now", cwd=tmp_path, timeout=60)
        for pid in pids:  # never leave one behind (checked by command line: pids are reused)
            with contextlib.suppress(OSError):
                if b"daemon\0run" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)


def _connect(paths: StatePaths) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(paths.socket))
    return sock


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">I", (1 << 20) + 1),  # announces more than a client may send
        struct.pack(">I", 3) + b"\xc1\xc1\xc1",  # not msgpack
        struct.pack(">I", 1) + b"\x01",  # msgpack, not a Hello
    ],
)
def test_bad_frame_closes_only_that_connection(shared_daemon, frame):
    bystander = client.connect(shared_daemon)
    bad = _connect(shared_daemon)
    bad.sendall(frame)
    with contextlib.suppress(ConnectionResetError):  # closed with our bytes unread
        assert bad.recv(100) == b""  # closed, no answer

    assert isinstance(bystander.request(StatusRequest()), DaemonStatus)
    cwd = shared_daemon.store.parent.parent  # the folder whose .kbd/results.db it serves
    assert kbd("daemon", "status", cwd=cwd).returncode == 0


def test_a_submitted_spec_that_fails_its_checks_is_refused_as_bad_input(shared_daemon):
    """A client of this kbd checks its spec before it submits it; the daemon checks it again,
    as it decodes the request, and refuses it as bad input (exit status 2)."""
    sock = _connect(shared_daemon)
    try:
        protocol.send_blocking(sock, Hello(DAEMON_PROTOCOL, identity.current(), os.getpid()))
        assert isinstance(protocol.receive_blocking(sock, DaemonReply), Welcome)
        request = {"type": "submit", "spec": {"jobs": 0}, "sweep": False, "command": "kbd run"}
        payload = msgspec.msgpack.encode(request)
        sock.sendall(struct.pack(">I", len(payload)) + payload)
        refused = protocol.receive_blocking(sock, DaemonReply)
    finally:
        sock.close()
    assert refused == Refused("-j/--jobs must be at least 1, got 0", exit_status=2)


def test_daemon_messages_carry_a_sweep_spec_and_records_as_they_are():
    options = SweepSpec(
        kernels=("level1/",), shard=Shard(1, 2), bench=BenchOptions(processes=2), mem_limit=None
    )
    submit = SubmitRequest(spec=options, sweep=True, command="kbd sweep level1/")
    assert protocol.decode(protocol.encode(submit)[4:], DaemonRequest) == submit
    record = Record(kernel="level1/1_matmul", outcome="pass", phase="check", times={"jit": 0.5})
    finished = protocol.decode(protocol.encode(KernelFinished(record))[4:], DaemonEvent)
    assert finished.record == record


_OTHER_UID = """
import ctypes, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
path = sys.argv[1]
if sys.argv[2] == "peer":
    # effective uid nobody, as SO_PEERCRED reports it; file-system uid root, so the 0700
    # directory does not stop us first and the daemon's own check is what is exercised
    os.seteuid(65534)
    libc.setfsuid(0)
else:
    os.setuid(65534)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
try:
    s.connect(path)
except PermissionError:
    print("EACCES")
    sys.exit()
try:
    s.sendall(b"x" * 4)
    print("closed" if s.recv(100) == b"" else "answered")
except (ConnectionResetError, BrokenPipeError):
    print("closed")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_another_uid_is_refused(shared_daemon):
    daemon = shared_daemon
    peer = subprocess.run(
        [sys.executable, "-c", _OTHER_UID, str(daemon.socket), "peer"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert peer.stdout.strip() == "closed", peer.stderr
    assert "refused a connection from uid 65534" in daemon.log.read_text()
    nobody = subprocess.run(
        [sys.executable, "-c", _OTHER_UID, str(daemon.socket), "full"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert nobody.stdout.strip() == "EACCES", nobody.stderr  # the 0700 directory


def test_a_daemon_of_other_code_is_reported_and_replaced(tmp_path):
    """After kbd's code changes, status names the difference and start replaces the daemon."""
    old = tmp_path / "old"
    shutil.copytree(ROOT / "kbd", old / "kbd", ignore=shutil.ignore_patterns("__pycache__"))
    with open(old / "kbd" / "daemon" / "__init__.py", "a") as f:
        f.write("# an edit\n")
    env = {**os.environ, "PYTHONPATH": str(old)}
    work = tmp_path / "work"
    work.mkdir()
    started = kbd("daemon", "start", cwd=work, env=env)
    assert started.returncode == 0, started.stderr
    old_pid = _paths(work).read_info()["pid"]
    try:
        status = kbd("daemon", "status", cwd=work)
        assert "DIFFERS: code hash: daemon " in status.stdout
        replaced = kbd("daemon", "start", cwd=work, timeout=60)
        assert f"replacing the daemon (pid {old_pid}): code hash: daemon" in replaced.stderr
        assert not _alive(old_pid)
        assert "(same as this kbd)" in kbd("daemon", "status", cwd=work).stdout
    finally:
        kbd("daemon", "stop", "--now", cwd=work)


# What a cluster agent's `hello` sends its head, decoded as the head decodes it (without Ray
# running: `hello` reads only these attributes of its agent).
_AGENT_HELLO = """\
import asyncio, sys, types
import msgspec
import kbd
from kbd.cluster import wire
from kbd.cluster.agent import Agent
agent = types.SimpleNamespace(node="n", cores=(0,), slots=[(0,)], budget=1)
info = wire.decode(asyncio.run(Agent.hello(agent)), wire.NodeInfo)
sys.stdout.write(msgspec.json.encode({"kbd": kbd.__file__, "identity": info.identity}).decode())
"""


def _agent_identity(tree: Path, cwd: Path) -> dict:
    """The identity a cluster agent running the kbd of `tree` (the folder holding `kbd/`) sends."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    hello = subprocess.run(
        [sys.executable, "-c", _AGENT_HELLO], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert hello.returncode == 0, hello.stderr
    sent = json.loads(hello.stdout)
    assert Path(sent["kbd"]).is_relative_to(tree)  # that kbd, not the installed one
    return sent["identity"]


@clusters.needs_ray
def test_a_daemon_and_a_cluster_agent_of_the_same_code_have_one_identity(shared_daemon, tmp_path):
    """The identity a daemon reports is the one a cluster agent of the same kbd sends its head,
    also from a copy of kbd elsewhere (as on another machine); an edit of a kbd source file
    changes its code hash, and nothing else."""
    cwd = shared_daemon.store.parent.parent
    status = kbd("daemon", "status", "--json", cwd=cwd)
    assert status.returncode == 0, status.stderr
    daemon = json.loads(status.stdout)["identity"]
    assert _agent_identity(ROOT, tmp_path) == daemon

    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "kbd", copy / "kbd", ignore=shutil.ignore_patterns("__pycache__"))
    assert _agent_identity(copy, tmp_path) == daemon
    with open(copy / "kbd" / "shared" / "outcomes.py", "a") as source:
        source.write("# an edit\n")
    edited = _agent_identity(copy, tmp_path)
    assert edited["code_hash"] != daemon["code_hash"]
    assert {**edited, "code_hash": ""} == {**daemon, "code_hash": ""}


def test_unsafe_state_directory_is_refused(tmp_path):
    paths = _paths(tmp_path)
    paths.directory.parent.mkdir(mode=0o700, exist_ok=True)
    paths.directory.mkdir(mode=0o755)
    paths.directory.chmod(0o755)
    started = kbd("daemon", "start", cwd=tmp_path)
    assert started.returncode != 0
    assert "unsafe daemon state directory" in started.stderr
    paths.directory.rmdir()
