// Every named linalg op outside the blocks (`scf.forall`s) a family schedule made becomes a
// `linalg.generic` (as `linalg-generalize-named-ops` does to all), so that the epilogue's
// fusion and vectorization take it: the transposes, broadcasts, fills and element-wise ops
// torch-mlir left between the schedule's products.
// Ops inside a block stay as the schedule left them: a matmul block's fill of its own output
// tile, once a generic, would be fused into a fill of a new tensor that no longer depends on
// the block, and hoisted out of the parallel loop (one thread filling a shared tile).
// `foreach_match` tries the matchers in order on every op: one inside a block is kept first.
module attributes {transform.with_named_sequence} {
  transform.named_sequence @in_block(%op: !transform.any_op {transform.readonly})
      -> !transform.any_op {
    %block = transform.get_parent_op %op {op_name = "scf.forall"}
      : (!transform.any_op) -> !transform.any_op
    transform.yield %op : !transform.any_op
  }

  transform.named_sequence @structured(%op: !transform.any_op {transform.readonly})
      -> !transform.any_op {
    transform.match.structured %op : !transform.any_op {
    ^bb0(%s: !transform.any_op):
      transform.match.structured.yield
    }
    transform.yield %op : !transform.any_op
  }

  transform.named_sequence @keep(%op: !transform.any_op {transform.readonly}) {
    transform.yield
  }

  transform.named_sequence @generalize(%op: !transform.any_op {transform.consumed}) {
    %generic = transform.structured.generalize %op : (!transform.any_op) -> !transform.any_op
    transform.yield
  }

  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.consumed}) {
    %updated = transform.foreach_match in %root
        @in_block -> @keep, @structured -> @generalize
      : (!transform.any_op) -> !transform.any_op
    transform.yield
  }
}
