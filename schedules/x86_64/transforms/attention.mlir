// Attention over long sequences, one block of query rows at a time: softmax(Q K^T) V, whose
// products and softmax kbd-mark-attention marked (kbd.attention on the product with V,
// kbd.attention_scores on the product Q K^T, kbd.attention_rows on the op that ends the
// softmax). The product with V is tiled into an scf.forall over (matrix, $block_q query rows)
// and its producers are fused into each block: the scores' product, the softmax, and the
// element-wise ops and copies that feed them (Q's scale, the head split) as far as they are
// tileable; the projections are the matmul schedule's blocks by now, so fusion stops there.
// Each block's scores ($block_q rows of the key length) live in the cache between the two
// products instead of the whole score matrix in memory.
// In each block, the scores' product is split into slices of $block_k keys (an scf.forall
// with its fill fused, as batch-matmul.mlir expects of a product; a parallel loop inside a
// parallel loop runs on the thread that meets it): fusion of the softmax into rows then stops
// at those slices instead of computing the scores one row at a time. The softmax is tiled by single rows with its ops fused into each row, as
// row-chains.mlir does, and marked kbd.rows for reduction.mlir. The products left in each
// block are linalg.batch_matmuls, vectorized by batch-matmul(-transposed-b).mlir after this.
// Variables: block_q (query rows per block; divides the query length: kbd-mark-attention
// marks only lengths that are multiples of 64), block_k (keys per slice of the scores).
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %func = transform.structured.match ops{["func.func"]} in %root
      : (!transform.any_op) -> !transform.any_op
    %values = transform.structured.match ops{["linalg.batch_matmul"]}
        attributes{kbd.attention} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %values : !transform.any_op {
    ^bb0(%product: !transform.any_op):
      %tiled, %forall = transform.structured.fuse %product tile_sizes [1, $block_q]
          {use_forall, apply_cleanup}
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    }
    // Fusion clones a producer for each of its uses; with the block's indices folded
    // (linearize_index of [i, 0]), CSE merges the clones.
    transform.apply_patterns to %func {
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    transform.apply_cse to %func : !transform.any_op
    %scores = transform.structured.match ops{["linalg.batch_matmul"]}
        attributes{kbd.attention_scores} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %scores : !transform.any_op {
    ^bb0(%product: !transform.any_op):
      %init = transform.get_producer_of_operand %product[2]
        : (!transform.any_op) -> !transform.any_op
      %slice, %slices = transform.structured.tile_using_forall %product
          tile_sizes [0, 0, $block_k]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      transform.structured.fuse_into_containing_op %init into %slices
        : (!transform.any_op, !transform.any_op) -> (!transform.any_op, !transform.any_op)
    }
    %rows = transform.structured.match ops{["linalg.generic"]}
        attributes{kbd.attention_rows} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %rows : !transform.any_op {
    ^bb0(%last: !transform.any_op):
      %row, %forall = transform.structured.fuse %last tile_sizes [1, 1]
          {use_forall, apply_cleanup}
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      transform.annotate %forall "kbd.rows" : !transform.any_op
    }
    transform.apply_patterns to %func {
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    transform.apply_cse to %func : !transform.any_op
    transform.yield
  }
}
