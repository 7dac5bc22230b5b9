"""`kbd daemon run | start | stop | status`."""

from __future__ import annotations

import sys
import time
from argparse import Namespace
from pathlib import Path

import msgspec

from kbd.daemon import client, server
from kbd.daemon.client import DaemonError
from kbd.daemon.state import AlreadyRunning, StatePaths
from kbd.daemon.wire import DaemonStatus, Done, StatusRequest, StopRequest
from kbd.daemon.work import Work
from kbd.plan import limits
from kbd.results.store import Store
from kbd.shared.errors import InputError

EXIT_NOT_RUNNING = 3


def main(args: Namespace) -> int:
    paths = StatePaths.for_store(Path(args.db))
    try:
        return _COMMANDS[args.daemon_command](args, paths)
    except DaemonError as exc:
        print(f"kbd: {exc}", file=sys.stderr)
        return 1


def _check_start(args: Namespace, paths: StatePaths) -> None:
    """What a daemon about to start needs, checked before it starts (InputError: status 2)."""
    if not args.idle_timeout >= 0:  # also NaN
        raise InputError(f"--idle-timeout must be 0 (never) or positive, got {args.idle_timeout:g}")
    Store(paths.store).close()  # a results database, or where one can be created


def _run(args: Namespace, paths: StatePaths) -> int:
    _check_start(args, paths)
    cores = limits.usable_cores()
    budget = (
        limits.parse_size(args.mem_budget, "--mem-budget")
        if args.mem_budget
        else limits.default_budget()
    )
    try:
        return server.run(
            paths,
            idle_timeout=args.idle_timeout,
            log_file=Path(args.log).resolve() if args.log else None,
            work=Work(cores, budget, paths.store),
        )
    except AlreadyRunning as exc:
        print(f"kbd: a daemon already runs for {paths.store}:\n{exc}", file=sys.stderr)
        return client.EXIT_ALREADY_RUNNING


def _start(args: Namespace, paths: StatePaths) -> int:
    _check_start(args, paths)
    started = time.monotonic()
    connection = client.ensure(paths, idle_timeout=args.idle_timeout, announce=_say)
    _wait_warm(connection)
    print(
        f"kbd: daemon running for {paths.store} (pid {connection.welcome.pid}, "
        f"ready after {time.monotonic() - started:.1f}s, log {connection.welcome.log or 'stderr'})"
    )
    return 0


def _wait_warm(connection: client.Connection) -> None:
    """Wait until the daemon's first template is warm, so the next command starts at once."""
    deadline = time.monotonic() + client.START_TIMEOUT_S
    while time.monotonic() < deadline:
        status = connection.request(StatusRequest())
        if isinstance(status, DaemonStatus) and status.templates:
            return
        time.sleep(0.1)


def _say(text: str) -> None:
    print(text, file=sys.stderr)


def _stop(args: Namespace, paths: StatePaths) -> int:
    try:
        connection = client.connect(paths)
    except DaemonError as exc:
        pid = client.terminate_recorded(paths)
        if pid is None:
            raise
        print(f"kbd: {exc}\nkbd: sent SIGTERM to daemon pid {pid}", file=sys.stderr)
        client.wait_gone(paths, pid)
        return 0
    if connection is None:
        print(f"kbd: no daemon running for {paths.store}")
        return 0
    reply = connection.request(StopRequest(now=args.now))
    if not isinstance(reply, Done):
        print(f"kbd: the daemon refused to stop: {reply.message}", file=sys.stderr)
        return 1
    print(f"kbd: stopping daemon pid {connection.welcome.pid}", file=sys.stderr)
    client.wait_gone(paths, connection.welcome.pid)
    print(f"kbd: daemon pid {connection.welcome.pid} stopped")
    return 0


def _status(args: Namespace, paths: StatePaths) -> int:
    connection = client.connect(paths)
    if connection is None:
        print(f"kbd: no daemon running for {paths.store} (state directory {paths.directory})")
        return EXIT_NOT_RUNNING
    status = connection.request(StatusRequest())
    assert isinstance(status, DaemonStatus)
    differences = connection.differences()
    if args.json:
        print(msgspec.json.encode(status).decode())
        return 0
    print(_describe(status, differences))
    return 0


def _describe(status: DaemonStatus, differences: list[str]) -> str:
    from kbd.plan.limits import format_size

    uptime = time.time() - status.started
    lines = [
        f"pid          {status.pid} (up {uptime:.0f}s, idle timeout {status.idle_timeout:g}s)",
        f"store        {status.store}",
        f"state dir    {status.state_dir}",
        f"log          {status.log or 'stderr'}",
        f"code         {status.identity.code_hash} "
        + (
            "(same as this kbd)" if not differences else "(DIFFERS: " + "; ".join(differences) + ")"
        ),
        f"cores        {len(status.free_cores)} of {len(status.cores)} free",
        f"memory       {format_size(status.reserved)} of {format_size(status.budget)} reserved, "
        f"peak measured {format_size(status.peak_rss_total)}",
        "templates    "
        + (", ".join(f"{t} threads: pid {p}" for t, p in status.templates.items()) or "none"),
        f"clients      {status.clients}",
    ]
    for sweep in status.sweeps:
        name = f"sweep {sweep.sweep_id}" if sweep.sweep_id is not None else "run"
        if sweep.tune_id is not None:
            name = f"tune {sweep.tune_id}"  # done and total count kernels tuned
        lines.append(
            f"{name:<12} {sweep.state}: {sweep.done}/{sweep.total} done, "
            f"{len(sweep.running)} running, {sweep.followers} following  ({sweep.command})"
        )
    return "\n".join(lines)


_COMMANDS = {"run": _run, "start": _start, "stop": _stop, "status": _status}
