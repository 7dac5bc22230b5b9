"""The engine: running kernels in sandboxed workers.

`spawner` starts the warm template and asks it for workers; `runner` supervises one kernel's
worker (heartbeats, memory watch, timeout, classification); `scheduler` admits kernels by cores
and memory; `dumps` and `bundles` collect what a run leaves behind (IR, object files,
reproducer bundles).
"""
