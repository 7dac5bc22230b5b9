// Matrix times vector f32 (linalg.matvec, and linalg.matmul with one output column): memory
// bound, so each row of A is streamed once, $width lanes at a time, into $width partial sums
// per row that are combined at the end of the row. Blocks of $rows rows are the iterations of
// an scf.forall (threads share them). Other ops are left to the loop lowering.
// Variables: rows (rows per block), width (lanes per step, a multiple of the host's).
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %matvecs = transform.structured.match ops{["linalg.matvec"]} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %matvecs : !transform.any_op {
    ^bb0(%op: !transform.any_op):
      %block, %forall = transform.structured.tile_using_forall %op tile_sizes [$rows]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      %fill, %partial, %combine, %loop = transform.structured.tile_reduction_using_for %block
          by tile_sizes = [0, $width]
        : (!transform.any_op)
        -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
      transform.structured.vectorize %partial vector_sizes [$rows, $width] : !transform.any_op
      transform.structured.vectorize %combine vector_sizes [$rows, $width] : !transform.any_op
    }
    %matmuls = transform.structured.match ops{["linalg.matmul"]} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %matmuls : !transform.any_op {
    ^bb0(%op: !transform.any_op):
      // Only a matmul with one output column (N = 1) is a matrix-vector product.
      transform.sequence %op : !transform.any_op failures(suppress) {
      ^bb1(%candidate: !transform.any_op):
        %block, %forall = transform.structured.tile_using_forall %candidate tile_sizes [$rows, 1]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        %fill, %partial, %combine, %loop = transform.structured.tile_reduction_using_for %block
            by tile_sizes = [0, 0, $width]
          : (!transform.any_op)
          -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
        transform.structured.vectorize %partial vector_sizes [$rows, 1, $width]
          : !transform.any_op
        transform.structured.vectorize %combine vector_sizes [$rows, 1, $width]
          : !transform.any_op
      }
    }
    %func = transform.structured.match ops{["func.func"]} in %root
      : (!transform.any_op) -> !transform.any_op
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
