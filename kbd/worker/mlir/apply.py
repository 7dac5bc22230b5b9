"""Applying one pipeline stage to a module (a pass pipeline, a transform script or one of
kbd's rewrites), MLIR's diagnostics as StageError, and printing the IR after it."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from typing import TextIO

from torch_mlir import ir, passmanager
from torch_mlir.dialects.transform import interpreter

from kbd.shared.protocol import Stage
from kbd.worker.mlir import (
    attention,
    bf16_dot,
    channels_last,
    conv3d,
    conv_widths,
    depthwise,
    im2col,
    outline,
    parallel_generics,
    pointwise,
    pooling,
    reduction_dims,
    rewrites,
    row_chains,
    strided_conv,
    vector_copies,
)
from kbd.worker.mlir.importer import module_text

TRANSFORM_ENTRY = "__transform_main"

# kbd's own rewrites, by the name a `pass:` stage gives them (not MLIR passes).
REWRITES = {
    "kbd-outline-repeated-ops": outline.outline_repeated_ops,
    "kbd-outline-repeated-generics": outline.outline_repeated_generics,
    "kbd-erase-unused-outlined-calls": outline.erase_unused_outlined_calls,
    "kbd-fold-transpose-into-matmul": rewrites.fold_transpose_into_matmul,
    "kbd-fold-transpose-into-batch-matmul": rewrites.fold_transpose_into_batch_matmul,
    "kbd-mark-attention": attention.mark_attention,
    "kbd-unit-dims-as-reshapes": rewrites.unit_dims_as_reshapes,
    "kbd-shared-b-batch-matmuls-as-matmuls": rewrites.shared_b_batch_matmuls_as_matmuls,
    "kbd-strided-convs-as-phases": strided_conv.strided_convs_as_phases,
    "kbd-strided-conv1ds-as-phases": strided_conv.strided_conv1ds_as_phases,
    "kbd-depthwise-convs-as-taps": depthwise.depthwise_convs_as_taps,
    "kbd-grouped-convs-as-convs": depthwise.grouped_convs_as_convs,
    "kbd-conv3d-as-conv2d": conv3d.conv3d_as_conv2d,
    "kbd-pad-conv-widths": conv_widths.pad_conv_widths,
    "kbd-convs-channels-last": channels_last.convs_channels_last,
    "kbd-pointwise-convs-as-matmuls": pointwise.pointwise_convs_as_matmuls,
    "kbd-narrow-convs-as-matmuls": im2col.narrow_convs_as_matmuls,
    "kbd-poolings-as-taps": pooling.poolings_as_taps,
    "kbd-mark-parallel-generics": parallel_generics.mark_parallel_generics,
    "kbd-mark-reduction-inputs": parallel_generics.mark_reduction_inputs,
    "kbd-drop-generic-asserts": parallel_generics.drop_generic_asserts,
    "kbd-mark-row-chains": row_chains.mark_row_chains,
    "kbd-collapse-reduction-dims": reduction_dims.collapse_reduction_dims,
    "kbd-fold-bf16-widening-into-matmul": bf16_dot.fold_bf16_widening_into_matmul,
    "kbd-fold-bf16-widening-into-batch-matmul": bf16_dot.fold_bf16_widening_into_batch_matmul,
    "kbd-bf16-dot-products": bf16_dot.bf16_dot_products,
    "kbd-flatten-whole-tensor-transfers": rewrites.flatten_whole_tensor_transfers,
    "kbd-polynomial-erf": rewrites.polynomial_erf,
    "kbd-polynomial-exp": rewrites.polynomial_exp,
    "kbd-polynomial-log": rewrites.polynomial_log,
    "kbd-openmp-guided-schedule": rewrites.openmp_guided_schedule,
    "kbd-dealloc-after-last-use": rewrites.deallocs_after_last_use,
    "kbd-outputs-in-place": rewrites.outputs_in_place,
    "kbd-vector-copies": vector_copies.vector_copies,
    "kbd-strided-copies-as-loops": rewrites.strided_copies_as_loops,
    "kbd-hoist-allocas": rewrites.hoist_allocas,
    "kbd-contract-float-arithmetic": rewrites.contract_float_arithmetic,
}


class StageError(Exception):
    """A pipeline stage failed; the message is MLIR's first error diagnostic."""


