"""Reproducer bundles: everything needed to rerun one failing pipeline stage (`kbd replay`).

When a kernel ends in a `pipeline:<stage>` phase without passing (a failing pass or transform
script, a verifier error, a crash, a timeout), the supervisor turns the `StageSnapshot` the worker
left in its scratch folder just before that stage into a folder next to the kernel's log,
`<log name>.bundle/`:

- `input.mlir`: the IR before the failing stage, complete (`input.mlirbc`, MLIR bytecode, when
  the worker died inside the stage: printing text before every stage would cost 3x more);
- `stage.mlir` (a transform script, its variables substituted) or `pipeline.txt` (the pass as
  a full pass pipeline, `builtin.module(...)`);
- `manifest.json`: a `Manifest` (the kernel, the stage, the original outcome, phase and message,
  -O, the target, kbd's version and code hash, the tool versions);
- `README.txt`: how to replay it, with kbd and with `mlir-opt`.

Replay reads the two IR files, not the manifest's copy, so a user may shrink `input.mlir` or
edit the stage and replay again. Supervisor side: no torch, no MLIR.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

import msgspec

from kbd import __version__
from kbd.plan import descriptor, target
from kbd.results.record import Record
from kbd.shared import identity
from kbd.shared.errors import InputError
from kbd.shared.identity import Identity
from kbd.shared.outcomes import Outcome
from kbd.shared.protocol import (
    STAGE_INPUT,
    STAGE_SNAPSHOT,
    Job,
    Mode,
    Stage,
    StageSnapshot,
    is_pipeline_phase,
)

FORMAT = 1
MANIFEST = "manifest.json"
INPUT = "input.mlir"
INPUT_BYTECODE = "input.mlirbc"
SCRIPT = "stage.mlir"
PASSES = "pipeline.txt"
README = "README.txt"
SUFFIX = ".bundle"
_PASS_PIPELINE = ("builtin.module(", ")")


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """What a bundle holds and how the stage failed the first time."""

    format: int = FORMAT
    kernel: str  # e.g. "level1/1_matmul"
    mode: Mode
    subgraph: int | None  # compile mode: the captured graph (0-based)
    stage: Stage  # the failing stage; a transform's text is in `stage_file`, not here
    stage_number: int  # 1-based position in the pipeline
    stages: int  # stages in the pipeline
    pipeline: list[str]  # every stage in order: a pass with its options, or a script's path
    input: str  # INPUT, or INPUT_BYTECODE when the worker died in the stage
    stage_file: str  # SCRIPT or PASSES
    # the original failure, as classified
    outcome: Outcome
    phase: str
    signal: str | None = None
    message: str
    log: str | None
    # what the stage ran with
    opt_level: int  # the JIT's -O (not used by a stage; recorded for the whole picture)
    arch: str
    features: list[str]  # the host's CPU features that schedules are chosen by
    kbd_version: str
    identity: Identity  # code hash, Python (version and interpreter), torch and torch-mlir
    created: str  # UTC, ISO 8601


def write(
    record: Record, failure: tuple[str, str, str | None, str], job: Job, log_path: Path
) -> str | None:
    """Write the bundle of a kernel that did not pass in a pipeline stage, when its worker
    left a snapshot; returns the bundle's path, or None (nothing to reproduce).

    `failure` is (outcome, phase, signal, message) as classified, before any xfail applies."""
    outcome, phase, signal, message = failure
    folder = (log_path.parent / (log_path.stem + SUFFIX)).resolve()
    shutil.rmtree(folder, ignore_errors=True)  # an earlier attempt's bundle is stale now
    if outcome == "pass" or not is_pipeline_phase(phase):
        return None
    snapshot = _snapshot(job)
    if snapshot is None or snapshot.stage.phase != phase:
        return None
    folder.mkdir(parents=True)
    stage = snapshot.stage
    text = Path(job.limits.scratch) / STAGE_INPUT
    if text.is_file():  # the worker lived to print it
        shutil.copyfile(text, folder / INPUT)
        input_file = INPUT
    else:  # it died inside the stage: the bytecode it left
        (folder / INPUT_BYTECODE).write_bytes(snapshot.module)
        input_file = INPUT_BYTECODE
    if stage.kind == "transform":
        stage_file = SCRIPT
        (folder / SCRIPT).write_text(stage.script)
        stage = msgspec.structs.replace(stage, script="")
    else:
        stage_file = PASSES
        (folder / PASSES).write_text(_PASS_PIPELINE[0] + stage.text + _PASS_PIPELINE[1] + "\n")
    arch, flags = descriptor.host_target()
    manifest = Manifest(
        kernel=record.kernel,
        mode=record.mode,
        subgraph=snapshot.subgraph,
        stage=stage,
        stage_number=snapshot.index + 1,
        stages=snapshot.stages,
        pipeline=[s.text for s in job.stages],
        input=input_file,
        stage_file=stage_file,
        outcome=outcome,
        phase=phase,
        signal=signal,
        message=message,
        log=str(Path(record.log).resolve()) if record.log else None,
        opt_level=job.opt_level,
        arch=arch,
        features=[f for f in flags if f in target.LLVM_FEATURES or f.startswith("amx")],
        kbd_version=__version__,
        identity=identity.current(),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    (folder / MANIFEST).write_bytes(msgspec.json.format(msgspec.json.encode(manifest)) + b"\n")
    (folder / README).write_text(_readme(manifest, folder))
    return str(folder)


def _snapshot(job: Job) -> StageSnapshot | None:
    if not job.limits.scratch:
        return None
    path = Path(job.limits.scratch) / STAGE_SNAPSHOT
    with contextlib.suppress(OSError, msgspec.DecodeError):
        return msgspec.msgpack.decode(path.read_bytes(), type=StageSnapshot)
    return None


class Bundle(msgspec.Struct, frozen=True):
    """A bundle as read back: its manifest, the IR before the stage, and the stage to run."""

    path: str
    manifest: Manifest
    module: bytes  # MLIR text (UTF-8) or bytecode
    stage: Stage


def load(path: Path) -> Bundle:
    """Read a bundle folder; raises InputError naming the file and what is wrong."""
    if not path.is_dir():
        raise InputError(f"{path}: not a reproducer bundle (no such folder)")
    manifest_path = path / MANIFEST
    try:
        manifest = msgspec.json.decode(manifest_path.read_bytes(), type=Manifest)
    except OSError as exc:
        raise InputError(f"{manifest_path}: cannot read the manifest ({exc.strerror})") from None
    except msgspec.ValidationError as exc:
        raise InputError(f"{manifest_path}: not a valid manifest ({exc})") from None
    except msgspec.DecodeError:
        raise InputError(f"{manifest_path}: not a valid manifest (not JSON)") from None
    if manifest.format != FORMAT:
        raise InputError(f"{manifest_path}: bundle format {manifest.format}, kbd reads {FORMAT}")
    if manifest.input not in (INPUT, INPUT_BYTECODE) or manifest.stage_file not in (SCRIPT, PASSES):
        raise InputError(
            f"{manifest_path}: input must be {INPUT} or {INPUT_BYTECODE}, stage_file {SCRIPT} "
            f"or {PASSES}"
        )
    module = _read(path / manifest.input, binary=True)
    text = _read(path / manifest.stage_file)
    stage = manifest.stage
    if stage.kind == "transform":
        stage = msgspec.structs.replace(stage, script=text)
    else:
        stage = msgspec.structs.replace(stage, text=_pass_text(text.strip(), path / PASSES))
    return Bundle(str(path), manifest, module, stage)


def _read(path: Path, binary: bool = False) -> str | bytes:
    try:
        return path.read_bytes() if binary else path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read it ({exc})") from None


def _pass_text(text: str, path: Path) -> str:
    """The pass element inside `builtin.module(...)`."""
    start, end = _PASS_PIPELINE
    if not (text.startswith(start) and text.endswith(end)) or len(text) == len(start + end):
        raise InputError(f"{path}: expected one line 'builtin.module(PASS{{OPTIONS}})'")
    return text[len(start) : -len(end)]


def _readme(manifest: Manifest, folder: Path) -> str:
    where = f", graph {manifest.subgraph}" if manifest.subgraph is not None else ""
    failure = f"{manifest.outcome} in {manifest.phase}"
    if manifest.signal:
        failure += f" ({manifest.signal})"
    source = manifest.input
    if manifest.stage.kind == "pass":
        tool = f'mlir-opt {source} --pass-pipeline="$(cat {PASSES})"'
    else:
        tool = (
            f"mlir-opt {source} --transform-preload-library=transform-library-paths={SCRIPT}"
            " --transform-interpreter"
        )
    if source == INPUT_BYTECODE:
        tool += f"\n    mlir-opt {INPUT_BYTECODE} -o {INPUT}   # the IR as text"
    return (
        f"Reproducer bundle: {manifest.kernel} [{manifest.mode}{where}], stage "
        f"{manifest.stage_number} of {manifest.stages} ({manifest.stage.source}).\n"
        f"It failed: {failure}: {manifest.message}\n\n"
        f"Rerun exactly this stage in a sandboxed worker:\n\n    kbd replay {folder}\n\n"
        f"{source} is the IR before the stage, {manifest.stage_file} the stage. Replay reads "
        f"both files, so you may shrink or edit them and replay again (a text {INPUT} may "
        f'replace {INPUT_BYTECODE}: set "input" in {MANIFEST}).\n'
        "Outside kbd, with an mlir-opt of the LLVM the torch-mlir wheel was built from (the "
        "wheel's torch-mlir-opt lacks the dialects and the transform interpreter):\n\n"
        f"    {tool}\n\n{MANIFEST} holds the original failure and what the stage ran with "
        "(target, -O, kbd's version and code hash, the tool versions).\n"
    )
