"""Run a kernel's pipeline stages so that they can be seen and reproduced.

As each stage starts the worker leaves a `StageSnapshot` (the IR before the stage, as bytecode,
and the stage) in its scratch folder, replaced atomically, so the supervisor can write a
reproducer bundle whatever ends the stage: a failing pass, a segfault, a timeout
(kbd/engine/bundles.py); a stage that fails without killing the worker also gets its input as text.
With the `Inspect` options of the job it prints IR (into the kernel's log, or a file in its
scratch folder that the supervisor moves where the user asked) and writes object files.
`replay` runs one stage of a bundle (`kbd replay`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

import msgspec

from kbd.shared.protocol import (
    IR_FILE,
    OBJECT_FILE,
    STAGE_INPUT,
    STAGE_SNAPSHOT,
    Inspect,
    Replay,
    Result,
    Stage,
    StageSnapshot,
)
from kbd.worker import mlir

REPLAY_PASSED = "the stage ran without error"


class Pipeline:
    """A job's stages and inspection options, applied to each module it compiles (one in
    import mode, one per captured graph in compile mode)."""

    def __init__(
        self, stages: Sequence[Stage], inspect: Inspect, scratch: str | None, step: Callable
    ):
        self.stages = list(stages)
        self.inspect = inspect
        self.scratch = Path(scratch) if scratch else None
        self.step = step  # the job's phase step: `with step(phase): ...`
        self.modules = 0  # modules run through the pipeline so far
        self._ir: TextIO | None = None

    def run(self, module, kernel: str, subgraph: int | None = None) -> None:
        """Apply every stage to `module` in place, each in its `pipeline:<stage>` phase."""
        self.modules += 1
        kernel = kernel.removesuffix(".py")
        where = kernel if subgraph is None else f"{kernel}, graph {subgraph}"
        if self.inspect.print_original:
            mlir.print_module(module, f"Original module: {where}", self.ir_stream())
        print_after = self.ir_stream() if self.inspect.print_after_all else None
        for index, stage in enumerate(self.stages):
            with self.step(stage.phase):  # the snapshot's cost is the stage's
                before = self._snapshot(index, stage, subgraph, module)
                try:
                    mlir.apply_stage(module, stage, print_after=print_after)
                except Exception:
                    self._input_as_text(before)
                    raise
        self._clear_snapshot()
        if self.inspect.print_optimized:
            mlir.print_module(module, f"Optimized module: {where}", self.ir_stream())

    def compiled(self, compiled: mlir.Compiled) -> None:
        """After the JIT: write its object file when asked (in the scratch folder)."""
        if self.inspect.object_file and self.scratch is not None:
            compiled.write_object(self.scratch / OBJECT_FILE.format(index=self.modules - 1))

    def ir_stream(self) -> TextIO:
        """Where printed IR goes: the kernel's log, or the scratch file the supervisor moves."""
        if self.inspect.print_to is None or self.scratch is None:
            return sys.stderr
        if self._ir is None:
            self._ir = open(self.scratch / IR_FILE, "a")  # noqa: SIM115 (open for the job)
        return self._ir

    def _snapshot(self, index: int, stage: Stage, subgraph: int | None, module) -> bytes | None:
        """Leave the IR before a stage in the scratch folder; returns it (bytecode)."""
        if self.scratch is None:
            return None
        bytecode = mlir.module_bytecode(module)
        snapshot = StageSnapshot(index, len(self.stages), stage, bytecode, subgraph)
        temporary = self.scratch / (STAGE_SNAPSHOT + ".tmp")
        temporary.write_bytes(msgspec.msgpack.encode(snapshot))
        os.replace(temporary, self.scratch / STAGE_SNAPSHOT)  # never half-written
        return bytecode

    def _input_as_text(self, bytecode: bytes | None) -> None:
        """A stage failed: its input as text, for the bundle (readable, editable)."""
        if bytecode is not None:
            text = mlir.module_text(mlir.parse_module(bytecode))
            (self.scratch / STAGE_INPUT).write_text(text)

    def _clear_snapshot(self) -> None:
        if self.scratch is not None:
            (self.scratch / STAGE_SNAPSHOT).unlink(missing_ok=True)


def replay(task: Replay, step, limits_enforced: dict[str, str]) -> Result:
    """Parse the bundle's module (phase `load`) and run its one stage (phase
    `pipeline:<stage>`); a failing stage raises, as in a kernel's job."""
    with step("load"):
        module = mlir.parse_module(task.module)
    with step(task.stage.phase):
        mlir.apply_stage(module, task.stage)
    return Result(
        outcome="pass",
        phase=step.phase,
        message=REPLAY_PASSED,
        times=step.times,
        limits_enforced=limits_enforced,
    )
