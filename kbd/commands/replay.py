"""`kbd replay BUNDLE`: rerun a reproducer bundle's stage in a sandboxed worker.

The worker is forked from a warm template exactly as in a sweep (memory cap, one pinned core,
filesystem and network containment, a timeout) and runs the bundle's one stage on the bundle's
IR (kbd/worker/stages.py). Its end is classified like a kernel's (kbd.results.record.classify) and
printed beside the original failure. Exit status: 1 when the stage fails (the same way or not),
0 when it now passes, 2 for a bad bundle. Supervisor side: no torch.
"""

from __future__ import annotations

import sys
import time
from argparse import Namespace
from pathlib import Path

import anyio

from kbd.engine import bundles, runner
from kbd.engine.bundles import Bundle
from kbd.engine.scratch import scratch_folder
from kbd.engine.spawner import Spawner, template_env
from kbd.plan import limits
from kbd.plan.paths import check_output
from kbd.results.record import classify
from kbd.shared import identity
from kbd.shared.errors import InputError, TemplateError
from kbd.shared.protocol import Limits, Replay

EXIT_PASSED, EXIT_FAILED = 0, 1  # bad input is 2, through InputError (kbd.cli)


def main(args: Namespace) -> int:
    if not args.timeout > 0:  # also NaN
        raise InputError(f"--timeout must be positive, got {args.timeout:g}")
    mem_limit = (
        None
        if args.mem_limit.lower() == "none"
        else limits.parse_size(args.mem_limit, "--mem-limit")
    )
    check_output(args.log_dir, "--log-dir", folder=True)
    log_dir = (
        Path(args.log_dir)
        if args.log_dir
        else Path(".kbd/logs") / time.strftime("replay-%Y%m%d-%H%M%S")
    )
    bundle = bundles.load(Path(args.bundle))
    m = bundle.manifest
    graph = f", graph {m.subgraph}" if m.subgraph is not None else ""
    print(
        f"kbd replay: {m.kernel} [{m.mode}{graph}], stage {m.stage_number} of {m.stages} "
        f"({m.phase}, from {m.stage.source})",
        flush=True,
    )
    then = "{label}: the bundle's {theirs}, now {ours}"
    for note in identity.differences(m.identity, identity.current(), then):
        print(f"note: {note}", flush=True)
    try:
        replayed = anyio.run(_replay, bundle, args.timeout, mem_limit, log_dir)
    except TemplateError as exc:
        print(f"kbd: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    original = (m.outcome, m.phase, m.signal, m.message)
    print(_line("original", original))
    print(_line("replayed", replayed))
    print(f"log: {log_dir / 'replay.log'}")
    if replayed[0] == "pass":
        print("the stage now passes: the failure does not reproduce")
        return EXIT_PASSED
    if replayed == original:
        print("the failure reproduces: same outcome, phase and message")
    else:
        print("the stage fails, but not as it did (see the two lines above)")
    return EXIT_FAILED


async def _replay(bundle: Bundle, timeout: float, mem_limit: int | None, log_dir: Path):
    """(outcome, phase, signal, message) of the stage run in one sandboxed worker."""
    env = template_env(1)  # as a sweep's template, for one-core workers
    core = limits.usable_cores()[0]
    name = f"replay {bundle.manifest.kernel}"
    with scratch_folder(name) as scratch:
        task = Replay(
            kernel=bundle.manifest.kernel,
            module=bundle.module,
            stage=bundle.stage,
            limits=Limits(cores=(core,), mem_limit=mem_limit, scratch=str(scratch)),
        )
        async with Spawner.started(env, log_dir / "template.log") as spawner:
            state = await runner.run_in_worker(
                spawner,
                task,
                name=name,
                mem_limit=mem_limit,
                timeout=timeout,
                log_path=log_dir / "replay.log",
            )
    return classify(state.result, state.death(mem_limit, timeout))


def _line(which: str, failure: tuple) -> str:
    outcome, phase, signal, message = failure
    return f"{which:<9} {outcome:<8} [{phase}]  " + (f"{signal}: " if signal else "") + message
