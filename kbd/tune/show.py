"""How `kbd tune` shows its progress and summary (kbd.tune.events), wherever it runs: each
trial a line on stderr, the summary table on stdout, then the closing lines on stderr."""

from __future__ import annotations

import sys

from kbd.results import tune_summary
from kbd.tune.events import TrialEnded, TuneEnded


def line(event: TrialEnded) -> str:
    trial = event.trial
    config = " ".join(f"{k}={v}" for k, v in sorted(trial.config.items()))
    if trial.timed:
        result = f"{trial.speedup:.3g}x [{trial.low:.3g}, {trial.high:.3g}]"
    else:
        result = (
            f"{trial.outcome} ({trial.phase}{': ' + trial.message[:80] if trial.message else ''})"
        )
    where = (
        f"{event.measured} measured, {event.failed} failed"
        if trial.stage == "search"
        else "confirming"
    )
    leader = f"best {event.best:.3g}x" if event.best is not None else "nothing timed yet"
    return f"  {event.kernel} {{{config}}}: {result}   [{where}; {leader}]"


def show_trial(event: TrialEnded) -> None:
    print(line(event), file=sys.stderr, flush=True)


def show_end(ended: TuneEnded) -> None:
    if ended.rows:
        print("\n" + tune_summary.table(ended.rows))
        sys.stdout.flush()
    for text in ended.closing:
        print(text, file=sys.stderr)
