"""Messages between a client and the daemon (kbd.daemon), in the frames of kbd.shared.protocol.

On the daemon's owner-only Unix socket, the client's first frame is `Hello`, answered by
`Welcome` whatever the client's identity; then one `DaemonRequest` per exchange, answered by a
`DaemonReply`. A `SubmitRequest` (unless detached) or an `AttachRequest` that is `Accepted` is
followed by `DaemonEvent`s until the sweep ends (`SweepEnded`); a `SubmitTune` (or an attach to
a tune) by `Notice`s and `TrialEnded`s until `TuneEnded` (kbd.tune.events). Frames from clients
are bounded by `MAX_CLIENT_FRAME`.

They live here rather than in kbd/shared/protocol.py because they carry a `SweepSpec` and
`Record`s, which the shared contract cannot import (as kbd/cluster/wire.py does for the cluster).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from kbd.plan.spec import SweepSpec, TuneSpec
from kbd.results.record import Record
from kbd.shared.identity import Identity
from kbd.tune.events import TrialEnded, TuneEnded

DAEMON_PROTOCOL = 1  # a client and a daemon of other protocols do not talk past Hello
MAX_CLIENT_FRAME = 1024 * 1024  # what a daemon accepts from a client


class Hello(msgspec.Struct, frozen=True, tag="hello"):
    """A client's first frame."""

    protocol: int
    identity: Identity
    pid: int


class Welcome(msgspec.Struct, frozen=True, tag="welcome"):
    """The daemon's answer to Hello: who it is, whatever the client's identity."""

    protocol: int
    identity: Identity
    pid: int
    started: float  # time.time() at start
    store: str  # absolute path of its results database
    log: str | None  # its log file (None: stderr, e.g. the journal under systemd)


class StatusRequest(msgspec.Struct, frozen=True, tag="status"):
    pass


class StopRequest(msgspec.Struct, frozen=True, tag="stop"):
    """Stop admitting kernels, let running ones finish (`now`: kill them), then exit."""

    now: bool = False


class CancelRequest(msgspec.Struct, frozen=True, tag="cancel"):
    """Stop a sweep (`tune`: a tuning session): start nothing more of it; `kill` also kills its
    running kernels."""

    sweep_id: int
    kill: bool = False
    tune: bool = False  # sweep_id is a tuning session's id


class AttachRequest(msgspec.Struct, frozen=True, tag="attach"):
    """Follow a sweep's progress (None: the latest active one; `tune`: a tuning session's)."""

    sweep_id: int | None = None
    tune: bool = False


class SweepState(msgspec.Struct, frozen=True):
    """One active sweep, run or tune in the daemon, for status."""

    sweep_id: int | None  # None: a `kbd run`, not stored, or a tune
    command: str
    total: int
    done: int
    running: list[str]
    followers: int
    state: Literal["running", "stopping", "killing"]
    tune_id: int | None = None  # a `kbd tune`: total and done count its tasks


class DaemonStatus(msgspec.Struct, frozen=True, tag="daemon-status"):
    pid: int
    started: float
    identity: Identity
    store: str
    state_dir: str
    log: str | None
    idle_timeout: float
    cores: list[int]
    free_cores: list[int]
    budget: int
    reserved: int  # memory reserved by running kernels (their estimates)
    peak_rss_total: int  # highest measured sum of running workers' RSS
    templates: dict[str, int]  # thread count -> template pid
    sweeps: list[SweepState]
    clients: int


class Done(msgspec.Struct, frozen=True, tag="done"):
    """A request was carried out."""

    message: str = ""


class Refused(msgspec.Struct, frozen=True, tag="refused"):
    """A request was not carried out; `message` says why in one line."""

    message: str
    exit_status: int = 1  # 2: bad input (an unknown kernel, a malformed levels file, ...)


class SubmitRequest(msgspec.Struct, frozen=True, tag="submit"):
    """Run a `kbd run` (sweep=False: nothing stored) or `kbd sweep` in the daemon."""

    spec: SweepSpec  # paths absolute
    sweep: bool
    command: str  # the command line, as stored with the sweep
    resume: int | None = None  # continue this stored sweep (its spec is `spec`)
    log_dir: str | None = None  # absolute; None: .kbd/logs/<run> next to the store
    detach: bool = False  # answer Accepted and return; the sweep runs on


class SubmitTune(msgspec.Struct, frozen=True, tag="submit-tune"):
    """Run a `kbd tune` in the daemon (kbd.tune.session)."""

    spec: TuneSpec  # paths absolute
    command: str  # the command line, as stored with the session
    resume: int | None = None  # continue this stored tuning session (its options are `spec`)
    log_dir: str | None = None  # absolute; None: logs/tune-<id> next to the store
    detach: bool = False


class Accepted(msgspec.Struct, frozen=True, tag="accepted"):
    sweep_id: int | None
    total: int  # kernels to run now (a tune's: kernels to tune)
    selected: int  # kernels selected (a resumed sweep ran some already)
    tune_id: int | None = None  # a tune's session


class KernelStarted(msgspec.Struct, frozen=True, tag="started"):
    kernel: str


class KernelPhase(msgspec.Struct, frozen=True, tag="kernel-phase"):
    kernel: str
    phase: str


class KernelMemory(msgspec.Struct, frozen=True, tag="memory"):
    kernel: str
    rss: int


class KernelFinished(msgspec.Struct, frozen=True, tag="finished"):
    record: Record


class Notice(msgspec.Struct, frozen=True, tag="notice"):
    text: str


class SweepEnded(msgspec.Struct, frozen=True, tag="ended"):
    status: Literal["done", "interrupted"]
    wall_s: float
    completed: bool  # every kernel started (not cancelled or stopped)


DaemonRequest = (
    StatusRequest | StopRequest | CancelRequest | AttachRequest | SubmitRequest | SubmitTune
)
DaemonReply = Welcome | DaemonStatus | Done | Refused | Accepted
DaemonEvent = (
    KernelStarted
    | KernelPhase
    | KernelMemory
    | KernelFinished
    | Notice
    | SweepEnded
    | TrialEnded
    | TuneEnded
)
