// Matmuls of few rows with B stored N x K (`nn.Linear`: y = x W^T, once
// kbd-fold-transpose-into-matmul has folded the weight's transpose into the matmul's maps):
// memory bound like a matrix-vector product, so B is streamed once, along its contiguous K.
// N blocks are the iterations of an scf.forall (threads share them); in a block, $reg_n rows
// of B at a time meet $reg_m rows of A, $width lanes of K per step, into
// $reg_m x $reg_n x $width partial sums kept in registers, summed across lanes at the end of
// the row. A (a few rows) stays in cache while B streams by.
// Variables: block_n (rows of B per block), reg_m, reg_n (register tile: reg_m * reg_n
// accumulators of $width lanes), width (lanes per step, a multiple of the host's).
// Other matmuls (B stored K x N) are left to matmul.mlir.
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %matmuls = transform.structured.match ops{["linalg.matmul"]}
        attributes{indexing_maps = [affine_map<(m, n, k) -> (m, k)>,
                                    affine_map<(m, n, k) -> (n, k)>,
                                    affine_map<(m, n, k) -> (m, n)>]} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %matmuls : !transform.any_op {
    ^bb0(%matmul: !transform.any_op):
      %init = transform.get_producer_of_operand %matmul[2]
        : (!transform.any_op) -> !transform.any_op
      %block, %forall = transform.structured.tile_using_forall %matmul tile_sizes [0, $block_n]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      transform.structured.fuse_into_containing_op %init into %forall
        : (!transform.any_op, !transform.any_op) -> (!transform.any_op, !transform.any_op)
      // Rows of B outer, rows of A inner: B's rows are reused from L1 by every row block of A.
      %columns, %nloop = transform.structured.tile_using_for %block tile_sizes [0, $reg_n]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      %tile, %mloop = transform.structured.tile_using_for %columns tile_sizes [$reg_m, 0]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      %fill, %partial, %combine, %kloop = transform.structured.tile_reduction_using_for %tile
          by tile_sizes = [0, 0, $width]
        : (!transform.any_op)
        -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
      transform.structured.vectorize %partial vector_sizes [$reg_m, $reg_n, $width]
        : !transform.any_op
      transform.structured.vectorize %combine vector_sizes [$reg_m, $reg_n, $width]
        : !transform.any_op
    }
    %func = transform.structured.match ops{["func.func"]} in %root
      : (!transform.any_op) -> !transform.any_op
    // Keep the partial sums in registers across the K loop.
    %loops = transform.structured.match interface{LoopLikeInterface} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.apply_licm to %loops : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loops : !transform.any_op
    transform.apply_patterns to %func {
      transform.apply_patterns.vector.cast_away_vector_leading_one_dim
      transform.apply_patterns.vector.multi_reduction_flattening lowering_strategy = "innerreduction"
      transform.apply_patterns.vector.multi_reduction_unrolling lowering_strategy = "innerreduction"
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    // One function at a time: a registered pass takes exactly one payload op.
    %lowered = transform.foreach %func : !transform.any_op -> !transform.any_op {
    ^bb0(%function_1: !transform.any_op):
      %done_1 = transform.apply_registered_pass "lower-vector-mask" to %function_1
        : (!transform.any_op) -> !transform.any_op
      transform.yield %done_1 : !transform.any_op
    }
    transform.yield
  }
}
