"""What a tuning session found for each task, computed once from its trials: the figures (valid
configurations, measured, failures by outcome, the default's and the best's speedup) and the
verdict (adopt the best on a confirmed gain, or why the default stays).

The one source of `kbd tune`'s decision and of its reports: the session adopts what `verdict`
says, its terminal table is `table`, and the HTML report's tuning section
(kbd.bench.tune_report) shows the same `TaskSummary` from the stored trials.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from kbd.plan.space import Config
from kbd.plan.tuned import config_text
from kbd.results.tuning import Trial, TuningStore
from kbd.shared.outcomes import ORDER

EVERY_CONFIGURATION_FAILED = "every configuration failed"
DEFAULT_IS_FASTEST = "the default is the fastest configuration measured"
NOT_CONFIRMED = "not confirmed (the session ended first): the default stays"
CONFIRMATION_FAILED = "confirmation failed: the default stays"


@dataclass(frozen=True)
class Verdict:
    """Whether the best configuration is adopted, with the confirmed gain over the default (the
    ratio of their speedups in fresh processes) and the low end of its interval."""

    text: str
    adopted: bool = False
    config: Config | None = None  # the adopted configuration (None: the default's)
    gain: float | None = None
    gain_low: float | None = None
    confirming: bool = False  # the best and the default are yet to be timed again


@dataclass(frozen=True)
class TaskSummary:
    """One task of a session: its figures and verdict."""

    kernel: str
    descriptor: str
    configs: int | None  # valid configurations of its space (None: not recorded)
    default_config: Config | None
    searched: list[Trial]  # the last search trial of each configuration measured, in order
    failures: dict[str, int]  # outcome -> configurations that ended so, in outcome order
    default: Trial | None  # the default's search trial
    best: Trial | None
    verdict: Verdict

    @property
    def measured(self) -> int:
        return len(self.searched)

    def failed(self) -> str:
        """'1 mismatch, 1 crash' in outcome order, or '0'."""
        return ", ".join(f"{n} {outcome}" for outcome, n in self.failures.items()) or "0"


def best(trials: list[Trial]) -> Trial | None:
    """The fastest timed trial of the search, or None."""
    timed = [t for t in trials if t.timed and t.stage == "search"]
    return max(timed, key=lambda t: t.speedup) if timed else None


def verdict(trials: list[Trial], default: Config) -> Verdict:
    """The verdict on a task from its trials: none passed; the default is the best; the best
    awaits confirmation (no confirmation trials yet); or, confirmed in fresh processes against
    the default, adopted when the interval of its gain lies above 1."""
    winner = best(trials)
    if winner is None:
        return Verdict(EVERY_CONFIGURATION_FAILED)
    if winner.config == default:
        return Verdict(DEFAULT_IS_FASTEST)
    confirmed = {config_text(t.config): t for t in trials if t.stage == "confirm"}
    base = confirmed.get(config_text(default))
    top = confirmed.get(config_text(winner.config))
    if base is None or top is None:
        return Verdict(NOT_CONFIRMED, confirming=True)
    if not base.timed or not top.timed:
        return Verdict(CONFIRMATION_FAILED)
    gain = top.speedup / base.speedup
    low = top.low / base.high
    if low > 1.0:
        text = f"adopted: {gain:.2f}x the default, interval above {low:.2f}x"
        return Verdict(text, adopted=True, config=winner.config, gain=gain, gain_low=low)
    text = f"no confirmed gain ({gain:.2f}x, interval down to {low:.2f}x): the default stays"
    return Verdict(text, gain=gain, gain_low=low)


def summarize(
    kernel: str, descriptor: str, configs: int | None, default: Config | None, trials: list[Trial]
) -> TaskSummary:
    """A task's summary from the trials its session worked from (its own, and the failures of
    earlier sessions, which it did not run again)."""
    by_config = {config_text(t.config): t for t in trials if t.stage == "search"}
    searched = list(by_config.values())
    default_trial = by_config.get(config_text(default)) if default is not None else None
    return TaskSummary(
        kernel=kernel,
        descriptor=descriptor,
        configs=configs,
        default_config=default,
        searched=searched,
        failures=_failures(searched),
        default=default_trial,
        best=best(trials),
        verdict=verdict(trials, default) if default is not None else Verdict(NOT_CONFIRMED),
    )


def _failures(trials: Iterable[Trial]) -> dict[str, int]:
    """Outcome -> count of the trials that did not pass, in the outcome table's order (an
    outcome outside it, such as `invalid`, last)."""
    counts = Counter(t.outcome for t in trials if t.outcome != "pass")

    def position(outcome: str) -> tuple[int, str]:
        return (ORDER.index(outcome) if outcome in ORDER else len(ORDER), outcome)

    return {outcome: counts[outcome] for outcome in sorted(counts, key=position)}


def speedup_of(trial: Trial | None) -> float | None:
    """A trial's speedup over eager when it was timed, else None."""
    if trial is None or not trial.timed or not math.isfinite(trial.speedup):
        return None
    return trial.speedup


def speedup(trial: Trial | None) -> str:
    """'1.23x' for a timed trial, '-' otherwise."""
    return format_speedup(speedup_of(trial))


def format_speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}x"


def interval(trial: Trial | None) -> str:
    """'[1.1, 1.3]' for a timed trial with an interval, '' otherwise."""
    if trial is None or not trial.timed or trial.low is None or trial.high is None:
        return ""
    return f"[{trial.low:.3g}, {trial.high:.3g}]"


class TaskRow(msgspec.Struct, frozen=True):
    """One task's row of kbd tune's summary table (a message: the daemon relays it)."""

    kernel: str
    configs: int | None  # valid configurations (None: not recorded)
    measured: int
    failed: str  # e.g. "2 crash, 1 mismatch", or "0"
    default: float | None  # the default's speedup over eager, searching
    best: float | None
    verdict: str


def row(task: TaskSummary, note: str = "") -> TaskRow:
    """A task's row; `note` in place of its verdict (a task not tuned at all)."""
    return TaskRow(
        kernel=task.kernel,
        configs=task.configs,
        measured=task.measured,
        failed=task.failed(),
        default=speedup_of(task.default),
        best=speedup_of(task.best),
        verdict=note or task.verdict.text,
    )


TABLE_HEADER = (
    f"{'kernel':40} {'configs':>7} {'measured':>9}  {'failed':>6}  default     best   verdict"
)


def table(rows: list[TaskRow]) -> str:
    """kbd tune's summary: one line per task."""
    lines = [TABLE_HEADER]
    for r in rows:
        configs = "-" if r.configs is None else str(r.configs)
        lines.append(
            f"{r.kernel[:40]:40} {configs:>7} {r.measured:>9}  {r.failed:>6}"
            f"  {format_speedup(r.default):>6}  {format_speedup(r.best):>6}   {r.verdict}"
        )
    return "\n".join(lines)


def session(tuning: TuningStore, tune_id: int) -> list[TaskSummary]:
    """Every task of a stored session, as its summary table showed it."""
    return [
        summarize(
            t.kernel, t.descriptor, t.configs, t.default, tuning.session_trials(t.task, tune_id)
        )
        for t in tuning.session_tasks(tune_id)
    ]
