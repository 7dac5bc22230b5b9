"""Planning: what to run, read and validated at the edge.

The levels files (`schema`, `catalog`), the typed specification of a run or sweep (`spec`),
pipeline descriptors (`descriptor`), the finder that picks a kernel's family schedule
(`pipelines`, `target`), the machine's resources and per-kernel memory estimates (`limits`),
one command line's own options (`invocation`) and its output paths, checked before work starts
(`paths`).
"""
