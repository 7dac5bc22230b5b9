// Softmax-like chains between a family's products, one row at a time: each op that
// kbd-mark-row-chains marked (the end of a chain: softmax's division, a norm's scaling) is
// tiled by single rows of its last dim as an scf.forall, and its producers are fused into each
// row: the reductions (max, sum), the element-wise ops between (x - max, exp), their fills.
// Fusion stops at ops that are not tileable (another schedule's blocks: the products). Copies
// made for several users (the exp that the sum and the division read) are merged. The blocks
// are marked kbd.rows, so transforms/reduction.mlir vectorizes their ops by shape.
// One sequence per rank: tile sizes are spelled out.
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %func = transform.structured.match ops{["func.func"]} in %root
      : (!transform.any_op) -> !transform.any_op
    %rank2 = transform.structured.match ops{["linalg.generic"]}
        attributes{kbd.row_chain = 2 : i64} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %rank2 : !transform.any_op {
    ^bb0(%op: !transform.any_op):
      transform.sequence %op : !transform.any_op failures(suppress) {
      ^bb1(%last: !transform.any_op):
        %tiled, %forall = transform.structured.fuse %last tile_sizes [1]
            {use_forall, apply_cleanup}
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        transform.annotate %forall "kbd.rows" : !transform.any_op
      }
    }
    %rank3 = transform.structured.match ops{["linalg.generic"]}
        attributes{kbd.row_chain = 3 : i64} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %rank3 : !transform.any_op {
    ^bb0(%op: !transform.any_op):
      transform.sequence %op : !transform.any_op failures(suppress) {
      ^bb1(%last: !transform.any_op):
        %tiled, %forall = transform.structured.fuse %last tile_sizes [1, 1]
            {use_forall, apply_cleanup}
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        transform.annotate %forall "kbd.rows" : !transform.any_op
      }
    }
    %rank4 = transform.structured.match ops{["linalg.generic"]}
        attributes{kbd.row_chain = 4 : i64} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %rank4 : !transform.any_op {
    ^bb0(%op: !transform.any_op):
      transform.sequence %op : !transform.any_op failures(suppress) {
      ^bb1(%last: !transform.any_op):
        %tiled, %forall = transform.structured.fuse %last tile_sizes [1, 1, 1]
            {use_forall, apply_cleanup}
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        transform.annotate %forall "kbd.rows" : !transform.any_op
      }
    }
    transform.apply_cse to %func : !transform.any_op
    transform.yield
  }
}
