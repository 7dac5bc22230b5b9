"""kbd: run KernelBench kernels through MLIR pipelines, one sandboxed worker per kernel.

The package is split in two sides. The supervisor side (cli, catalog, scheduling, limits, store,
reports) never imports torch or torch-mlir; the worker side (`kbd.worker`) does.
"""

__version__ = "0.1.0"
