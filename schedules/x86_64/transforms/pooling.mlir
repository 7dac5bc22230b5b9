// Poolings, once kbd-poolings-as-taps has made each an element-wise linalg.generic per region
// of its output (attribute kbd.pooling = rank, 3 to 5; dims n, c, then the spatial dims): blocks of
// $block_c channels of one image per scf.forall iteration, then $width output columns of one
// row per step, vectorized: per tap, one row of the input combined into the row's maxima or
// sums in registers. Widths that $width does not divide end in a peeled, masked tile.
// Variables: block_c (channels per block), width (output columns per step, a multiple of the
// host's lanes).
module attributes {transform.with_named_sequence} {
  transform.named_sequence @peel_one(%loop: !transform.any_op {transform.readonly}) {
    %for = transform.cast %loop : !transform.any_op to !transform.op<"scf.for">
    %main, %rest = transform.loop.peel %for
      : (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)
    transform.yield
  }

  transform.named_sequence @blocks(%ops: !transform.any_op {transform.consumed})
      -> !transform.any_op {
    %blocks = transform.foreach %ops : !transform.any_op -> !transform.any_op {
    ^bb0(%op: !transform.any_op):
      %block, %forall = transform.structured.tile_using_forall %op tile_sizes [1, $block_c]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      transform.yield %block : !transform.any_op
    }
    transform.yield %blocks : !transform.any_op
  }

  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %rank3 = transform.structured.match ops{["linalg.generic"]} attributes{kbd.pooling = 3 : i64}
        in %root : (!transform.any_op) -> !transform.any_op
    %blocks3 = transform.include @blocks failures(propagate) (%rank3)
      : (!transform.any_op) -> !transform.any_op
    %rows3, %loops3:3 = transform.structured.tile_using_for %blocks3 tile_sizes [1, 1, $width]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op,
                                !transform.any_op)
    transform.foreach %loops3#2 : !transform.any_op {
    ^bb0(%loop: !transform.any_op):
      transform.include @peel_one failures(suppress) (%loop) : (!transform.any_op) -> ()
    }
    %rank4 = transform.structured.match ops{["linalg.generic"]} attributes{kbd.pooling = 4 : i64}
        in %root : (!transform.any_op) -> !transform.any_op
    %blocks4 = transform.include @blocks failures(propagate) (%rank4)
      : (!transform.any_op) -> !transform.any_op
    %rows4, %loops4:4 = transform.structured.tile_using_for %blocks4 tile_sizes [1, 1, 1, $width]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op,
                                !transform.any_op, !transform.any_op)
    transform.foreach %loops4#3 : !transform.any_op {
    ^bb0(%loop: !transform.any_op):
      transform.include @peel_one failures(suppress) (%loop) : (!transform.any_op) -> ()
    }
    %rank5 = transform.structured.match ops{["linalg.generic"]} attributes{kbd.pooling = 5 : i64}
        in %root : (!transform.any_op) -> !transform.any_op
    %blocks5 = transform.include @blocks failures(propagate) (%rank5)
      : (!transform.any_op) -> !transform.any_op
    %rows5, %loops5:5 = transform.structured.tile_using_for %blocks5
        tile_sizes [1, 1, 1, 1, $width]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op,
                                !transform.any_op, !transform.any_op, !transform.any_op)
    transform.foreach %loops5#4 : !transform.any_op {
    ^bb0(%loop: !transform.any_op):
      transform.include @peel_one failures(suppress) (%loop) : (!transform.any_op) -> ()
    }
    %func = transform.structured.match ops{["func.func"]} in %root
      : (!transform.any_op) -> !transform.any_op
    %tiles3 = transform.structured.match ops{["linalg.generic"]}
        attributes{kbd.pooling = 3 : i64} in %root : (!transform.any_op) -> !transform.any_op
    transform.foreach %tiles3 : !transform.any_op {
    ^bb0(%tile: !transform.any_op):
      transform.structured.vectorize %tile vector_sizes [1, 1, $width] : !transform.any_op
    }
    %tiles4 = transform.structured.match ops{["linalg.generic"]}
        attributes{kbd.pooling = 4 : i64} in %root : (!transform.any_op) -> !transform.any_op
    transform.foreach %tiles4 : !transform.any_op {
    ^bb0(%tile: !transform.any_op):
      transform.structured.vectorize %tile vector_sizes [1, 1, 1, $width] : !transform.any_op
    }
    %tiles5 = transform.structured.match ops{["linalg.generic"]}
        attributes{kbd.pooling = 5 : i64} in %root : (!transform.any_op) -> !transform.any_op
    transform.foreach %tiles5 : !transform.any_op {
    ^bb0(%tile: !transform.any_op):
      transform.structured.vectorize %tile vector_sizes [1, 1, 1, 1, $width] : !transform.any_op
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
