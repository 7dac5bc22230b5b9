"""`kbd results` and `kbd sweeps`: read the results store (no torch, no workers)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from kbd.bench import report, tune_report
from kbd.plan import spec
from kbd.plan.invocation import Invocation
from kbd.plan.paths import check_output
from kbd.results import tune_summary
from kbd.results.store import Store, Sweep
from kbd.results.tuning import TuningStore
from kbd.shared.errors import InputError
from kbd.shared.outcomes import format_counts
from kbd.views import reports


def show_results(invocation: Invocation) -> int:
    """`kbd results [ID]`: a stored sweep's records, as lines, JSON Lines, JUnit or HTML (with
    a tuning session's section)."""
    check_output(invocation.junit, "--junit")
    check_output(invocation.html, "--html")
    if invocation.tune_session is not None and not invocation.html:
        raise InputError("--tune chooses the tuning session of the HTML page: add --html FILE")
    store = Store.existing(invocation.store_path)
    tuning = _tuning_session(store, invocation.tune_session) if invocation.html else None
    only_tuning = tuning is not None and invocation.id is None and not store.sweeps()
    if only_tuning and not (invocation.junit or invocation.json):  # those need a sweep
        session = tuning.session
        title = f"kbd tune: {store.path}"
        _write(Path(invocation.html), report.render(None, title, tuning))
        print(f"tuning session {session.id} ({session.status}): {invocation.html}")
        return 0
    sweep = store.sweep(invocation.id)
    records = store.records(sweep.id)
    if invocation.junit:
        reports.write_junit(records, Path(invocation.junit))
    if invocation.html:
        page = report.render(records, f"kbd sweep {sweep.id}: {sweep.command}", tuning)
        _write(Path(invocation.html), page)
    if invocation.json:
        for record in records:
            print(reports.json_line(record))
        return 0
    print(f"sweep {sweep.id} ({sweep.status}, {_when(sweep.created)}): {sweep.command}")
    for record in records:
        print(reports.shown(record))
    missing = _expected_runs(sweep) - len(records)
    print()
    print(reports.summary(records))
    if missing:
        print(f"{missing} runs have no result yet: `kbd sweep --resume {sweep.id}`")
    return 0


def _tuning_session(store: Store, tune_id: int | None) -> tune_report.TuningSession | None:
    """The tuning session the page shows: `tune_id`, or the latest; None when there is none."""
    tuning = TuningStore(store, create=False)
    sessions = tuning.sessions()
    if tune_id is None:
        if not sessions:
            return None
        session = sessions[-1]
    else:
        session = next((s for s in sessions if s.id == tune_id), None)
        if session is None:
            raise InputError(f"{store.path}: no tuning session {tune_id}")
    return tune_report.TuningSession(session, tune_summary.session(tuning, session.id))


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:  # checked at the start (check_output); this is a late failure
        raise InputError(f"{path}: cannot write the HTML page ({exc.strerror or exc})") from None


def list_sweeps(invocation: Invocation) -> int:
    """`kbd sweeps`: one line per stored sweep."""
    store = Store.existing(invocation.store_path)
    sweeps = store.sweeps()
    if not sweeps:
        print("no sweeps recorded")
        return 0
    print(f"{'id':>4}  {'started':<19}  {'status':<11}  {'done':>9}  outcomes")
    for sweep in sweeps:
        records = store.records(sweep.id)
        tally = Counter(r.outcome for r in records)
        outcomes = format_counts(tally)
        done = f"{len(records)}/{_expected_runs(sweep)}"
        print(
            f"{sweep.id:>4}  {_when(sweep.created):<19}  {sweep.status:<11}  {done:>9}  {outcomes}"
        )
    return 0


def _expected_runs(sweep: Sweep) -> int:
    """Records the sweep makes when complete: one per kernel and mode."""
    options = spec.decode(sweep.options, f"sweep {sweep.id}")
    return len(sweep.kernels) * len(options.modes)


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))
