"""The results store: an embedded SQLite database (WAL), one row per attempt.

A sweep row holds what is needed to resume it (the options it was started with and its kernel
list); an attempt row is written, and committed, as each kernel ends. A kernel without an
attempt row has no final result and is what `--resume` runs again.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from kbd.plan.paths import check_output
from kbd.results.record import Record
from kbd.shared.errors import InputError

SCHEMA = """
CREATE TABLE IF NOT EXISTS sweeps (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created REAL NOT NULL,
    finished REAL,
    status TEXT NOT NULL,              -- running | done | interrupted
    command TEXT NOT NULL,
    options TEXT NOT NULL,             -- the SweepSpec as JSON (kbd.plan.spec), to resume
    kernels TEXT NOT NULL,             -- JSON list of kernel names, in run order
    config_hash TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    sweep_id INTEGER NOT NULL REFERENCES sweeps(id),
    kernel TEXT NOT NULL,
    config_hash TEXT NOT NULL,
    outcome TEXT NOT NULL,
    phase TEXT NOT NULL,
    signal TEXT,
    message TEXT NOT NULL,
    wall_s REAL NOT NULL,
    peak_rss_bytes INTEGER,
    log TEXT,
    limits TEXT NOT NULL,              -- JSON: the limits actually enforced
    finished REAL NOT NULL,
    record TEXT NOT NULL               -- JSON of the whole record
);
CREATE INDEX IF NOT EXISTS attempts_by_sweep ON attempts(sweep_id, kernel);
CREATE INDEX IF NOT EXISTS attempts_by_kernel ON attempts(kernel, finished);
"""


@dataclass(frozen=True)
class Sweep:
    id: int
    created: float
    finished: float | None
    status: str
    command: str
    options: str  # the SweepSpec as JSON; kbd.plan.spec.decode reads it
    kernels: list[str]
    config_hash: str


class Store:
    def __init__(self, path: Path):
        """Open the store at `path`, creating it (and its folder) when missing."""
        self.path = path
        check_output(path, None, write=False)  # not a folder, not under a file
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"{path}: cannot create its folder ({exc.strerror})") from None
        try:
            self._db = sqlite3.connect(path, isolation_level=None, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise InputError(f"{path}: not a kbd results database ({exc})") from None

    @classmethod
    def existing(cls, path: Path) -> Store:
        """The store at `path`, which must exist (commands that only read it)."""
        if not path.exists():
            raise InputError(f"{path}: no results database (run `kbd sweep` first or pass --db)")
        return cls(path)

    def close(self) -> None:
        self._db.close()

    def create_sweep(self, command: str, options: str, kernels: list[str], config_hash: str) -> int:
        cursor = self._db.execute(
            "INSERT INTO sweeps (created, status, command, options, kernels, config_hash) "
            "VALUES (?, 'running', ?, ?, ?, ?)",
            (time.time(), command, options, json.dumps(kernels), config_hash),
        )
        return int(cursor.lastrowid)

    def set_status(self, sweep_id: int, status: str) -> None:
        finished = time.time() if status != "running" else None
        self._db.execute(
            "UPDATE sweeps SET status = ?, finished = ? WHERE id = ?", (status, finished, sweep_id)
        )

    def add_attempt(self, sweep_id: int, config_hash: str, record: Record) -> None:
        self._db.execute(
            "INSERT INTO attempts (sweep_id, kernel, config_hash, outcome, phase, signal, message,"
            " wall_s, peak_rss_bytes, log, limits, finished, record)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                sweep_id,
                record.kernel,
                config_hash,
                record.outcome,
                record.phase,
                record.signal,
                record.message,
                record.wall_s,
                record.peak_rss_bytes,
                record.log,
                json.dumps(record.limits),
                time.time(),
                msgspec.json.encode(record).decode(),
            ),
        )

    def sweep(self, sweep_id: int | None) -> Sweep:
        """A sweep by id, or the latest one."""
        if sweep_id is None:
            row = self._db.execute("SELECT * FROM sweeps ORDER BY id DESC LIMIT 1").fetchone()
            if row is None:
                raise InputError(f"{self.path}: no sweep recorded yet")
        else:
            row = self._db.execute("SELECT * FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
            if row is None:
                raise InputError(f"{self.path}: no sweep with id {sweep_id}")
        return _sweep(row)

    def sweeps(self) -> list[Sweep]:
        return [_sweep(r) for r in self._db.execute("SELECT * FROM sweeps ORDER BY id")]

    def records(self, sweep_id: int) -> list[Record]:
        """The final record of each kernel and mode of a sweep (the latest attempt wins), in the
        sweep's order: its kernels as planned, import mode before compile mode."""
        row = self._db.execute("SELECT kernels FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
        position = {kernel: i for i, kernel in enumerate(json.loads(row[0]) if row else [])}
        rows = self._db.execute(
            "SELECT record FROM attempts WHERE sweep_id = ? ORDER BY id", (sweep_id,)
        )
        return sorted(
            _latest(rows).values(),
            key=lambda r: (position.get(r.kernel, len(position)), r.mode != "import"),
        )

    def count_attempts(self, sweep_id: int, outcome: str) -> dict[str, int]:
        """kernel -> how many of its attempts in a sweep ended with `outcome` (e.g. `lost`)."""
        rows = self._db.execute(
            "SELECT kernel, count(*) FROM attempts WHERE sweep_id = ? AND outcome = ?"
            " GROUP BY kernel",
            (sweep_id, outcome),
        )
        return dict(rows.fetchall())

    def past(self) -> dict[tuple[str, str], Record]:
        """The latest record of every (kernel, mode) ever run (for ordering and memory
        prediction)."""
        return _latest(self._db.execute("SELECT record FROM attempts ORDER BY id"))


def _sweep(row) -> Sweep:
    id_, created, finished, status, command, options, kernels, config_hash = row
    return Sweep(
        id=id_,
        created=created,
        finished=finished,
        status=status,
        command=command,
        options=options,
        kernels=json.loads(kernels),
        config_hash=config_hash,
    )


def _latest(rows) -> dict[tuple[str, str], Record]:
    """(kernel, mode) -> record of its last attempt, from rows of JSON records in attempt
    order."""
    latest: dict[tuple[str, str], Record] = {}
    for (text,) in rows:
        record = msgspec.json.decode(text, type=Record)
        latest[record.key] = record
    return latest
