"""Seeing inside a pipeline, supervisor side: where printed IR, object files and assembly go.

The worker prints IR into the kernel's log (its stderr) or, with `--print-to`, into a file in
its scratch folder, and writes the JIT's object files there (kbd/worker/stages.py): a sandboxed
worker writes nowhere else. When the worker has ended, even by a crash, the supervisor moves
them to where they belong and, with `--dump-assembly`, disassembles each object file with
`objdump -d -r` (GNU binutils; LLVM's `llvm-objdump` when that is all there is). The torch-mlir
wheel's MLIR bindings expose no LLVM target machine to print assembly with, and an `llc` on
the machine is not the LLVM the JIT was built with, so the object file the ExecutionEngine
wrote (`ExecutionEngine.dump_to_object_file`), the exact code that ran, is what gets
disassembled. Supervisor side: no torch.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from kbd.shared.errors import InputError
from kbd.shared.protocol import IR_FILE, OBJECT_FILE, Inspect, Job

if TYPE_CHECKING:
    from kbd.plan.spec import SweepSpec

DISASSEMBLERS = (("objdump", "-d", "-r"), ("llvm-objdump", "-d", "-r"))
DISASSEMBLE_TIMEOUT_S = 120
_OBJECT_INDEX = re.compile(re.escape(OBJECT_FILE.split("{")[0]) + r"(\d+)\.o")  # OBJECT_FILE


def file_stem(label: str) -> str:
    """A kernel's file name without suffix, e.g. `level1__1_matmul[compile]`: its log is
    `<stem>.log`, its IR `<stem>.mlir`, its object file `<stem>.o`."""
    return label.replace("/", "__").replace(" ", "")


def disassembler() -> tuple[str, ...] | None:
    """The command that disassembles an object file (without the file), or None."""
    for command in DISASSEMBLERS:
        path = shutil.which(command[0])
        if path is not None:
            return (path, *command[1:])
    return None


def require_disassembler() -> None:
    """--dump-assembly needs a disassembler on this machine (checked at the edge)."""
    if disassembler() is None:
        names = " or ".join(command[0] for command in DISASSEMBLERS)
        raise InputError(
            f"--dump-assembly disassembles the JIT's object file with {names}; neither is on "
            "PATH (install binutils), or use --object-file alone"
        )


def inspect_for(options: SweepSpec, label: str, single: bool) -> Inspect:
    """One kernel's `Inspect` options; `single`: it is the only kernel (and mode) that runs,
    so `--print-to` names a file unless it is an existing folder or ends with '/'."""
    print_to = None
    if options.print_to is not None:
        path = Path(options.print_to)
        if single and not (path.is_dir() or options.print_to.endswith("/")):
            print_to = str(path)
        else:
            if path.is_file():
                raise InputError(
                    f"--print-to {path}: is a file, but several kernels (or modes) run; name a "
                    "folder (each kernel's IR goes to <kernel>.mlir in it)"
                )
            print_to = str(path / f"{file_stem(label)}.mlir")
    return Inspect(
        print_after_all=options.print_mlir_after_all,
        print_original=options.print_original_module,
        print_optimized=options.print_optimized_module,
        print_to=print_to,
        object_file=options.object_file or options.dump_assembly,
        assembly=options.dump_assembly,
    )


def collect(job: Job, log_path: Path) -> dict[str, str]:
    """Move what the worker left in its scratch folder where it belongs; disassemble objects.
    Returns what was written, kind -> path (or why it was not)."""
    inspect = job.inspect
    written: dict[str, str] = {}
    if inspect.prints:
        written["ir"] = str(log_path)
    scratch = Path(job.limits.scratch) if job.limits.scratch else None
    if scratch is None:
        return written
    if inspect.print_to is not None and (scratch / IR_FILE).is_file():
        destination = Path(inspect.print_to)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(scratch / IR_FILE, destination)
        written["ir"] = str(destination)
    objects = sorted(
        (int(m.group(1)), scratch / m.group(0))
        for m in map(_OBJECT_INDEX.fullmatch, (p.name for p in scratch.iterdir()))
        if m is not None
    )
    for index, source in objects:
        suffix = "" if len(objects) == 1 else f".graph-{index}"
        destination = log_path.parent / f"{log_path.stem}{suffix}.o"
        shutil.move(source, destination)
        written[f"object{suffix}"] = str(destination)
        if inspect.assembly:
            written[f"assembly{suffix}"] = _disassemble(destination)
    return written


def _disassemble(obj: Path) -> str:
    """Write `<obj stem>.s`; returns its path, or why it could not be written."""
    command = disassembler()
    if command is None:
        return "not written: no objdump or llvm-objdump on PATH"
    assembly = obj.with_suffix(".s")
    try:
        result = subprocess.run(
            [*command, str(obj)], capture_output=True, text=True, timeout=DISASSEMBLE_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"not written: {command[0]} failed: {exc}"
    if result.returncode != 0:
        return f"not written: {' '.join(command)} {obj.name}: {result.stderr.strip()[:200]}"
    assembly.write_text(result.stdout)
    return str(assembly)
