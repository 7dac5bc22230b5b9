"""What a tune reports as it runs, as messages: the same ones whether it runs in this process,
in the daemon (they cross its socket, kbd.daemon.wire) or as the head of a cluster tune.
kbd.tune.show shows them."""

from __future__ import annotations

import msgspec

from kbd.results.tune_summary import TaskRow
from kbd.results.tuning import Trial


class TrialEnded(msgspec.Struct, frozen=True, tag="trial-ended"):
    """One configuration's trial, with where its task stands after it."""

    kernel: str
    trial: Trial
    measured: int  # configurations searched so far
    failed: int  # of which failed
    best: float | None  # the best speedup over eager so far (None: nothing timed yet)


class TuneEnded(msgspec.Struct, frozen=True, tag="tune-ended"):
    """The last message of a tune: its summary, the lines after it and its exit status."""

    tune_id: int
    status: str  # done | interrupted, as stored
    rows: list[TaskRow]
    closing: list[str]  # stderr lines after the table (failed kernels, how to resume, errors)
    exit_status: int
