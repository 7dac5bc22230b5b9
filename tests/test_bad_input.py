"""Bad input to every subcommand: one line on stderr, exit status 2, nothing recorded is lost.

Each case runs `python -m kbd` as a user would, in a fresh folder, and must fail while checking
its input: before any worker template starts (no `template.log` appears) and before anything is
stored (a results database there keeps exactly the sweep it had). kbd's own errors are one line,
`kbd: error: ...`, naming the file, option, sweep or kernel; the command line's are one
`kbd CMD: error: ... (see `kbd CMD --help`)` line. Never a traceback.

Paths that cannot be written lie under a regular file (`{tmp}/afile/...`): tests may run as
root, for whom a path such as /nonexistent/dir/x.xml is simply created.
"""

from __future__ import annotations

import os
import re
import shlex
import sqlite3
from pathlib import Path

import pytest

from kbd.plan import spec
from kbd.results.record import Record
from kbd.results.store import Store
from kbd.shared.errors import InputError
from kbd.views import reports
from tests.conftest import FIXTURE_KB, FIXTURE_LEVELS, kbd

FX = "--kernelbench {kb} --levels {levels}"  # the fixture kernels and their levels file
K = "level1/1_"  # one fixture kernel: a case that got past its checks would run only this one
# levels files and logs go to the test's folder, never into the repository's levels/
GEN = "levels generate --levels-dir {tmp}/levels --log-dir {tmp}/logs --kernelbench {kb}"
IDLE = "--idle-timeout 2"  # a daemon started by mistake would not outlive the test by long
ARGPARSE_ERROR = re.compile(r"kbd(?: [a-z-]+)*: error: \S")


def with_store(tmp: Path) -> None:
    """.kbd/results.db holding sweep 1: one finished kernel."""
    store = Store(tmp / ".kbd" / "results.db")
    sweep_id = store.create_sweep("kbd sweep", spec.encode(spec.SweepSpec()), ["level1/1_K"], "h")
    store.add_attempt(sweep_id, "h", Record(kernel="level1/1_K", outcome="pass", phase="check"))
    store.set_status(sweep_id, "done")
    store.close()


def with_kernelbench_sweep(tmp: Path) -> None:
    """.kbd/results.db holding sweep 1, run at KernelBench's own shapes, one kernel failing;
    {tmp}/levels.yaml, a copy of the fixture levels file, for update-xfail to leave alone."""
    store = Store(tmp / ".kbd" / "results.db")
    own = spec.encode(spec.SweepSpec(shapes="kernelbench"))
    sweep_id = store.create_sweep("kbd sweep --shapes kernelbench", own, ["level1/1_matmul"], "h")
    failed = Record(kernel="level1/1_matmul", outcome="mismatch", phase="check", message="m")
    store.add_attempt(sweep_id, "h", failed)
    store.set_status(sweep_id, "done")
    store.close()
    (tmp / "levels.yaml").write_text(FIXTURE_LEVELS.read_text())


