"""All MLIR access of kbd goes through this package.

Today the bindings are the upstream MLIR Python bindings bundled in the torch-mlir wheel
(`torch_mlir.ir`, `.passmanager`, `.dialects`, `.execution_engine`); swapping them for a
standalone `mlir` package means changing the imports of these modules and nothing else.

One module per job; a module imports only those listed before it:
- `importer`: torch -> MLIR (torch.export, torch-mlir's FX importer, kbd's decompositions), the
  module as text or bytecode and back
- `convention`: the calling convention of compiled code (results as out-params, C interface)
  and the timing loops around `@main`
- `walk`: finding ops in a module, for the rewrites
- `rewrites`: kbd's own IR rewrites, the `pass: kbd-...` stages
- `bf16_dot`: the rewrites of the bf16 product schedules (avx512_bf16's dot products)
- `apply`: applying one pipeline stage (pass pipeline, transform script or rewrite; the
  `REWRITES` table), diagnostics as StageError, IR printing
- `allocations`: compiled code's allocations checked, a failure reported to the worker
- `execution`: running compiled code through ctypes (JIT or shared library)

Callers use the names re-exported here: `from kbd.worker import mlir`, then `mlir.Compiled`.
"""

from kbd.worker.mlir.apply import (
    REWRITES,
    TRANSFORM_ENTRY,
    StageError,
    apply_stage,
    pass_pipeline,
    print_module,
)
from kbd.worker.mlir.convention import (
    BENCH_ENTRY,
    CIFACE_PREFIX,
    ENTRY,
    NOOP_BENCH_ENTRY,
    PACKED_PREFIX,
    BufferType,
    add_bench_wrappers,
    results_to_out_params,
)
from kbd.worker.mlir.execution import (
    BenchTimer,
    Compiled,
    external_functions,
    set_target_features,
)
from kbd.worker.mlir.importer import (
    MUTATED_INPUTS,
    import_model,
    import_program,
    module_bytecode,
    module_text,
    mutated_inputs,
    parse_module,
)
from kbd.worker.mlir.rewrites import (
    deallocs_after_last_use,
    fold_transpose_into_matmul,
    hoist_allocas,
    openmp_guided_schedule,
    polynomial_exp,
)

__all__ = [
    "BENCH_ENTRY",
    "CIFACE_PREFIX",
    "ENTRY",
    "MUTATED_INPUTS",
    "NOOP_BENCH_ENTRY",
    "PACKED_PREFIX",
    "REWRITES",
    "TRANSFORM_ENTRY",
    "BenchTimer",
    "BufferType",
    "Compiled",
    "StageError",
    "add_bench_wrappers",
    "apply_stage",
    "deallocs_after_last_use",
    "external_functions",
    "fold_transpose_into_matmul",
    "hoist_allocas",
    "import_model",
    "import_program",
    "module_bytecode",
    "module_text",
    "mutated_inputs",
    "openmp_guided_schedule",
    "parse_module",
    "pass_pipeline",
    "polynomial_exp",
    "print_module",
    "results_to_out_params",
    "set_target_features",
]
