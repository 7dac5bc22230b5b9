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
CREATE TABLE IF NOT EXISTS tune_tasks (
    tune_id INTEGER NOT NULL REFERENCES tunes(id),
    task TEXT NOT NULL,                -- TaskKey hash
    kernel TEXT NOT NULL,
    descriptor TEXT NOT NULL,          -- the TaskKey's descriptor
    configs INTEGER NOT NULL,          -- valid configurations of its space on this machine
    default_config TEXT NOT NULL,      -- canonical JSON of the default configuration
    PRIMARY KEY (tune_id, task)
);
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


class Session(msgspec.Struct, frozen=True, kw_only=True):
    """A tuning session as stored."""

    id: int
    created: float
    finished: float | None
    status: str  # running | done | interrupted
    command: str


class SessionTask(msgspec.Struct, frozen=True, kw_only=True):
    """A task a session tuned: what its trials alone do not say."""

    task: str  # TaskKey hash
    kernel: str
    descriptor: str  # "" when not recorded (a session of a kbd before tune_tasks)
    configs: int | None  # valid configurations (None: not recorded)
    default: Config | None


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

    def add_task(
        self, tune_id: int, task: str, kernel: str, descriptor: str, configs: int, default: Config
    ) -> None:
        """Record a task of the session, once (a resumed session has it already)."""
        self._db.execute(
            "INSERT OR IGNORE INTO tune_tasks (tune_id, task, kernel, descriptor, configs,"
            " default_config) VALUES (?, ?, ?, ?, ?, ?)",
            (tune_id, task, kernel, descriptor, configs, config_text(default)),
        )

    def sessions(self) -> list[Session]:
        """Every tuning session, oldest first; none in a store without the tuning tables."""
        if not self._has("tunes"):
            return []
        rows = self._db.execute(
            "SELECT id, created, finished, status, command FROM tunes ORDER BY id"
        )
        return [
            Session(id=r[0], created=r[1], finished=r[2], status=r[3], command=r[4]) for r in rows
        ]

    def session_tasks(self, tune_id: int) -> list[SessionTask]:
        """The tasks of a session in the order it tuned them: those it recorded, then any with
        trials only (a session of a kbd that did not record its tasks: the default is taken
        as the task's first configuration measured, which the search proposes first)."""
        found = []
        if self._has("tune_tasks"):
            rows = self._db.execute(
                "SELECT task, kernel, descriptor, configs, default_config FROM tune_tasks"
                " WHERE tune_id = ? ORDER BY rowid",
                (tune_id,),
            )
            found = [
                SessionTask(
                    task=r[0],
                    kernel=r[1],
                    descriptor=r[2],
                    configs=r[3],
                    default=json.loads(r[4]),
                )
                for r in rows
            ]
        known = {t.task for t in found}
        rows = self._db.execute(
            "SELECT task, kernel, MIN(id) FROM trials WHERE tune_id = ? GROUP BY task"
            " ORDER BY MIN(id)",
            (tune_id,),
        )
        for task, kernel, _ in rows:
            if task not in known:
                first = self._db.execute(
                    "SELECT config FROM trials WHERE task = ? AND stage = 'search'"
                    " ORDER BY id LIMIT 1",
                    (task,),
                ).fetchone()
                default = json.loads(first[0]) if first else None
                found.append(
                    SessionTask(
                        task=task, kernel=kernel, descriptor="", configs=None, default=default
                    )
                )
        return found

    def session_trials(self, task: str, tune_id: int) -> list[Trial]:
        """What a session works from for a task: its own trials, and the failures of every
        other session (a configuration that failed once is never run again, whichever session
        measured it)."""
        ours = self.trials(task, tune_id)
        others = [
            t
            for t in self._trials(
                "WHERE task = ? AND tune_id != ? AND outcome != 'pass'", task, tune_id
            )
            if t not in ours
        ]
        return ours + others

    def _has(self, table: str) -> bool:
        found = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
        return found is not None

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
        if tune_id is None:
            return self._trials("WHERE task = ?", task)
        return self._trials("WHERE task = ? AND tune_id = ?", task, tune_id)

    def _trials(self, where: str, *args) -> list[Trial]:
        query = "SELECT config, stage, outcome, phase, message, speedup, low, high FROM trials "
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
            for row in self._db.execute(query + where + " ORDER BY id", args)
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
        if not self._has("tuned"):
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
