"""The worker side: everything that imports torch and torch-mlir.

`template` is the warm process that forks workers; `child` is a worker's life; `job` runs the
phases using `ingress` (KernelBench -> torch), `mlir` (all MLIR access), `runtime` (symbols the
JIT code needs), `check` (comparison with eager) and `sandbox` (limits).
"""
