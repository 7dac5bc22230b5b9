"""The `kbd` command line. Supervisor side: this module and everything it imports stay torch-free.

Exit status: 0 when every kernel passed or failed as expected, 1 when any kernel failed
unexpectedly (or an expected failure passed), 2 for usage and input errors.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kbd import __version__
from kbd.levels import cli as levels_cli
from kbd.plan import spec, target
from kbd.plan.invocation import (
    COMPARE_THRESHOLD,
    DAEMON_IDLE_TIMEOUT_S,
    DEFAULT_DB,
    Invocation,
)
from kbd.plan.spec import SweepSpec, TuneDefaults
from kbd.shared.errors import InputError
from kbd.shared.protocol import BenchOptions

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# Option defaults come from the types they fill; help strings show them with %(default)s.
SPEC = SweepSpec()
BENCH = BenchOptions()
TUNE = TuneDefaults()
BASELINES = ("eager", "inductor")

DESCRIPTION = """\
Run KernelBench kernels through torch-mlir and an MLIR pipeline, JIT them with the MLIR
ExecutionEngine, and check them against PyTorch eager. Every kernel runs in its own sandboxed
worker process (memory cap, pinned cores, timeout), forked from a warm template.
"""

EPILOG = """\
examples:
  kbd run --levels levels/ci.yaml level1/2_ level3/1_
  kbd sweep --smoke-test --levels levels/ci.yaml
  kbd sweep --smoke-test level1/ level2/ -j 2 --junit results.xml
  kbd run --mode both --levels levels/ci.yaml   # import and torch.compile side by side
  kbd sweep --resume          # finish the latest sweep after an interruption
  kbd results --json          # the latest sweep's records as JSON Lines
  kbd run --levels levels/ci.yaml level1/2_ --print-mlir-after-all --dump-assembly
  kbd replay .kbd/logs/run-*/level1__2_*.bundle   # rerun a failing pipeline stage
  kbd doctor --strict         # is every limit and containment enforced on this machine?
  kbd levels check            # validate every levels file
  kbd tune --shapes bench level1/1_ --budget 40   # tune a kernel's schedule parameters
