"""One command line, typed: built once by `kbd.cli.main` from argparse's namespace.

A run's or sweep's `SweepSpec` says what runs (it is stored, resumed and shipped to a daemon or
cluster). `Invocation` holds the rest of what a command line says, which belongs to this
invocation only: the command, how results are shown (--json, --junit, --html), where logs and
results go (--log-dir, --db), whether a daemon runs it, and which sweep it means. Defaults are
declared here and in `SweepSpec`; the parser's defaults and help strings are derived from them.
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path
from typing import Literal

import msgspec

DEFAULT_DB = ".kbd/results.db"
# A daemon exits after this long without clients or work; `kbd run` starts it with this too.
DAEMON_IDLE_TIMEOUT_S = 1800.0
# `kbd compare --threshold`: the least change that can be significant (kbd/bench/compare.py).
COMPARE_THRESHOLD = 0.05


class Invocation(msgspec.Struct, frozen=True, kw_only=True):
    """The per-invocation options of any `kbd` command (those it lacks keep their defaults)."""

    command: str
    db: str = DEFAULT_DB  # the results database (--db)
    json: bool = False  # JSON Lines on stdout instead of lines for a person
    junit: str | None = None  # also write JUnit XML here
    html: str | None = None  # `kbd results --html`: write the HTML report here
    tune_session: int | None = None  # `kbd results --html --tune ID`: the session it shows
    log_dir: str | None = None  # where per-kernel logs go; None: .kbd/logs/<run>
    # auto: use the store's daemon when one runs; yes: start one if none runs; no: never
    daemon: Literal["auto", "yes", "no"] = "auto"
    detach: bool = False  # `kbd sweep --detach`, `kbd tune --detach`: submit to the daemon
    resume: str | None = None  # `kbd sweep/tune --resume [ID]`: an id or "latest"
    cluster: str | None = None  # `--cluster ADDRESS`, as given
    id: int | None = None  # the sweep of `kbd attach`, `cancel` and `results`
    kill: bool = False  # `kbd cancel --kill`
    tune: bool = False  # `kbd attach --tune`, `kbd cancel --tune`: `id` is a tuning session's

    @classmethod
    def of(cls, args: Namespace) -> Invocation:
        """The invocation of a parsed command line: every field the namespace has."""
        known = {field.name for field in msgspec.structs.fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in known})

    @property
    def store_path(self) -> Path:
        return Path(self.db)

    @property
    def sweep(self) -> bool:
        """Does the command store its results (a sweep), or only print them (a run)?"""
        return self.command == "sweep"
