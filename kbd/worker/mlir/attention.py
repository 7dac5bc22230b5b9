"""Attention over long sequences, marked for a blocked schedule (the `kbd-mark-attention`
stage), for `transforms/attention.mlir`.

softmax(Q K^T) V over a long sequence has a score matrix of the sequence length squared per
head (4 MiB at 1024 tokens): computed whole, it is written by the first product, read and
written by the softmax, and read by the second product, each pass from memory. Computed a block
of query rows at a time, a block's scores stay in the cache from their product to the product
with V: the score matrix is never materialised.

Marked: a top-level `linalg.batch_matmul` (the product with V) of static shapes whose left
operand is a softmax-like chain (a row chain, `row_chains`) over the result of another
`linalg.batch_matmul` (the scores), with a rank-3 chain as long as the scores, rows of a
multiple of 64 and query lengths of a multiple of 64 (the script's blocks divide them), and
at least `MIN_SCORES` scores per matrix (shorter ones fit the cache whole, and the per-op
schedules serve them). The chain must feed only the product: a chain whose probabilities are
also a result (attention weights returned) is left alone. Its reductions that keep their
reduced dim are made ones that drop it, as for row chains (tiling needs their results
indexed by loop dims).
"""

from __future__ import annotations

from torch_mlir import ir

from kbd.worker.mlir import row_chains
from kbd.worker.mlir.walk import producer, static_operand_types

VALUES = "kbd.attention"  # the product with V: tiled into blocks of query rows
SCORES = "kbd.attention_scores"  # the product Q K^T: sliced along the keys in each block
ROWS = "kbd.attention_rows"  # the op that ends the softmax: tiled by rows in each block
# Fewer scores per matrix than this (512 x 512, 1 MiB) fit the second-level cache whole.
MIN_SCORES = 512 * 512
QUERY_MULTIPLE = 64  # attention.mlir's block_q divides it


def mark_attention(module: ir.Module) -> int:
    """Mark each long attention's two products and its softmax's last op; returns how many
    attentions were marked."""
    marked = 0
    with module.context, ir.Location.unknown():
        unit = ir.UnitAttr.get()
        for function in module.body.operations:
            if function.operation.name != "func.func":
                continue
            for block in function.regions[0].blocks:
                for op in list(block.operations):
                    found = _attention(op.operation)
                    if found is None:
                        continue
                    end, scores = found
                    op.operation.attributes[VALUES] = unit
                    scores.attributes[SCORES] = unit
                    end.attributes[ROWS] = unit
                    for reduction in row_chains.chain_reductions(end):
                        row_chains.drop_kept_dim(reduction)
                    marked += 1
    return marked


def _attention(op: ir.Operation) -> tuple[ir.Operation, ir.Operation] | None:
    """For the product with V of a long attention, the op that ends its softmax and the
    product of its scores; else None."""
    types = static_operand_types(op) if op.name == "linalg.batch_matmul" else None
    if types is None:
        return None
    shape = list(types[0].shape)  # of the probabilities: [matrices, queries, keys]
    if shape[1] % QUERY_MULTIPLE or shape[1] * shape[2] < MIN_SCORES:
        return None
    probabilities = op.operands[0]
    end = producer(probabilities)
    if (
        end is None
        or end.name != "linalg.generic"
        or len(list(probabilities.uses)) != 1
        or not row_chains.reads_row_reduction(end)
        or row_chains.loop_ranges(end) != shape
    ):
        return None
    scores = _scores(end)
    return None if scores is None else (end, scores)


def _scores(end: ir.Operation) -> ir.Operation | None:
    """The one `linalg.batch_matmul` of the chain's shape that the chain ending at `end` reads,
    through its ops over the same loop ranges; None when there is not exactly one."""
    ranges = row_chains.loop_ranges(end)
    found = [
        source
        for source in row_chains.chain_sources(end)
        if source.name == "linalg.batch_matmul"
        and list(ir.RankedTensorType(source.results[0].type).shape) == ranges
    ]
    return found[0] if len(found) == 1 else None
