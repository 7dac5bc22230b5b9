"""The levels-file tools: schema and layout, `kbd levels check`, `generate` and `update-xfail`.

Supervisor side (no torch): `schema` (fields, tiers, layout), `knobs` (size constants, pure
`ast`), `generate` (runs one sandboxed worker per problem; the torch side is
`kbd.worker.generate`), `xfail` (expected failures from a stored sweep), `check`, `cli`.
"""
