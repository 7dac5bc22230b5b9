// Depthwise convolutions, once kbd-depthwise-convs-as-taps has made each an element-wise
// linalg.generic over its taps (attribute kbd.depthwise; dims n, c, oh, ow): blocks of
// $block_c channels of one image per scf.forall iteration, then $width output columns of one
// row per step, vectorized: per tap, one row of the input times a broadcast weight (vector.fma).
// Widths that $width does not divide end in a peeled, masked tile.
// Variables: block_c (channels per block), width (output columns per step, a multiple of the
// host's lanes).
module attributes {transform.with_named_sequence} {
  transform.named_sequence @peel_one(%loop: !transform.any_op {transform.readonly}) {
    %for = transform.cast %loop : !transform.any_op to !transform.op<"scf.for">
    %main, %rest = transform.loop.peel %for
      : (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)
    transform.yield
  }

  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %taps = transform.structured.match ops{["linalg.generic"]} attributes{kbd.depthwise}
        in %root : (!transform.any_op) -> !transform.any_op
    %blocks = transform.foreach %taps : !transform.any_op -> !transform.any_op {
    ^bb0(%op: !transform.any_op):
      %block, %forall = transform.structured.tile_using_forall %op tile_sizes [1, $block_c]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      transform.yield %block : !transform.any_op
    }
    %rows, %loops:4 = transform.structured.tile_using_for %blocks tile_sizes [1, 1, 1, $width]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op,
                                !transform.any_op, !transform.any_op)
    transform.foreach %loops#3 : !transform.any_op {
    ^bb0(%loop: !transform.any_op):
      transform.include @peel_one failures(suppress) (%loop) : (!transform.any_op) -> ()
    }
    %func = transform.structured.match ops{["func.func"]} in %root
      : (!transform.any_op) -> !transform.any_op
    %tiles = transform.structured.match ops{["linalg.generic"]} attributes{kbd.depthwise}
        in %root : (!transform.any_op) -> !transform.any_op
    transform.foreach %tiles : !transform.any_op {
    ^bb0(%tile: !transform.any_op):
      transform.structured.vectorize %tile vector_sizes [1, 1, 1, $width] : !transform.any_op
    }
    transform.apply_patterns to %func {
      transform.apply_patterns.vector.cast_away_vector_leading_one_dim
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    // Masked transfers (a last partial tile) must be plain masked ops before bufferization.
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