"""


def _common(parser: argparse.ArgumentParser) -> None:
    sel = parser.add_argument_group("kernel selection")
    sel.add_argument(
        "kernels",
        nargs="*",
        metavar="PREFIX",
        help="kernels whose path starts with PREFIX, e.g. level2/11_ or level1/ (default: all)",
    )
    sel.add_argument(
        "--levels",
        action="append",
        metavar="FILE",
        default=[],
        help="levels file to read (repeatable; default: levels/level*.yaml, the whole catalog)",
    )
    sel.add_argument(
        "--shapes",
        choices=("smoke", "bench", "kernelbench"),
        default=SPEC.shapes,
        help="which shapes kernels run at: smoke (the default levels files are "
        "levels/level*.yaml, quick to run) or bench (levels/bench/level*.yaml, big enough to "
        "time), each entry's input_shapes and init_args; or kernelbench: each kernel's own "
        "KernelBench inputs and init args, its problem's get_inputs() and get_init_inputs() as "
        "they are (shapes, dtypes and values under --seed), with the kernels still selected "
        "from levels/level*.yaml or --levels. Each such kernel is first sized on torch's meta "
        "device, nothing allocated, and skipped when its inputs would not fit --mem-limit or "
        "--mem-budget; GFLOPS then come from kbd's FLOP count at those shapes "
        "(default %(default)s)",
    )
    sel.add_argument(
        "--kernelbench",
        metavar="DIR",
        help="KernelBench folder holding level1/, level2/, ... (default: $KBD_KERNELBENCH, "
        "then third_party/KernelBench/KernelBench)",
    )
    comp = parser.add_argument_group("compilation and checking")
    comp.add_argument(
        "--pipeline",
        action="append",
        metavar="FILE|PASS",
        default=[],
        help="pipeline stage(s) for every kernel, replacing the levels entries' pipelines: a "
        "descriptor YAML, a .mlir transform script or a pass name (repeatable, applied in order)",
    )
    comp.add_argument(
        "--target",
        metavar="ARCH",
        help="architecture whose family schedules the finder picks, schedules/ARCH/... "
        "(default: this machine's, e.g. x86_64)",
    )
    comp.add_argument(
        "--feature",
        action="append",
        metavar="NAME",
        help="CPU feature whose schedules the finder tries, schedules/ARCH/NAME/FAMILY/DTYPE.yaml, "
        "in the order given (repeatable; default: this machine's features ranked widest and "
        "newest first: " + ", ".join(target.RANKING) + "; then "
        "schedules/ARCH/FAMILY/DTYPE.yaml). Code "
        "for features the CPU lacks dies with SIGILL",
    )
    comp.add_argument(
        "--schedules",
        choices=("family", "scalar"),
        help="family: each kernel's family schedule (its levels entry's pipeline or family, "
        "through the finder; the scalar pipeline when there is none for this CPU, and the "
        "record says so); scalar: the default scalar pipeline for every kernel (default: "
        "family, scalar with --smoke-test). A failing family schedule is that kernel's result",
    )
    comp.add_argument(
        "--untuned",
        action="store_true",
        help="run family schedules with their default parameters, not the configuration "
        "`kbd tune` adopted for the kernel (applied on an exact key match; the record's "
        "pipeline names it, ending in '(tuned)')",
    )
    comp.add_argument(
        "--mode",
        choices=("import", "compile", "both"),
        default=SPEC.mode,
        help="import: torch.export of the whole forward into one MLIR function; "
        "compile: torch.compile with kbd as the Dynamo backend, each captured subgraph through "
        "MLIR and the rest in eager (coverage is recorded); both: each kernel both ways "
        "(default %(default)s)",
    )
    comp.add_argument(
        "--dtype",
        choices=spec.DTYPES,
        help="element type of every kernel: its model, its floating-point inputs and outputs, "
        "and the eager reference, replacing the levels entries' dtype (default: each entry's, "
        "f32 unless it names one). Low-precision types are checked with at least "
        + ", ".join(f"{t} {f:g}" for t, f in spec.TOLERANCE_FLOOR.items())
        + " as tolerance; a kernel eager cannot run in the type is skipped (see README)",
    )
    comp.add_argument(
        "--seed", type=int, default=SPEC.seed, help="seed for torch and numpy (default %(default)s)"
    )
    comp.add_argument(
        "--tolerance",
        type=float,
        default=SPEC.tolerance,
        help="rtol = atol for allclose against eager (default %(default)s)",
    )
    comp.add_argument(
        "--max-tolerance",
        type=float,
        default=SPEC.max_tolerance,
        help="largest tolerance tried when reporting a mismatch (default %(default)s)",
    )
    comp.add_argument(
        "-O",
        dest="opt_level",
        type=int,
        choices=range(4),
        help=f"LLVM optimization level of the JIT (default {spec.DEFAULT_OPT_LEVEL} with "
        f"--benchmark, else {spec.CHECK_OPT_LEVEL}; {spec.SMOKE_OPT_LEVEL} with --smoke-test, "
        "which checks correctness and need not pay for optimised code, except "
        f"{spec.DEFAULT_OPT_LEVEL} for kernels of at least {spec.SMOKE_HEAVY_GFLOPS:g} GFLOP "
        f"per forward, whose loops run minutes at {spec.SMOKE_OPT_LEVEL}: see README)",
    )
    comp.add_argument(
        "--no-import-cache",
        action="store_true",
        help="import every kernel afresh; neither read nor write the import cache "
        "(.kbd/import-cache, imported MLIR by content address)",
    )
    comp.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="lower and JIT-compile every kernel afresh; neither read nor write the compile "
        "cache (.kbd/compile-cache, compiled kernels as shared libraries by content address) "
        "nor keep Inductor's caches for --baseline inductor (.kbd/inductor-cache)",
    )
    see = parser.add_argument_group(
        "seeing inside the pipeline",
        "IR goes into each kernel's log (.kbd/logs/<run>/<kernel>.log) unless --print-to names "
        "a file or folder; object and assembly files go next to the log (<kernel>.o, "
        "<kernel>.s). A kernel that fails in a pipeline stage gets a reproducer bundle next to "
        "its log (<kernel>.bundle/); `kbd replay BUNDLE` reruns that stage.",
    )
    see.add_argument(
        "--print-mlir-after-all",
        action="store_true",
        help="print the module after every pass and every transform script",
    )
    see.add_argument(
        "--print-original-module",
        action="store_true",
        help="print the module given to the pipeline (as imported)",
    )
    see.add_argument(
        "--print-optimized-module",
        action="store_true",
        help="print the module the pipeline produced (what the JIT compiles)",
    )
    see.add_argument(
        "--print-to",
        metavar="PATH",
        help="write printed IR to PATH instead of the log: a file when one kernel runs, else a "
        "folder (also when PATH ends with / or is a folder) holding <kernel>.mlir per kernel",
    )
    see.add_argument(
        "--object-file",
        action="store_true",
        help="write the JIT's machine code as an ELF object, <kernel>.o next to the log",
    )
    see.add_argument(
        "--dump-assembly",
        action="store_true",
        help="also disassemble it into <kernel>.s next to the log (objdump -d -r, else "
        "llvm-objdump)",
    )
    bench = parser.add_argument_group("benchmarking")
    bench.add_argument(
        "--benchmark",
        action="store_true",
        help="after a kernel passes, time compiled code against eager in the same worker, "
        "alternating batches of calls (see README, Benchmarking)",
    )
    bench.add_argument(
        "--bench-time",
        type=float,
        default=BENCH.min_time_s,
        metavar="SECONDS",
        help="minimum measured time per side and kernel (default %(default)s)",
    )
    bench.add_argument(
        "--bench-samples",
        type=int,
        default=BENCH.min_samples,
        metavar="N",
        help="minimum samples per side and kernel (default %(default)s)",
    )
    bench.add_argument(
        "--bench-budget",
        type=float,
        default=BENCH.budget_s,
        metavar="SECONDS",
        help="stop sampling a kernel after this long, reporting the samples taken "
        "(default %(default)s)",
    )
    bench.add_argument(
        "--bench-processes",
        type=int,
        default=BENCH.processes,
        metavar="N",
        help="time each kernel in N worker processes, one after another, sharing out the time, "
        "samples and budget above; the speedup's interval then includes how much processes "
        "differ, which one process cannot see (default %(default)s; 1 times in the checking "
        "worker only)",
    )
    bench.add_argument(
        "--bench-concurrently",
        action="store_true",
        help="time kernels while other workers run (shorter sweeps with -j above 1, noisier "
        "figures); by default each kernel is timed alone, every other worker paused meanwhile",
    )
    bench.add_argument(
        "--baseline",
        action="append",
        choices=BASELINES,
        metavar="NAME",
        help="what compiled code is timed against, besides eager (always): inductor, "
        "torch.compile(model) with its default backend, compiled in the worker before timing "
        "(its compile time is reported apart) and sampled in turn with eager and kbd's code "
        "(repeatable; needs --benchmark and a C++ compiler; see README, Benchmarking)",
    )
    bench.add_argument(
        "--inductor-timeout",
        type=float,
        metavar="SECONDS",
        help="stop compiling the Inductor baseline after this long: the kernel is then timed "
        "against eager alone and its record says why, instead of the baseline's compile making "
        "the kernel time out (needs --baseline inductor; default: half of --timeout)",
    )
    lim = parser.add_argument_group("workers and limits")
    lim.add_argument(
        "-j",
        "--jobs",
        type=int,
        metavar="N",
        help="parallel workers, each pinned to its own cores (default: usable cores)",
    )
    lim.add_argument(
        "--timeout",
        type=float,
        default=SPEC.timeout,
        metavar="SECONDS",
        help="per-kernel wall-time limit; the worker's process group is killed "
        "(default %(default)s)",
    )
    lim.add_argument(
        "--mem-limit",
        metavar="SIZE",
        help="per-worker memory cap, e.g. 2GiB (RLIMIT_DATA plus an RSS watch; default "
        f"{spec.DEFAULT_MEM_LIMIT}, {spec.DEFAULT_BENCH_MEM_LIMIT} with --benchmark, whose "
        "worker also holds each timed side's outputs; 'none' to disable)",
    )
    lim.add_argument(
        "--mem-budget",
        metavar="SIZE",
        help="memory all running workers may use together; kernels are admitted by "
        "their estimated need (default: 75%% of available memory)",
    )
    box = parser.add_argument_group("containment (see `kbd doctor`)")
    box.add_argument(
        "--require-sandbox",
        action="store_true",
        help="make a kernel an error when any containment mechanism (filesystem, network) "
        "cannot be enforced on this machine, instead of running it with a note (for CI)",
    )
    box.add_argument(
        "--no-sandbox",
        action="store_true",
        help="run kernels without filesystem and network containment (debugging only; "
        "records say so)",
    )
    run_in = parser.add_argument_group("daemon")
    run_in.add_argument(
        "--daemon",
        dest="daemon",
        action="store_const",
        const="yes",
        default="auto",
        help="run in the daemon of this store, starting one if none runs (default: use one "
        "when it runs, else run in this process)",
    )
    run_in.add_argument(
        "--no-daemon",
        dest="daemon",
        action="store_const",
        const="no",
        help="run in this process even when a daemon runs",
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--json", action="store_true", help="one JSON object per kernel on stdout (JSON Lines)"
    )
    out.add_argument("--junit", metavar="FILE", help="also write JUnit XML to FILE")
    out.add_argument(
        "--log-dir", metavar="DIR", help="where per-kernel logs go (default .kbd/logs/<run>)"
    )


def _db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        metavar="PATH",
        default=DEFAULT_DB,
        help="results database (default %(default)s)",
    )


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line (the usage itself is what --help is for)."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="kbd",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kbd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser(
        "run",
        help="run kernels now and print one line per kernel",
        description="Run the selected kernels, each in a fresh sandboxed worker, and print a "
        "line per kernel (outcome, phase, time, peak memory, tolerance). Nothing is stored.",
    )
    _common(run)
    # what only a sweep can say: a run's namespace has the same fields, at their defaults
    run.set_defaults(smoke_test=False, resume=None, cluster=None, shard=None, detach=False)

    sweep = sub.add_parser(
        "sweep",
        help="run many kernels in parallel, store results, resume after interruption",
        description="Run the selected kernels on all cores with memory admission, store every "
        "result in the results database as it ends, and show live progress on a terminal. "
        "An interrupted sweep continues with --resume.",
    )
    _common(sweep)
    sweep.add_argument(
        "--smoke-test",
        action="store_true",
        help="check correctness quickly: every selected kernel with the default scalar "
        "pipeline (unless --schedules family) and the JIT at -O0 (unless -O)",
    )
    sweep.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        metavar="ID",
        help="re-run only the kernels of sweep ID (default: latest) that have no "
        "result, with that sweep's options",
    )
    sweep.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="run on a Ray cluster (needs kbd[ray]): one kbd agent per node, results stored "
        "here; ADDRESS is HOST:PORT of the head, 'auto' for the cluster this machine is part "
        "of, or 'local' (with --resume: finish a cluster sweep on this machine)",
    )
    sweep.add_argument(
        "--shard",
        metavar="I/N",
        help="run only shard I of N (1-based; stable when kernels are added)",
    )
    sweep.add_argument(
        "--detach",
        action="store_true",
        help="run in the daemon (started if needed), print the sweep id and return; "
        "`kbd attach ID` follows it",
    )
    _db_option(sweep)

    tune = sub.add_parser(
        "tune",
        help="search schedule parameters per kernel and adopt confirmed winners",
        description="For each selected kernel whose family schedule declares a Tune space "
        "(or the descriptor --pipeline names), measure configurations within --budget: the "
        "whole space when it fits, else a search seeded with the default. Each candidate is a "
        "sandboxed job (-j wide compile and check, timed alone against eager); every outcome "
        "is stored and a failing configuration is never run again. The best is then timed "
        "against the default with the full --benchmark protocol in fresh processes and adopted "
        "only when its interval lies above the default's. `kbd run` and `kbd sweep` then apply "
        "adopted configurations on an exact key match (kernel shapes, dtype, schedule text, "
        "CPU, threads, torch-mlir); --untuned turns that off.",
    )
    _common(tune)
    tune.set_defaults(smoke_test=False, shard=None, benchmark=True)
    tune.add_argument(
        "--budget",
        type=int,
        default=TUNE.budget,
        metavar="N",
        help="configurations measured per kernel (default %(default)s)",
    )
    tune.add_argument(
        "--search-time",
        type=float,
        default=TUNE.search_time_s,
        metavar="SECONDS",
        help="minimum time per side of each candidate while searching (default %(default)s); "
        "confirmation uses --bench-time and --bench-processes",
    )
    tune.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        metavar="ID",
        help="continue tuning session ID (default: the latest) with its options: no "
        "configuration it measured is measured again",
    )
    tune.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="tune on a Ray cluster (needs kbd[ray]), as `kbd sweep --cluster`: each kernel's "
        "whole tuning task on one node, kernels on several nodes at once, everything stored "
        "here; with --resume, 'local' finishes a cluster tune on this machine",
    )
    tune.add_argument(
        "--detach",
        action="store_true",
        help="tune in the daemon (started if needed), print the session id and return; "
        "`kbd attach --tune ID` follows it",
    )
    tune.add_argument(
        "--export",
        metavar="FILE",
        help="write every adopted configuration of the results database as JSON Lines and exit",
    )
    tune.add_argument(
        "--import",
        dest="import_file",
        metavar="FILE",
        help="add the configurations of a JSON Lines file (--export's) to the database and exit",
    )
    tune.add_argument(
        "--rekey",
        metavar="REV",
        help="carry schedules/tuned.jsonl across a change to the schedules since git revision "
        "REV (a pass added to a shared lowering, a script edited), then exit: each record whose "
        "schedule hash is its descriptor's at REV gets its descriptor's hash now; the others "
        "are left and listed. Only for changes that keep the tuned parameters' meaning",
    )
    _db_option(tune)

    attach = sub.add_parser(
        "attach",
        help="follow a sweep or tune running in the daemon (Ctrl-C detaches)",
        description="Show the finished kernels and live progress of a sweep running in the "
        "daemon (with --tune: the trials so far and then live of a `kbd tune`), from any "
        "terminal (several may follow at once). Ctrl-C detaches; the sweep goes on. Never "
        "starts a daemon.",
    )
    attach.add_argument(
        "id",
        nargs="?",
        type=int,
        help="sweep id, or tuning session id (default: the latest active one)",
    )
    attach.add_argument("--tune", action="store_true", help="ID is a tuning session's (kbd tune)")
    attach.add_argument("--json", action="store_true", help="JSON Lines, one object per kernel")
    _db_option(attach)
    cancel = sub.add_parser(
        "cancel",
        help="stop a sweep or tune running in the daemon (resumable)",
        description="Start no more kernels of the sweep (or candidates of the tune) and let "
        "running ones finish (--kill: kill them). It ends interrupted and `kbd sweep --resume "
        "ID` (`kbd tune --resume ID`) finishes it.",
    )
    cancel.add_argument("id", type=int, help="sweep id, or tuning session id with --tune")
    cancel.add_argument("--tune", action="store_true", help="ID is a tuning session's (kbd tune)")
    cancel.add_argument("--kill", action="store_true", help="kill its running kernels now")
    _db_option(cancel)

    results = sub.add_parser(
        "results",
        help="show the results of a past sweep",
        description="Show a stored sweep (default: the latest).",
    )
    results.add_argument("id", nargs="?", type=int, help="sweep id (default: latest)")
    results.add_argument("--json", action="store_true", help="JSON Lines, one object per kernel")
    results.add_argument("--junit", metavar="FILE", help="write JUnit XML to FILE")
    results.add_argument(
        "--html",
        metavar="FILE",
        help="write a self-contained HTML page (fast_p curve, speedup distribution, sortable "
        "per-kernel table) for a benchmark sweep to FILE, followed by the latest tuning "
        "session's section when the database has one (or the page of that section alone when "
        "it has no sweep)",
    )
    results.add_argument(
        "--tune",
        dest="tune_session",
        type=int,
        metavar="ID",
        help="with --html: show this tuning session instead of the latest",
    )
    _db_option(results)

    compare = sub.add_parser(
        "compare",
        help="compare the benchmark figures of two stored sweeps",
        description="Compare two stored sweeps kernel by kernel (e.g. two pipelines, or before "
        "and after a schedule change): the ratio of their speedups over eager with a 95% "
        "interval, outcome changes, and which differences are significant given the measured "
        "noise. Rows without a significant difference are counted, not listed. Where both "
        "sweeps were timed against Inductor (--baseline inductor), the ratio of the speedups "
        "over Inductor too, shown but not judged: significance and --fail-on-regression are "
        "on the speedup over eager.",
    )
    compare.add_argument("a", type=int, metavar="A", help="the baseline sweep id")
    compare.add_argument("b", type=int, metavar="B", help="the sweep compared with it")
    compare.add_argument(
        "--threshold",
        type=float,
        default=COMPARE_THRESHOLD,
        metavar="FRACTION",
        help="a change is significant when its 95%% interval excludes 1 and it is at least "
        "this large (default %(default)s)",
    )
    compare.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit 1 when a kernel is significantly slower in B, or passed in A and not in B",
    )
    compare.add_argument("--json", action="store_true", help="JSON Lines, one object per kernel")
    _db_option(compare)

    sweeps = sub.add_parser(
        "sweeps", help="list stored sweeps", description="List the sweeps in the results database."
    )
    _db_option(sweeps)

    replay = sub.add_parser(
        "replay",
        help="rerun the failing pipeline stage of a reproducer bundle",
        description="Rerun exactly the stage a reproducer bundle holds (written next to a "
        "kernel's log when it fails in a pipeline stage: <kernel>.bundle/) on the IR before it, "
        "in a sandboxed worker as in a sweep (memory cap, one pinned core, timeout), and print "
        "how it ends beside the original failure. Exit status: 1 when the stage fails (the same "
        "way or not), 0 when it now passes, 2 for a bad bundle.",
    )
    replay.add_argument("bundle", metavar="BUNDLE", help="the bundle folder")
    replay.add_argument(
        "--timeout",
        type=float,
        default=SPEC.timeout,
        metavar="SECONDS",
        help="wall-time limit of the worker (default %(default)s)",
    )
    replay.add_argument(
        "--mem-limit",
        metavar="SIZE",
        default=spec.DEFAULT_MEM_LIMIT,
        help="memory cap of the worker (default %(default)s; 'none' to disable)",
    )
    replay.add_argument(
        "--log-dir", metavar="DIR", help="where the worker's log goes (default .kbd/logs/replay-*)"
    )

    doctor = sub.add_parser(
        "doctor",
        help="check which enforcement (limits, containment) works on this machine",
        description="Try every enforcement kbd uses (memory cap, core pinning, timeout, "
        "filesystem and network containment, descriptors, process-tree cleanup) in real "
        "workers forked from the template, and print whether each works, with the reason "
        "when it does not.",
    )
    doctor.add_argument(
        "--strict",
        action="store_true",
        help="exit with status 1 when any enforcement does not work (for CI)",
    )
    _daemon_parser(sub)
    levels_cli.add_parser(sub)
    return parser


def _daemon_parser(sub) -> None:
    daemon = sub.add_parser(
        "daemon",
        help="a long-lived warm runner shared by kbd commands (run, start, stop, status)",
        description="One daemon per user and results database keeps warm templates, runs the "
        "sweeps of every client from one queue with one memory budget, and outlives the "
        "terminal. Its socket is owner-only; it exits after --idle-timeout without work.",
    )
    commands = daemon.add_subparsers(dest="daemon_command", metavar="ACTION", required=True)
    run = commands.add_parser(
        "run",
        help="run a daemon in the foreground (for systemd: Type=notify)",
        description="Run the daemon in this process, logging to stderr, until it is stopped, "
        "idle for --idle-timeout, or sent SIGTERM.",
    )
    start = commands.add_parser(
        "start",
        help="start a daemon in the background unless one runs; replace a stale one",
        description="Start a daemon in its own session (log in its state directory) and wait "
        "until it is ready. A running daemon of other code is replaced when idle.",
    )
    for parser in (run, start):
        parser.add_argument(
            "--idle-timeout",
            type=float,
            default=DAEMON_IDLE_TIMEOUT_S,
            metavar="SECONDS",
            help="exit after this long without clients or work (default %(default)s; 0: never)",
        )
    run.add_argument("--log", metavar="FILE", help="append output to FILE instead of stderr")
    run.add_argument(
        "--mem-budget",
        metavar="SIZE",
        help="memory all kernels of all sweeps may use together (default: 75%% of available)",
    )
    stop = commands.add_parser(
        "stop",
        help="stop the daemon (never starts one)",
        description="Stop admitting kernels, let running ones finish, mark unfinished sweeps "
        "interrupted (resumable) and exit.",
    )
    stop.add_argument("--now", action="store_true", help="kill running kernels instead")
    status = commands.add_parser(
        "status",
        help="show the daemon (never starts one; exit status 3 when none runs)",
        description="Show the daemon's pid, code, state directory, log, cores, memory, "
        "templates and sweeps. Exit status 3 when no daemon runs.",
    )
    status.add_argument("--json", action="store_true", help="one JSON object")
    for parser in (run, start, stop, status):
        _db_option(parser)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        invocation = Invocation.of(args)
        if args.command in ("run", "sweep"):
            from kbd.commands import run

            return run.run_or_sweep(invocation, _spec(args, invocation))
        if args.command == "tune":
            from kbd.commands import tune

            return tune.main(args, invocation)
        if args.command == "replay":
            from kbd.commands import replay

            return replay.main(args)
        if args.command == "doctor":
            from kbd.commands import doctor

            return doctor.doctor(args)
        if args.command in ("attach", "cancel"):
            from kbd.daemon import submit

            if args.command == "attach":
                return submit.attach(invocation)
            return submit.cancel(invocation)
        if args.command == "daemon":
            from kbd.daemon import commands as daemon_commands

            return daemon_commands.main(args)
        if args.command == "levels":
            return levels_cli.run(args)
        from kbd.commands import history

        if args.command == "results":
            return history.show_results(invocation)
        if args.command == "compare":
            from kbd.bench import compare

            return compare.main(args)
        return history.list_sweeps(invocation)
    except InputError as exc:
        print(f"kbd: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("kbd: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `kbd results | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED


def _spec(args: argparse.Namespace, invocation: Invocation) -> SweepSpec | None:
    """The spec the command line gives; None when it resumes a stored sweep (whose spec rules)."""
    if invocation.resume:
        return None
    options = spec.from_args(args, Path.cwd())
    if options.dump_assembly:  # a fact of this machine, checked before anything runs
        from kbd.engine import dumps

        dumps.require_disassembler()
    return options
