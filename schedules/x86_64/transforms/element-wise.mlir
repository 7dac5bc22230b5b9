// Fused element-wise chains: producers and consumers are fused into one linalg.generic, each
// generic with identity maps is flattened to 1-D and split into $width-wide vector chunks
// (an scf.forall, so threads share them); other generics are left to the loop lowering.
// Variables: width, the vector chunk of the innermost dim (a multiple of the host's lanes).
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %func = transform.structured.match ops{["func.func"]} in %root
      : (!transform.any_op) -> !transform.any_op
    // One function at a time: a registered pass takes exactly one payload op.
    %fused = transform.foreach %func : !transform.any_op -> !transform.any_op {
    ^bb0(%function_1: !transform.any_op):
      %done_1 = transform.apply_registered_pass "linalg-fuse-elementwise-ops" to %function_1
        : (!transform.any_op) -> !transform.any_op
      transform.yield %done_1 : !transform.any_op
    }
    %generics = transform.structured.match ops{["linalg.generic"]} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %generics : !transform.any_op {
    ^bb0(%op: !transform.any_op):
      // Ops that cannot be flattened (broadcasts of non-scalars, transposes) are left to the
      // loop lowering: this sequence's failures are suppressed.
      transform.sequence %op : !transform.any_op failures(suppress) {
      ^bb1(%candidate: !transform.any_op):
        %flat = transform.structured.flatten_elementwise %candidate
          : (!transform.any_op) -> !transform.any_op
        %tiled, %loop = transform.structured.tile_using_forall %flat tile_sizes [$width]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        transform.structured.vectorize %tiled vector_sizes [$width] : !transform.any_op
      }
    }
    %func2 = transform.structured.match ops{["func.func"]} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %func2 {
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    // Masked transfers (a last partial chunk) must be plain masked ops before bufferization.
    %lowered = transform.foreach %func2 : !transform.any_op -> !transform.any_op {
    ^bb0(%function_2: !transform.any_op):
      %done_2 = transform.apply_registered_pass "lower-vector-mask" to %function_2
        : (!transform.any_op) -> !transform.any_op
      transform.yield %done_2 : !transform.any_op
    }
    transform.yield
  }
}
