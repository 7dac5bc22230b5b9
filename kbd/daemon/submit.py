"""The client side of running in a daemon: submit, follow, attach, cancel.

Choice (documented in the README): `kbd run`, `kbd sweep` and `kbd tune` use the daemon of their
store when one is running (the default), start one with `--daemon` (implied by `--detach`), and
never use one with `--no-daemon`. Ctrl-C in a client following a sweep or a tune detaches (it
goes on in the daemon); a `kbd run` is cancelled. Without a daemon they run in this process,
exactly as before. A daemon of other code is never used silently: an idle one is replaced, a
busy one is bypassed; either way the client says what differs.
"""

from __future__ import annotations

import select
import shlex
import sys
import time
from pathlib import Path

import msgspec

from kbd.daemon import client
from kbd.daemon.client import Connection, DaemonError, DaemonLost
from kbd.daemon.state import StatePaths
from kbd.daemon.wire import (
    Accepted,
    AttachRequest,
    CancelRequest,
    DaemonEvent,
    Done,
    KernelFinished,
    KernelMemory,
    KernelPhase,
    KernelStarted,
    Notice,
    Refused,
    SubmitRequest,
    SubmitTune,
    SweepEnded,
)
from kbd.plan import catalog
from kbd.plan.invocation import DAEMON_IDLE_TIMEOUT_S, Invocation
from kbd.plan.spec import SweepSpec, TuneSpec
from kbd.results.record import Record
from kbd.results.store import Store, Sweep
from kbd.results.tuning import TuningStore
from kbd.shared.errors import InputError
from kbd.tune import show as tuning_view
from kbd.tune.events import TrialEnded, TuneEnded
from kbd.views import reports
from kbd.views.progress import Progress


def run_or_sweep(invocation: Invocation, options: SweepSpec, resumed: Sweep | None) -> int | None:
    """Run in the daemon and return the exit status; None: run in this process instead."""
    paths = StatePaths.for_store(invocation.store_path)
    mode = "yes" if invocation.detach else invocation.daemon
    connection = _connection(paths, mode)
    if connection is None:
        return None
    # resolve what depends on this shell (KBD_KERNELBENCH) before it crosses to the daemon
    root = catalog.kernelbench_root(options.kernelbench)
    options = msgspec.structs.replace(options, kernelbench=str(root.resolve()))
    request = SubmitRequest(
        spec=options,
        sweep=invocation.sweep,
        command=shlex.join(["kbd", *sys.argv[1:]]),
        resume=resumed.id if resumed is not None else None,
        log_dir=str(Path(invocation.log_dir).resolve()) if invocation.log_dir else None,
        detach=invocation.detach,
    )
    reply = connection.request(request)
    if isinstance(reply, Refused):
        print(f"kbd: error: {reply.message}", file=sys.stderr)
        return reply.exit_status
    assert isinstance(reply, Accepted)
    if request.detach:
        print(reply.sweep_id)
        print(
            f"kbd: sweep {reply.sweep_id} runs in the daemon (pid {connection.welcome.pid}): "
            f"`kbd attach {reply.sweep_id}` follows it, `kbd cancel {reply.sweep_id}` stops it",
            file=sys.stderr,
        )
        return 0
    return follow(connection, invocation, reply)


def tune(invocation: Invocation, options: TuneSpec, tune_id: int | None) -> int | None:
    """`kbd tune` in the daemon (`tune_id`: the session to resume); the exit status, or None:
    tune in this process instead."""
    paths = StatePaths.for_store(invocation.store_path)
    connection = _connection(paths, "yes" if invocation.detach else invocation.daemon)
    if connection is None:
        return None
    root = catalog.kernelbench_root(options.sweep.kernelbench)
    sweep = msgspec.structs.replace(options.sweep, kernelbench=str(root.resolve()))
    request = SubmitTune(
        spec=msgspec.structs.replace(options, sweep=sweep),
        command=shlex.join(["kbd", *sys.argv[1:]]),
        resume=tune_id,
        log_dir=str(Path(invocation.log_dir).resolve()) if invocation.log_dir else None,
        detach=invocation.detach,
    )
    reply = connection.request(request)
    if isinstance(reply, Refused):
        print(f"kbd: error: {reply.message}", file=sys.stderr)
        return reply.exit_status
    assert isinstance(reply, Accepted) and reply.tune_id is not None
    if request.detach:
        print(reply.tune_id)
        print(
            f"kbd: tune {reply.tune_id} runs in the daemon (pid {connection.welcome.pid}): "
            f"`kbd attach --tune {reply.tune_id}` follows it, "
            f"`kbd cancel --tune {reply.tune_id}` stops it",
            file=sys.stderr,
        )
        return 0
    return follow_tune(connection, reply.tune_id)


def follow_tune(connection: Connection, tune_id: int) -> int:
    """Show a tune's notices, trials and summary until it ends; its exit status. Ctrl-C
    detaches: the tune goes on in the daemon."""
    try:
        while True:
            event = connection.receive(DaemonEvent)
            if isinstance(event, Notice):
                print(event.text, file=sys.stderr, flush=True)
            elif isinstance(event, TrialEnded):
                tuning_view.show_trial(event)
            elif isinstance(event, TuneEnded):
                connection.close()
                tuning_view.show_end(event)
                return event.exit_status
    except KeyboardInterrupt:
        print(
            f"kbd: detached; tune {tune_id} continues in the daemon: `kbd attach --tune "
            f"{tune_id}` follows it, `kbd cancel --tune {tune_id}` stops it",
            file=sys.stderr,
        )
        return 130
    except DaemonLost as exc:
        print(f"kbd: {exc}", file=sys.stderr)
        print(
            f"kbd: every finished trial is stored; continue with `kbd tune --resume {tune_id}`",
            file=sys.stderr,
        )
        return 1


