"""`kbd tune`: the command line's side (options, export and import); kbd.tune does the work."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import msgspec

from kbd import cluster
from kbd.engine import prepare
from kbd.plan import spec, tuned
from kbd.plan.invocation import Invocation
from kbd.plan.paths import check_output
from kbd.results.store import Store
from kbd.results.tuning import TuningStore
from kbd.shared.errors import InputError
from kbd.tune import rekey, session


def main(args: argparse.Namespace, invocation: Invocation) -> int:
    given = [name for name, value in _EXCLUSIVE if getattr(args, value)]
    if len(given) > 1:
        raise InputError(f"{' and '.join(given)}: one at a time")
    if args.rekey:
        return _rekey(args.rekey)
    if args.export:
        check_output(args.export, "--export")
        adopted = TuningStore(Store(invocation.store_path)).all_tuned()
        Path(args.export).write_text(tuned.jsonl(adopted))
        print(f"kbd tune: wrote {len(adopted)} tuned configurations to {args.export}")
        return 0
    if args.import_file:
        entries = tuned.read_jsonl(Path(args.import_file))
        tuning = TuningStore(Store(invocation.store_path))
        tune_id = tuning.create(_command(), "{}")
        tuning.import_tuned(entries, tune_id)
        tuning.set_status(tune_id, "done")
        print(f"kbd tune: imported {len(entries)} tuned configurations from {args.import_file}")
        return 0
    if args.shapes == "kernelbench":
        raise InputError(
            "--shapes kernelbench: kbd tune keys what it adopts by the input shapes of levels "
            "entries, which a kernel at its problem's own shapes has none of; use --shapes smoke "
            "or bench, or --levels FILE"
        )
    unsupported = [
        name
        for name, given in (
            ("--json", args.json),
            ("--junit", args.junit),
            ("--mode " + args.mode, args.mode != "import"),
            ("--baseline", bool(args.baseline)),
            ("--print-mlir-after-all", args.print_mlir_after_all),
            ("--print-original-module", args.print_original_module),
            ("--print-optimized-module", args.print_optimized_module),
            ("--object-file", args.object_file),
            ("--dump-assembly", args.dump_assembly),
        )
        if given
    ]
    if unsupported:
        raise InputError(f"{unsupported[0]}: not an option of kbd tune (it tunes in import mode)")
    if args.budget < 1:
        raise InputError(f"--budget {args.budget}: at least 1")
    if args.search_time <= 0:
        raise InputError(f"--search-time {args.search_time}: must be positive")
    if len(args.pipeline) > 1 or (args.pipeline and not args.pipeline[0].endswith(".yaml")):
        raise InputError("--pipeline: kbd tune takes one descriptor file (.yaml) with a Tune space")
    check_output(invocation.log_dir, "--log-dir", folder=True)
    if args.resume is not None:
        tune_id, options = session.stored(TuningStore(Store(invocation.store_path)), args.resume)
        if invocation.cluster:  # where to finish it may change; what to tune may not
            where = spec.parse_cluster(invocation.cluster)
            options = msgspec.structs.replace(
                options, sweep=msgspec.structs.replace(options.sweep, cluster=where)
            )
    else:
        tune_id, options = None, _options(args)
    if invocation.detach and (invocation.daemon == "no" or options.sweep.cluster is not None):
        raise InputError("--detach runs the tune in the daemon; not with --no-daemon or --cluster")
    if options.sweep.cluster is not None:
        cluster.require_ray()
    if options.sweep.cluster is None and (invocation.daemon != "no" or invocation.detach):
        from kbd.daemon import submit

        status = submit.tune(invocation, options, tune_id)
        if status is not None:
            return status  # the daemon ran it
    log_dir = Path(invocation.log_dir) if invocation.log_dir else None
    execute = None
    if options.sweep.cluster is not None:
        from kbd.cluster import tuning  # imports ray

        execute = tuning.execute
    return session.run(options, invocation.store_path, tune_id, log_dir, _command(), execute)


_EXCLUSIVE = (("--export", "export"), ("--import", "import_file"), ("--rekey", "rekey"))


def _rekey(revision: str) -> int:
    path, result = rekey.rekey_repository_file(revision, prepare.SCHEDULES_DIR)
    total = len(result.records)
    print(
        f"kbd tune: {path}: {len(result.rekeyed)} of {total} records re-keyed from {revision}, "
        f"{len(result.current)} already current, {len(result.unmatched)} unmatched, "
        f"{len(result.missing)} with a descriptor that no longer exists"
    )
    for kernel in result.unmatched:
        print(f"  unmatched (hash neither {revision}'s nor the current one): {kernel}")
    for name in sorted(set(result.missing)):
        print(f"  no such descriptor now: {name}")
    return 0


def _options(args: argparse.Namespace) -> session.TuneSpec:
    sweep = spec.from_args(_without_pipeline(args), Path.cwd())
    descriptor = str((Path.cwd() / args.pipeline[0]).resolve()) if args.pipeline else None
    if descriptor is not None and not Path(descriptor).is_file():
        raise InputError(f"--pipeline {args.pipeline[0]}: no such descriptor file")
    return session.TuneSpec(
        sweep=sweep,
        descriptor=descriptor,
        budget=args.budget,
        search_time_s=args.search_time,
        seed=sweep.seed,
    )


def _without_pipeline(args: argparse.Namespace) -> argparse.Namespace:
    copy = argparse.Namespace(**vars(args))
    copy.pipeline = []
    return copy


def _command() -> str:
    return shlex.join(["kbd", *sys.argv[1:]])
