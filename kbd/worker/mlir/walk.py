"""Finding ops in a module: the helpers kbd's rewrites share."""

from __future__ import annotations

from torch_mlir import ir


def ops_named(module: ir.Module, name: str) -> list:
    """Every op called `name` in the module, in walk order (collected first: the rewrites then
    change or move them, which a walk in progress must not see)."""
    found = []

    def visit(op) -> ir.WalkResult:
        if op.name == name:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def producer(value: ir.Value) -> ir.Operation | None:
    """The op whose result `value` is (None for a block argument)."""
    owner = value.owner
    return owner.operation if isinstance(owner, ir.Operation | ir.OpView) else None