# (test id, command line, what its error line must name[, setup]); in the command line FX, K,
# GEN and IDLE are replaced by the strings above, then {tmp} (the test's folder, also the
# working directory), {kb} and {levels} (the fixture KernelBench and levels file).
CASES = [
    # kbd run
    ("run-junit-under-a-file", "run FX --junit {tmp}/afile/x.xml K", "{tmp}/afile"),
    ("run-junit-is-a-folder", "run FX --junit {tmp} K", "--junit {tmp}"),
    ("run-log-dir-under-a-file", "run FX --log-dir {tmp}/afile/logs K", "--log-dir"),
    ("run-log-dir-is-a-file", "run FX --log-dir {tmp}/afile K", "--log-dir {tmp}/afile"),
    ("run-kernelbench-missing", "run FX --kernelbench {tmp}/missing K", "{tmp}/missing"),
    ("run-baseline-without-benchmark", "run FX --baseline inductor K", "--baseline"),
    ("run-baseline-unknown", "run FX --benchmark --baseline tvm K", "--baseline"),
    ("run-dtype-unknown", "run FX --dtype f8 K", "--dtype"),
    ("run-levels-missing", "run --kernelbench {kb} --levels {tmp}/no.yaml", "{tmp}/no.yaml"),
    ("run-levels-malformed", "run --kernelbench {kb} --levels {tmp}/bad.yaml", "{tmp}/bad.yaml"),
    ("run-levels-unknown-field", "run --kernelbench {kb} --levels {tmp}/colour.yaml", "'colour'"),
    ("run-unknown-kernel", "run FX level1/999_", "level1/999_"),
    ("run-one-unknown-kernel-of-two", "run FX K nowhere/", "nowhere/"),
    ("run-jobs-0", "run FX -j 0 K", "--jobs"),
    ("run-timeout-negative", "run FX --timeout -1 K", "--timeout"),
    ("run-timeout-nan", "run FX --timeout nan K", "--timeout"),
    ("run-mem-limit-lots", "run FX --mem-limit lots K", "--mem-limit"),
    ("run-mem-limit-too-small", "run FX --mem-limit 1KiB K", "--mem-limit"),
    ("run-mem-budget-lots", "run FX --mem-budget lots K", "--mem-budget"),
    ("run-tolerance-0", "run FX --tolerance 0 K", "--tolerance"),
    ("run-tolerance-nan", "run FX --tolerance nan K", "--tolerance"),
    ("run-max-tolerance-inf", "run FX --max-tolerance inf K", "--max-tolerance"),
    ("run-seed-negative", "run FX --seed -1 K", "--seed"),
    ("run-seed-not-a-number", "run FX --seed x K", "--seed"),
    ("run-opt-level-9", "run FX -O 9 K", "-O"),
    ("run-pipeline-missing", "run FX --pipeline {tmp}/no.yaml K", "{tmp}/no.yaml"),
    ("run-print-to-alone", "run FX --print-to {tmp}/ir K", "--print-to"),
    ("run-sandbox-contradiction", "run FX --require-sandbox --no-sandbox K", "--no-sandbox"),
    ("run-target-bad-name", "run FX --target 'x 86' K", "'x 86'"),
    ("run-bench-samples-0", "run FX --benchmark --bench-samples 0 K", "--bench-samples"),
    ("run-bench-time-nan", "run FX --benchmark --bench-time nan K", "--bench-time"),
    ("run-mode-unknown", "run FX --mode eager K", "--mode"),
    # kbd sweep: nothing is stored, and a store keeps what it had
    ("sweep-shard-5-of-4", "sweep FX --shard 5/4 K", "--shard '5/4'"),
    ("sweep-shard-not-i-of-n", "sweep FX --shard x K", "--shard 'x'"),
    ("sweep-resume-unknown", "sweep FX --resume 999", "999", with_store),
    ("sweep-resume-not-a-number", "sweep FX --resume abc", "--resume 'abc'", with_store),
    ("sweep-resume-empty-store", "sweep FX --resume", "no sweep recorded"),
    ("sweep-unknown-kernel", "sweep FX level1/999_", "level1/999_", with_store),
    ("sweep-levels-malformed", "sweep FX --levels {tmp}/bad.yaml K", "bad.yaml", with_store),
    ("sweep-junit-under-a-file", "sweep FX --junit {tmp}/afile/x.xml K", "--junit", with_store),
    ("sweep-log-dir-under-a-file", "sweep FX --log-dir {tmp}/afile/l K", "--log-dir", with_store),
    ("sweep-db-under-a-file", "sweep FX --db {tmp}/afile/results.db K", "{tmp}/afile"),
    ("sweep-db-not-a-database", "sweep FX --db {tmp}/notadb.db K", "{tmp}/notadb.db"),
    ("sweep-db-is-a-folder", "sweep FX --db {tmp} K", "{tmp}: is a folder"),
    ("sweep-detach-without-daemon", "sweep FX --detach --no-daemon K", "--detach"),
    ("sweep-cluster-blank", "sweep FX --cluster ' ' K", "--cluster"),
    # kbd tune
    ("tune-budget-0", "tune FX --budget 0 K", "--budget 0"),
    ("tune-json", "tune FX --json K", "--json: not an option of kbd tune"),
    ("tune-mode-both", "tune FX --mode both K", "--mode both"),
    ("tune-two-pipelines", "tune FX --pipeline a.yaml --pipeline b.yaml K", "--pipeline"),
    ("tune-pipeline-missing", "tune FX --pipeline {tmp}/no.yaml K", "{tmp}/no.yaml"),
    ("tune-resume-empty-store", "tune FX --resume", "no tuning session"),
    ("tune-import-missing", "tune --import {tmp}/no.jsonl", "{tmp}/no.jsonl"),
    ("tune-export-under-a-file", "tune --export {tmp}/afile/x.jsonl", "--export"),
    ("tune-no-tunable-schedule", "tune FX level1/2_", "nothing to tune"),
    ("tune-detach-without-daemon", "tune FX --detach --no-daemon K", "--detach"),
    ("tune-detach-on-a-cluster", "tune FX --detach --cluster 127.0.0.1:1 K", "--detach"),
    ("tune-cluster-blank", "tune FX --cluster ' ' K", "--cluster"),
    ("tune-resume-unknown", "tune --resume 999", "no tuning session 999", with_store),
    # kbd attach and cancel (neither starts a daemon)
    ("attach-unknown-sweep", "attach 999", "999", with_store),
    ("attach-without-store", "attach 999", "results.db"),
    ("attach-db-not-a-database", "attach 1 --db {tmp}/notadb.db", "{tmp}/notadb.db"),
    ("attach-id-not-a-number", "attach one", "id"),
    ("cancel-unknown-sweep", "cancel 999", "999", with_store),
    ("cancel-db-under-a-file", "cancel 999 --db {tmp}/afile/results.db", "{tmp}/afile"),
    ("cancel-without-id", "cancel", "id"),
    ("attach-unknown-tune", "attach --tune 999", "no tuning session 999", with_store),
    ("attach-tune-without-store", "attach --tune 9", "no results database, so no tuning session"),
    ("cancel-unknown-tune", "cancel --tune 999", "no tuning session 999", with_store),
    # kbd results, compare, sweeps
    ("results-unknown-sweep", "results 999", "999", with_store),
    ("results-without-store", "results", "results.db"),
    ("results-html-under-a-file", "results --html {tmp}/afile/x.html", "--html", with_store),
    ("results-html-is-a-folder", "results --html {tmp}", "--html {tmp}", with_store),
    ("results-tune-without-html", "results --tune 1", "--tune", with_store),
    (
        "results-tune-unknown",
        "results --html {tmp}/x.html --tune 9",
        "tuning session 9",
        with_store,
    ),
    ("results-junit-under-a-file", "results --junit {tmp}/afile/x.xml", "--junit", with_store),
    ("results-db-not-a-database", "results --db {tmp}/notadb.db", "{tmp}/notadb.db"),
    ("results-db-under-a-file", "results --db {tmp}/afile/r.db", "{tmp}/afile/r.db"),
    ("results-id-not-a-number", "results latest", "id"),
    ("compare-unknown-b", "compare 1 999", "999", with_store),
    ("compare-unknown-a", "compare 999 1", "999", with_store),
    ("compare-threshold-negative", "compare 1 1 --threshold -1", "--threshold", with_store),
    ("compare-one-id", "compare 1", "B"),
    ("sweeps-db-not-a-database", "sweeps --db {tmp}/notadb.db", "{tmp}/notadb.db"),
    ("sweeps-db-is-a-folder", "sweeps --db {tmp}", "{tmp}"),
    ("sweeps-without-store", "sweeps --db {tmp}/missing.db", "{tmp}/missing.db"),
    # kbd replay, doctor
    ("replay-bundle-missing", "replay {tmp}/missing", "{tmp}/missing"),
    ("replay-bundle-is-a-file", "replay {tmp}/afile", "{tmp}/afile"),
    ("replay-folder-without-manifest", "replay {tmp}", "manifest.json"),
    ("replay-timeout-negative", "replay {tmp}/missing --timeout -1", "--timeout"),
    ("replay-mem-limit-lots", "replay {tmp}/missing --mem-limit lots", "--mem-limit"),
    ("replay-log-dir-under-a-file", "replay {tmp} --log-dir {tmp}/afile/logs", "--log-dir"),
    ("replay-without-bundle", "replay", "BUNDLE"),
    ("doctor-unknown-option", "doctor --bogus", "--bogus"),
    # kbd daemon
    ("daemon-without-action", "daemon", "ACTION"),
    ("daemon-run-idle-timeout-negative", "daemon run --idle-timeout -1", "--idle-timeout"),
    ("daemon-start-idle-timeout-nan", "daemon start --idle-timeout nan", "--idle-timeout"),
    ("daemon-run-mem-budget-lots", "daemon run IDLE --mem-budget lots", "--mem-budget"),
    ("daemon-run-log-under-a-file", "daemon run IDLE --log {tmp}/afile/daemon.log", "--log"),
    ("daemon-run-db-not-a-database", "daemon run IDLE --db {tmp}/notadb.db", "notadb.db"),
    ("daemon-start-db-not-a-database", "daemon start IDLE --db {tmp}/notadb.db", "notadb.db"),
    ("daemon-start-db-under-a-file", "daemon start IDLE --db {tmp}/afile/r.db", "{tmp}/afile"),
    ("daemon-stop-unknown-option", "daemon stop --later", "--later"),
    ("daemon-status-unknown-option", "daemon status --yaml", "--yaml"),
    # kbd levels
    ("check-levels-dir-missing", "levels check --levels-dir {tmp}/missing", "{tmp}/missing"),
    ("check-levels-dir-is-a-file", "levels check --levels-dir {tmp}/afile", "{tmp}/afile"),
    ("check-without-levels", "levels check --levels-dir {tmp}/empty", "no levels files"),
    ("check-kernelbench-missing", "levels check --kernelbench {tmp}/missing", "missing"),
    ("generate-no-problems", "GEN --kernelbench {tmp}", "no KernelBench problem under"),
    ("generate-kernelbench-missing", "GEN --kernelbench {tmp}/missing", "{tmp}/missing"),
    ("generate-only-nothing", "GEN --only level1/999_", "level1/999_"),
    ("generate-jobs-0", "GEN -j 0", "--jobs"),
    ("generate-timeout-negative", "GEN --only K --timeout -1", "--timeout"),
    ("generate-mem-limit-lots", "GEN --only K --mem-limit lots", "--mem-limit"),
    ("generate-levels-dir-is-a-file", "GEN --only K --levels-dir {tmp}/afile", "--levels-dir"),
    ("generate-log-dir-under-a-file", "GEN --only K --log-dir {tmp}/afile/l", "--log-dir"),
    ("generate-shapes-unknown", "GEN --shapes huge", "--shapes"),
    # KernelBench's own shapes need no levels file: there is nothing to generate at them
    ("generate-shapes-kernelbench", "GEN --shapes kernelbench", "--shapes"),
    ("run-shapes-unknown", "run FX --shapes huge K", "--shapes"),
    # tuned configurations are keyed by a levels entry's input shapes
    ("tune-shapes-kernelbench", "tune FX --shapes kernelbench K", "--shapes kernelbench"),
    ("update-xfail-unknown-sweep", "levels update-xfail 999", "999", with_store),
    ("update-xfail-without-store", "levels update-xfail", "results.db"),
    (
        "update-xfail-bad-levels",
        "levels update-xfail --levels {tmp}/bad.yaml",
        "bad.yaml",
        with_store,
    ),
    ("update-xfail-missing", "levels update-xfail --levels {tmp}/no.yaml", "no.yaml", with_store),
    ("update-xfail-db-not-a-database", "levels update-xfail --db {tmp}/notadb.db", "notadb"),
    (
        "update-xfail-from-kernelbench-shapes",
        "levels update-xfail --levels {tmp}/levels.yaml",
        "sweep 1 ran at KernelBench's own shapes (--shapes kernelbench)",
        with_kernelbench_sweep,
    ),
    ("levels-unknown-tool", "levels bogus", "bogus"),
]

