"""The tuning database, in the results store's SQLite file: tuning sessions, one trial per
configuration measured (or failed), and the adopted configuration of each task.

A task is one kernel shape on one machine class under one schedule (`kbd.plan.tuned.TaskKey`):
trials and adopted configurations are keyed by its hash, so a change of CPU, thread count,
schedule text or torch-mlir version starts afresh. Trials are written and committed as each
configuration ends, so a session killed at any point resumes without measuring a finished
configuration again (`kbd tune --resume`), and a configuration that failed is never run again
for its task, by any session.
"""

from __future__ import annotations

import json
import time

import msgspec

from kbd.plan.space import Config
from kbd.plan.tuned import TaskKey, Tuned, config_text
from kbd.results.record import Record
from kbd.results.store import Store
from kbd.shared.errors import InputError

SCHEMA = """
CREATE TABLE IF NOT EXISTS tunes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created REAL NOT NULL,
    finished REAL,
    status TEXT NOT NULL,              -- running | done | interrupted
    command TEXT NOT NULL,
    options TEXT NOT NULL              -- the TuneSpec as JSON, to resume
);
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tune_id INTEGER NOT NULL REFERENCES tunes(id),
    task TEXT NOT NULL,                -- TaskKey hash
    kernel TEXT NOT NULL,
    config TEXT NOT NULL,              -- canonical JSON of the configuration
    stage TEXT NOT NULL,               -- search | confirm
    outcome TEXT NOT NULL,             -- a kbd outcome, or invalid (a constraint it breaks)
    phase TEXT NOT NULL,
    message TEXT NOT NULL,
    speedup REAL,                      -- over eager, with its 95% interval (passing, timed)
    low REAL,
    high REAL,
    finished REAL NOT NULL,
    record TEXT                        -- JSON of the run's record
);
CREATE INDEX IF NOT EXISTS trials_by_task ON trials(task, config);
CREATE TABLE IF NOT EXISTS tuned (
    task TEXT PRIMARY KEY,
    key TEXT NOT NULL,                 -- the TaskKey as JSON
    kernel TEXT NOT NULL,
    config TEXT NOT NULL,              -- the adopted configuration (the default when no gain)
    adopted INTEGER NOT NULL,          -- 1: a confirmed gain; 0: the default stays
    gain REAL,                         -- adopted over default, confirmed in fresh processes
    gain_low REAL,
    note TEXT NOT NULL,
    tune_id INTEGER NOT NULL,
    finished REAL NOT NULL
);
"""


class Trial(msgspec.Struct, frozen=True, kw_only=True):
    """One configuration's result for one task."""

    config: Config
    stage: str
    outcome: str
    phase: str
    message: str = ""
    speedup: float | None = None
    low: float | None = None
    high: float | None = None

    @property
    def timed(self) -> bool:
        return self.outcome == "pass" and self.speedup is not None


def trial_of(record: Record, config: Config, stage: str) -> Trial:
    """A trial from the record of the run that measured `config`."""
    bench = record.bench
    return Trial(
        config=config,
        stage=stage,
        outcome=record.outcome,
        phase=record.phase,
        message=record.message or (record.not_benchmarked or ""),
        speedup=bench.speedup if bench else None,
        low=bench.speedup_low if bench else None,
        high=bench.speedup_high if bench else None,
    )


class TuningStore:
    """The tuning tables of a results store."""

    def __init__(self, store: Store, *, create: bool = True):
        """The tuning tables of `store`, created when missing (not when only reading them:
        `create` False, as `kbd run` does to find tuned configurations)."""
        self.store = store
        self._db = store._db
        if create:
            self._db.executescript(SCHEMA)

    def create(self, command: str, options: str) -> int:
        cursor = self._db.execute(
            "INSERT INTO tunes (created, status, command, options) VALUES (?, 'running', ?, ?)",
            (time.time(), command, options),
        )
        return cursor.lastrowid

    def session(self, tune_id: int | None) -> tuple[int, str]:
        """(id, options JSON) of a tuning session, the latest when `tune_id` is None."""
        if tune_id is None:
            row = self._db.execute("SELECT id, options FROM tunes ORDER BY id DESC LIMIT 1")
        else:
            row = self._db.execute("SELECT id, options FROM tunes WHERE id = ?", (tune_id,))
        found = row.fetchone()
        if found is None:
            what = "no tuning session" if tune_id is None else f"no tuning session {tune_id}"
            raise InputError(f"{self.store.path}: {what}")
        return found[0], found[1]

    def set_status(self, tune_id: int, status: str) -> None:
        self._db.execute(
            "UPDATE tunes SET status = ?, finished = ? WHERE id = ?",
            (status, time.time(), tune_id),
        )

    def add_trial(self, tune_id: int, task: str, kernel: str, trial: Trial, record: Record | None):
        self._db.execute(
            "INSERT INTO trials (tune_id, task, kernel, config, stage, outcome, phase, message,"
            " speedup, low, high, finished, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                tune_id,
                task,
                kernel,
                config_text(trial.config),
                trial.stage,
                trial.outcome,
                trial.phase,
                trial.message,
                trial.speedup,
                trial.low,
                trial.high,
                time.time(),
                msgspec.json.encode(record).decode() if record is not None else None,
            ),
        )

    def trials(self, task: str, tune_id: int | None = None) -> list[Trial]:
        """The task's trials, oldest first: every session's, or one session's."""
        query = "SELECT config, stage, outcome, phase, message, speedup, low, high FROM trials"
        query += " WHERE task = ?" + (" AND tune_id = ?" if tune_id is not None else "")
        args = (task,) if tune_id is None else (task, tune_id)
        return [
            Trial(
                config=json.loads(row[0]),
                stage=row[1],
                outcome=row[2],
                phase=row[3],
                message=row[4],
                speedup=row[5],
                low=row[6],
                high=row[7],
            )
            for row in self._db.execute(query + " ORDER BY id", args)
        ]

    def adopt(self, tuned: Tuned, tune_id: int) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO tuned (task, key, kernel, config, adopted, gain, gain_low,"
            " note, tune_id, finished) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                tuned.key.hash(),
                msgspec.json.encode(tuned.key).decode(),
                tuned.kernel,
                config_text(tuned.config),
                int(tuned.adopted),
                tuned.gain,
                tuned.gain_low,
                tuned.note,
                tune_id,
                time.time(),
            ),
        )

    def all_tuned(self) -> list[Tuned]:
        exists = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tuned'"
        ).fetchone()
        if exists is None:
            return []
        rows = self._db.execute(
            "SELECT key, kernel, config, adopted, gain, gain_low, note FROM tuned ORDER BY kernel"
        )
        return [
            Tuned(
                key=msgspec.json.decode(row[0], type=TaskKey),
                kernel=row[1],
                config=json.loads(row[2]),
                adopted=bool(row[3]),
                gain=row[4],
                gain_low=row[5],
                note=row[6],
            )
            for row in rows
        ]

    def import_tuned(self, tuned: list[Tuned], tune_id: int) -> None:
        for entry in tuned:
            self.adopt(entry, tune_id)
