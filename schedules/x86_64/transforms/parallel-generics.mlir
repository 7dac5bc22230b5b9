// Vectorized, parallel element-wise work left over by a family's schedule (its epilogue, copies
// and fills), as marked by kbd-mark-parallel-generics: each all-parallel linalg.generic of rank
// R is an scf.forall over its outer R - 1 dims (one row per iteration, so threads share them),
// each row in $width-wide vector chunks, the last one masked. An op that does not vectorize (a
// gather in its body) stays a parallel loop over rows, lowered to scalar loops.
// One sequence per rank: tile sizes are spelled out.
// Variables: width, the vector chunk (a multiple of the host's lanes).
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    // Copies that swap their last two dims (kbd.transpose): 16 rows of the output per block,
    // 16 x 16 tiles in each, read along the input's rows and transposed in registers.
    %transpose2 = transform.structured.match ops{["linalg.generic"]}
        attributes{kbd.transpose = 2 : i64} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %transpose2 : !transform.any_op {
    ^bb0(%op: !transform.any_op):
      transform.sequence %op : !transform.any_op failures(suppress) {
      ^bb1(%generic: !transform.any_op):
        %rows, %blocks = transform.structured.tile_using_forall %generic tile_sizes [16]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        %tile, %tiles = transform.structured.tile_using_for %rows tile_sizes [0, 16]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        transform.structured.vectorize %tile vector_sizes [16, 16] : !transform.any_op
      }
    }
    %transpose3 = transform.structured.match ops{["linalg.generic"]}
        attributes{kbd.transpose = 3 : i64} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %transpose3 : !transform.any_op {
    ^bb0(%op: !transform.any_op):
      transform.sequence %op : !transform.any_op failures(suppress) {
      ^bb1(%generic: !transform.any_op):
        %rows, %blocks = transform.structured.tile_using_forall %generic tile_sizes [1, 16]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        %tile, %tiles = transform.structured.tile_using_for %rows tile_sizes [0, 0, 16]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        transform.structured.vectorize %tile vector_sizes [1, 16, 16] : !transform.any_op
      }
    }
    %transposing = transform.structured.match ops{["func.func"]} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %transposing {
      transform.apply_patterns.vector.transfer_permutation_patterns
      transform.apply_patterns.vector.cast_away_vector_leading_one_dim
      transform.apply_patterns.vector.lower_transpose lowering_strategy = "shuffle_16x16"
    } : !transform.any_op
    %rank1 = transform.structured.match ops{["linalg.generic"]} attributes{kbd.rank = 1 : i64} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %rank1 : !transform.any_op {
    ^bb0(%op: !transform.any_op):
      transform.sequence %op : !transform.any_op failures(suppress) {
      ^bb1(%generic: !transform.any_op):
        %chunk, %chunks = transform.structured.tile_using_forall %generic tile_sizes [$width]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        transform.structured.vectorize %chunk vector_sizes [$width] : !transform.any_op
      }
    }
    %rank2 = transform.structured.match ops{["linalg.generic"]} attributes{kbd.rank = 2 : i64} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %rank2 : !transform.any_op {
    ^bb0(%op: !transform.any_op):
      transform.sequence %op : !transform.any_op failures(suppress) {
      ^bb1(%generic: !transform.any_op):
        %row, %rows = transform.structured.tile_using_forall %generic tile_sizes [1]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        %chunk, %chunks = transform.structured.tile_using_for %row tile_sizes [0, $width]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        transform.structured.vectorize %chunk vector_sizes [1, $width] : !transform.any_op
      }
    }
    %rank3 = transform.structured.match ops{["linalg.generic"]} attributes{kbd.rank = 3 : i64} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %rank3 : !transform.any_op {
    ^bb0(%op: !transform.any_op):
      transform.sequence %op : !transform.any_op failures(suppress) {
      ^bb1(%generic: !transform.any_op):
        %row, %rows = transform.structured.tile_using_forall %generic tile_sizes [1, 1]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        %chunk, %chunks = transform.structured.tile_using_for %row tile_sizes [0, 0, $width]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        transform.structured.vectorize %chunk vector_sizes [1, 1, $width] : !transform.any_op
      }
    }
    %rank4 = transform.structured.match ops{["linalg.generic"]} attributes{kbd.rank = 4 : i64} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %rank4 : !transform.any_op {
    ^bb0(%op: !transform.any_op):
      transform.sequence %op : !transform.any_op failures(suppress) {
      ^bb1(%generic: !transform.any_op):
        %row, %rows = transform.structured.tile_using_forall %generic tile_sizes [1, 1, 1]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        %chunk, %chunks = transform.structured.tile_using_for %row tile_sizes [0, 0, 0, $width]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        transform.structured.vectorize %chunk vector_sizes [1, 1, 1, $width] : !transform.any_op
      }
    }
    %rank5 = transform.structured.match ops{["linalg.generic"]} attributes{kbd.rank = 5 : i64} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %rank5 : !transform.any_op {
    ^bb0(%op: !transform.any_op):
      transform.sequence %op : !transform.any_op failures(suppress) {
      ^bb1(%generic: !transform.any_op):
        %row, %rows = transform.structured.tile_using_forall %generic tile_sizes [1, 1, 1, 1]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        %chunk, %chunks = transform.structured.tile_using_for %row tile_sizes [0, 0, 0, 0, $width]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        transform.structured.vectorize %chunk vector_sizes [1, 1, 1, 1, $width] : !transform.any_op
      }
    }
    %rank6 = transform.structured.match ops{["linalg.generic"]} attributes{kbd.rank = 6 : i64} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %rank6 : !transform.any_op {
    ^bb0(%op: !transform.any_op):
      transform.sequence %op : !transform.any_op failures(suppress) {
      ^bb1(%generic: !transform.any_op):
        %row, %rows = transform.structured.tile_using_forall %generic tile_sizes [1, 1, 1, 1, 1]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        %chunk, %chunks = transform.structured.tile_using_for %row tile_sizes [0, 0, 0, 0, 0, $width]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        transform.structured.vectorize %chunk vector_sizes [1, 1, 1, 1, 1, $width] : !transform.any_op
      }
    }
    %func = transform.structured.match ops{["func.func"]} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %func {
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    // Masked transfers (a row's last partial chunk) must be plain masked ops before
    // bufferization.
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
