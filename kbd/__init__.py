"""kbd: run KernelBench kernels through MLIR pipelines, one sandboxed worker per kernel.

The package is split in two sides. The supervisor side never imports torch or torch-mlir; the
worker side (`kbd.worker`) does, and imports nothing of the supervisor's but the contract
(`kbd.shared`). The supervisor's folders are layers, each importing only those below it:
shared, plan, results, bench, caches, engine, views, the features (levels, cluster, daemon),
commands, and the command line (`kbd.cli`). tests/test_layers.py holds the rule.
"""

__version__ = "0.1.0"
