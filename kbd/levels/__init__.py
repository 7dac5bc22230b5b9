"""The levels-file tools: `kbd levels check`, `generate` and `update-xfail`.

Supervisor side (no torch): `cli` (the parsers), `check` (every levels file against its
KernelBench problems), `generate` (runs one sandboxed worker per problem; the torch side is
`kbd.worker.generate`, with `kbd.worker.knobs`), `xfail` (expected failures from a stored
sweep). The schema of a levels file is `kbd.plan.schema`: planning reads the files too.
"""