def _connection(paths: StatePaths, mode: str) -> Connection | None:
    """The daemon to use, or None for in-process (mode auto and none running)."""
    if mode == "yes":
        return client.ensure(paths, idle_timeout=DAEMON_IDLE_TIMEOUT_S, announce=_say)
    connection = client.connect(paths)
    if connection is None:
        return None
    if connection.differences():
        connection.close()
        try:
            return client.ensure(paths, idle_timeout=DAEMON_IDLE_TIMEOUT_S, announce=_say)
        except DaemonError as exc:
            _say(f"kbd: not using the daemon: {exc}; running in this process")
            return None
    return connection


def follow(connection: Connection, invocation: Invocation, accepted: Accepted) -> int:
    """Show a sweep's progress until it ends; Ctrl-C detaches (a `kbd run` is cancelled)."""
    sweep_id = accepted.sweep_id
    progress = Progress(total=accepted.total, live=sys.stderr.isatty() and not invocation.json)
    records: list[Record] = []
    started = time.monotonic()
    try:
        while True:
            readable, _, _ = select.select([connection.sock], [], [], 0.5)
            if not readable:
                progress.render()
                continue
            event = connection.receive(DaemonEvent)
            if isinstance(event, KernelStarted):
                progress.started(event.kernel)
            elif isinstance(event, KernelPhase):
                progress.phase(event.kernel, event.phase)
            elif isinstance(event, KernelMemory):
                progress.memory(event.kernel, event.rss)
            elif isinstance(event, KernelFinished):
                records.append(event.record)
                reports.show(invocation, progress, event.record)
            elif isinstance(event, Notice):
                progress.notice(event.text)
            elif isinstance(event, SweepEnded):
                break
    except KeyboardInterrupt:
        progress.close()
        if sweep_id is None:
            print("kbd: interrupted; the run is cancelled", file=sys.stderr)
        else:
            print(
                f"kbd: detached; sweep {sweep_id} continues in the daemon: "
                f"`kbd attach {sweep_id}` follows it, `kbd cancel {sweep_id}` stops it",
                file=sys.stderr,
            )
        return 130
    except DaemonLost as exc:
        progress.close()
        print(f"kbd: {exc}", file=sys.stderr)
        if sweep_id is not None:
            print(
                f"kbd: what finished is stored; continue with `kbd sweep --resume {sweep_id}`",
                file=sys.stderr,
            )
        return 1
    progress.close()
    connection.close()
    wall = event.wall_s if sweep_id is None else time.monotonic() - started
    if sweep_id is not None:
        records = Store(invocation.store_path).records(sweep_id)
        wall = event.wall_s
    return reports.report(invocation, records, wall, event.completed, sweep_id)


def attach(invocation: Invocation) -> int:
    """`kbd attach [--tune] [ID]`: follow a sweep (a tune) running in the daemon (never starts
    one)."""
    paths = StatePaths.for_store(invocation.store_path)
    if invocation.id is not None:
        _require(paths.store, invocation.id, invocation.tune)
    connection = client.connect(paths)
    if connection is None:
        print(f"kbd: no daemon running for {paths.store}", file=sys.stderr)
        return 1
    reply = connection.request(AttachRequest(invocation.id, tune=invocation.tune))
    if isinstance(reply, Refused):
        print(f"kbd: {reply.message}", file=sys.stderr)
        return reply.exit_status
    assert isinstance(reply, Accepted)
    if invocation.tune:
        print(f"kbd: following tune {reply.tune_id} (Ctrl-C detaches)", file=sys.stderr)
        return follow_tune(connection, reply.tune_id)
    print(f"kbd: following sweep {reply.sweep_id} (Ctrl-C detaches)", file=sys.stderr)
    return follow(connection, invocation, reply)


def cancel(invocation: Invocation) -> int:
    """`kbd cancel [--tune] ID [--kill]`."""
    paths = StatePaths.for_store(invocation.store_path)
    _require(paths.store, invocation.id, invocation.tune)
    connection = client.connect(paths)
    if connection is None:
        print(f"kbd: no daemon running for {paths.store}", file=sys.stderr)
        return 1
    request = CancelRequest(invocation.id, kill=invocation.kill, tune=invocation.tune)
    reply = connection.request(request)
    if isinstance(reply, Done):
        print(f"kbd: {reply.message}", file=sys.stderr)
        return 0
    print(f"kbd: {reply.message}", file=sys.stderr)
    return reply.exit_status


def _require(path: Path, sweep_id: int, tune: bool) -> None:
    """A sweep (tuning session) id the store never recorded is bad input, whether a daemon runs
    or not (a sweep or tune a daemon runs has its row from the start)."""
    what = f"tuning session {sweep_id}" if tune else f"sweep {sweep_id}"
    if not path.exists():
        raise InputError(f"{path}: no results database, so no {what} (or pass --db)")
    store = Store(path)
    try:
        if tune:
            TuningStore(store).session(sweep_id)  # raises InputError naming the id
        else:
            store.sweep(sweep_id)
    finally:
        store.close()


def _say(text: str) -> None:
    print(text, file=sys.stderr)