def apply_stage(module: ir.Module, stage: Stage, *, print_after: TextIO | None = None) -> None:
    """Run one pipeline stage on the module in place; raises StageError on a failing pass.

    With `print_after` (a text file, or sys.stderr), the module is printed there after every
    pass of a pass stage (MLIR's IR printing, whole module) and after
    a transform script, under MLIR's `// -----// IR Dump After ... //----- //` headers."""
    with _Diagnostics(module.context) as diagnostics:
        try:
            with module.context:
                if stage.kind == "pass" and stage.text in REWRITES:
                    REWRITES[stage.text](module)  # kbd's own rewrite, not an MLIR pass
                    if print_after is not None:
                        print_module(module, f"IR Dump After {stage.text}", print_after)
                    return
                if stage.kind == "pass":
                    pm = passmanager.PassManager.parse(pass_pipeline(stage))
                    if print_after is None:
                        pm.run(module.operation)
                        return
                    module.context.enable_multithreading(False)  # module scope needs it
                    pm.enable_ir_printing(print_module_scope=True)
                    with _stderr_to(print_after):  # MLIR prints to the process's stderr
                        pm.run(module.operation)
                    return
                script = ir.Module.parse(stage.script)
                entry = _find_named_sequence(script, stage.text)
                try:
                    interpreter.apply_named_sequence(module.operation, entry, script.operation)
                except ValueError as exc:  # the interpreter's failure carries its diagnostics
                    raise StageError(_transform_error(str(exc))) from None
                if print_after is not None:
                    print_module(module, f"IR Dump After transform {stage.name}", print_after)
        except ir.MLIRError as exc:
            raise StageError(diagnostics.first_error() or str(exc)) from None


_DIAGNOSTIC = re.compile(r"Diagnostic message at loc\(.*?\): (.*)")


def _transform_error(text: str) -> str:
    """`error: <first diagnostic>` of a failed transform sequence, else its first line."""
    match = _DIAGNOSTIC.search(text)
    if match:
        return f"error: {match.group(1).strip()}"
    return text.strip().splitlines()[0] if text.strip() else "the transform script failed"


def pass_pipeline(stage: Stage) -> str:
    """A pass stage as a full pass pipeline (what `--pass-pipeline=` of an opt tool takes)."""
    return f"builtin.module({stage.text})"


def print_module(module: ir.Module, title: str, stream: TextIO) -> None:
    """The whole module, complete, under a `// -----// TITLE //----- //` header."""
    stream.write(f"// -----// {title} //----- //\n{module_text(module)}\n")
    stream.flush()


@contextlib.contextmanager
def _stderr_to(stream: TextIO):
    """Point file descriptor 2 at `stream` for a while (MLIR writes to llvm::errs())."""
    sys.stderr.flush()
    stream.flush()
    if stream.fileno() == 2:
        yield
        return
    saved = os.dup(2)
    try:
        os.dup2(stream.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


class _Diagnostics:
    """Collects a context's error diagnostics while active; each is also printed to the log."""

    def __init__(self, context: ir.Context):
        self._context = context
        self.errors: list[str] = []

    def __enter__(self) -> _Diagnostics:
        self._handler = self._context.attach_diagnostic_handler(self._handle)
        return self

    def __exit__(self, *exc) -> None:
        self._handler.detach()

    def _handle(self, diagnostic) -> bool:
        print(f"{diagnostic.location}: {diagnostic.message}", file=sys.stderr, flush=True)
        if diagnostic.severity == ir.DiagnosticSeverity.ERROR:
            self.errors.append(f"error: {diagnostic.message}")
        return True

    def first_error(self) -> str | None:
        return self.errors[0] if self.errors else None


def _find_named_sequence(script: ir.Module, path: str):
    for op in script.body.operations:
        if op.operation.name != "transform.named_sequence":
            continue
        if ir.StringAttr(op.attributes["sym_name"]).value == TRANSFORM_ENTRY:
            return op
    raise ValueError(f"{path}: no transform.named_sequence @{TRANSFORM_ENTRY}")