MACROS = {"FX": FX, "K": K, "GEN": GEN, "IDLE": IDLE}
PARAMS = [pytest.param(cmd, names, *(setup or [None]), id=id) for id, cmd, names, *setup in CASES]


def _stored(db: Path) -> list[tuple] | None:
    """Every sweep row and attempt row of a results database (None: there is none)."""
    if not db.exists():
        return None
    with sqlite3.connect(db) as connection:
        sweeps = connection.execute("SELECT * FROM sweeps ORDER BY id").fetchall()
        attempts = connection.execute("SELECT * FROM attempts ORDER BY id").fetchall()
    return sweeps + attempts


def _error_line(stderr: str) -> str:
    """The one line of stderr: kbd's own error, or the command line's (`kbd CMD: error: ...`,
    pointing to --help instead of printing the usage)."""
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert ARGPARSE_ERROR.match(lines[0]), stderr
    assert lines[0].split(": error:", 1)[1].strip(), stderr
    return lines[0]


def _argv(command: str, places: dict[str, Path]) -> list[str]:
    argv = []
    for word in shlex.split(command):
        argv += MACROS[word].split() if word in MACROS else [word]
    return [word.format(**places) for word in argv]


@pytest.mark.parametrize(("command", "names", "setup"), PARAMS)
def test_bad_input_is_one_line_and_status_2(tmp_path, command, names, setup):
    (tmp_path / "afile").write_text("a regular file\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notadb.db").write_text("not a database\n" * 100)
    (tmp_path / "bad.yaml").write_text("- kernel: [level1/1_matmul.py\n")
    (tmp_path / "colour.yaml").write_text("- kernel: level1/1_matmul.py\n  colour: red\n")
    if setup is not None:
        setup(tmp_path)
    db = tmp_path / ".kbd" / "results.db"
    before = _stored(db)
    places = {"tmp": tmp_path, "kb": FIXTURE_KB, "levels": FIXTURE_LEVELS}
    env = {
        **os.environ,
        "XDG_RUNTIME_DIR": str(tmp_path),  # daemon state here: never a daemon of the user's
        "KBD_KERNELBENCH": str(tmp_path / "no-kernelbench"),
    }
    result = kbd(*_argv(command, places), cwd=tmp_path, env=env, timeout=60)

    assert result.returncode == 2, (result.returncode, result.stderr, result.stdout)
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stdout == ""
    assert names.format(**places) in _error_line(result.stderr)
    assert not list(tmp_path.rglob("template.log")), "a worker template was started"
    assert _stored(db) in (before, [])  # what was stored stays; a new store holds nothing


def test_a_junit_file_that_fails_late_is_an_input_error_naming_it(tmp_path):
    """Checked at the start, a JUnit path can still fail when written at the end of a sweep
    (whose records are stored by then): one line naming it, not a traceback."""
    (tmp_path / "afile").write_text("")
    path = tmp_path / "afile" / "x.xml"
    with pytest.raises(InputError, match=f"{path}: cannot write JUnit XML"):
        reports.write_junit([Record(kernel="level1/1_K", outcome="pass", phase="check")], path)
