"""Importing torch into MLIR: torch.export, then torch-mlir's FX importer with kbd's
decompositions (linalg-on-tensors); the module as text or bytecode, and parsed back."""

from __future__ import annotations

import io
from collections.abc import Sequence

import torch
from torch.export.graph_signature import InputKind, OutputKind
from torch_mlir import fx, ir
from torch_mlir.extras.fx_decomp_util import get_decomposition_table

from kbd.worker import decompositions, low_precision, norms, transposed_convs
from kbd.worker.mlir import scans

MUTATED_INPUTS = "kbd.mutated_inputs"  # module attribute: positions of inputs the entry writes


def import_model(model, args: Sequence) -> ir.Module:
    """Import a torch module into MLIR (linalg-on-tensors) with torch-mlir's FX importer,
    applying torch-mlir's decompositions plus kbd's (see kbd.worker.decompositions)."""
    return import_program(torch.export.export(model, tuple(args), strict=False))


def decomposition_table() -> dict:
    """What import applies: torch-mlir's decompositions, kbd's (kbd.worker.decompositions,
    kbd.worker.norms and kbd.worker.transposed_convs), and f32 accumulation for bf16 and f16
    (kbd.worker.low_precision)."""
    kbd_tables = {**decompositions.TABLE, **norms.TABLE, **transposed_convs.TABLE}
    return low_precision.wrap({**get_decomposition_table(), **kbd_tables})


def import_program(program: torch.export.ExportedProgram) -> ir.Module:
    """Import an exported program with kbd's decompositions.

    torch.export functionalizes: an input (or lifted buffer) written in place becomes an extra
    leading result of the function, which callers must write back or report, never drop. The
    positions of those inputs are kept in the module (see `mutated_inputs`), so they survive
    the import cache's text round trip.
    """
    program = program.run_decompositions(decomposition_table())
    signature = program.graph_signature
    user_inputs = [s.arg.name for s in signature.input_specs if s.kind == InputKind.USER_INPUT]
    mutated = []
    for spec in signature.output_specs:
        if spec.kind == OutputKind.USER_INPUT_MUTATION:
            mutated.append(user_inputs.index(spec.target))
        elif spec.kind != OutputKind.USER_OUTPUT:
            raise ValueError(f"unsupported output of the exported program: {spec.kind.name}")
    module = fx.export_and_import(program, output_type="linalg-on-tensors", decomposition_table={})
    scans.scans_as_loops(module)  # tm_tensor.scan, which no pipeline could bufferize
    with module.context:
        module.operation.attributes[MUTATED_INPUTS] = ir.DenseI64ArrayAttr.get(mutated)
    return module


def mutated_inputs(module: ir.Module) -> tuple[int, ...]:
    """Positions (among the tensor arguments of @main) of the inputs it writes; its first
    `len(...)` results are their new values, in this order."""
    attributes = module.operation.attributes
    if MUTATED_INPUTS not in attributes:
        return ()
    return tuple(ir.DenseI64ArrayAttr(attributes[MUTATED_INPUTS]))


def module_text(module: ir.Module) -> str:
    """The module as MLIR text, complete (no elided constants), for the import cache."""
    return module.operation.get_asm(large_elements_limit=None, enable_debug_info=False)


def module_bytecode(module: ir.Module) -> bytes:
    """The module as MLIR bytecode: about 3x faster to write than its text."""
    buffer = io.BytesIO()
    module.operation.write_bytecode(buffer)
    return buffer.getvalue()


def parse_module(text: str | bytes) -> ir.Module:
    """Parse MLIR text (e.g. an import cache entry; str or UTF-8 bytes) or bytecode into a
    module with its own context."""
    with ir.Context(), ir.Location.unknown():
        return ir.Module.parse(text)
