// Reductions and what surrounds them (softmax, log_softmax, sum/mean/max over a dim, ...), one
// block of $rows outer rows per scf.forall iteration with the whole chain fused into it:
// 1. drop unused results (the argmax that torch's max computes alongside softmax's max), fold
//    unit dims and fuse element-wise producers into their consumers;
// 2. tile the op that writes the function's result by $rows along its outer dim, as an
//    scf.forall, and fuse every producer into it (copies made for several users are merged);
// 3. vectorize each op of a block, $width lanes at a time (masked where the size is not a
//    multiple): a reduction over an inner dim of a 3-D op ([p, r, p], e.g. sum over dim 1)
//    reads one row of $width at each step and keeps its accumulators in registers; a reduction
//    over the last dim ([p, r]) accumulates $width partial results and combines them at the
//    end; other ops go in $width-wide chunks.
// An op a step does not apply to is left to the loop lowering (that step's failures are
// suppressed), and so is a chain whose outer dim is reduced (nothing to tile in parallel).
// Variables: rows (outer rows per block), width (vector lanes per step, a multiple of the
// host's), wide (lanes per step of an inner-dim reduction: several registers).
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %func = transform.structured.match ops{["func.func"]} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %func {
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    // One function at a time: a registered pass takes exactly one payload op.
    %folded = transform.foreach %func : !transform.any_op -> !transform.any_op {
    ^bb0(%function_1: !transform.any_op):
      %done_1 = transform.apply_registered_pass "linalg-fold-unit-extent-dims" to %function_1
        : (!transform.any_op) -> !transform.any_op
      transform.yield %done_1 : !transform.any_op
    }
    %fused = transform.foreach %folded : !transform.any_op -> !transform.any_op {
    ^bb0(%function_2: !transform.any_op):
      %done_2 = transform.apply_registered_pass "linalg-fuse-elementwise-ops" to %function_2
        : (!transform.any_op) -> !transform.any_op
      transform.yield %done_2 : !transform.any_op
    }
    %outputs = transform.structured.match ops{["bufferization.materialize_in_destination"]}
      in %root : (!transform.any_op) -> !transform.any_op
    transform.foreach %outputs : !transform.any_op {
    ^bb0(%output: !transform.any_op):
      transform.sequence %output : !transform.any_op failures(suppress) {
      ^bb1(%store: !transform.any_op):
        %last = transform.get_producer_of_operand %store[0]
          : (!transform.any_op) -> !transform.any_op
        transform.match.operation_name %last ["linalg.generic"] : !transform.any_op
        %tiled, %forall = transform.structured.fuse %last tile_sizes [$rows]
            {use_forall, apply_cleanup}
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      }
    }
    transform.apply_cse to %fused : !transform.any_op
    %blocks = transform.structured.match ops{["scf.forall"]} in %root
      : (!transform.any_op) -> !transform.any_op
    // One block at a time: `match ... in` takes exactly one op (a function returning several
    // results has an scf.forall for each).
    transform.foreach %blocks : !transform.any_op {
    ^bb0(%block: !transform.any_op):
      // Inner-dim reductions of 3-D ops (and 3-D element-wise ops): $wide lanes of the last dim,
      // one step of the middle dim at a time. With keepdim the block's op has a unit dim more.
      %generics4 = transform.structured.match ops{["linalg.generic"]} in %block
        : (!transform.any_op) -> !transform.any_op
      transform.foreach %generics4 : !transform.any_op {
      ^bb0(%op: !transform.any_op):
        transform.sequence %op : !transform.any_op failures(suppress) {
        ^bb1(%candidate: !transform.any_op):
          %columns, %loop = transform.structured.tile_using_for %candidate
              tile_sizes [0, 0, 0, $wide]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          %step, %inner = transform.structured.tile_using_for %columns tile_sizes [0, 0, 1, 0]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          transform.structured.vectorize %step vector_sizes [$rows, 1, 1, $wide]
            : !transform.any_op
        }
      }
      %generics3 = transform.structured.match ops{["linalg.generic"]} in %block
        : (!transform.any_op) -> !transform.any_op
      transform.foreach %generics3 : !transform.any_op {
      ^bb0(%op: !transform.any_op):
        transform.sequence %op : !transform.any_op failures(suppress) {
        ^bb1(%candidate: !transform.any_op):
          %columns, %loop = transform.structured.tile_using_for %candidate tile_sizes [0, 0, $wide]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          %step, %inner = transform.structured.tile_using_for %columns tile_sizes [0, 1, 0]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          transform.structured.vectorize %step vector_sizes [$rows, 1, $wide] : !transform.any_op
        }
      }
      // Last-dim reductions: $width partial results per row, combined after the loop.
      %generics2 = transform.structured.match ops{["linalg.generic"]} in %block
        : (!transform.any_op) -> !transform.any_op
      transform.foreach %generics2 : !transform.any_op {
      ^bb0(%op: !transform.any_op):
        transform.sequence %op : !transform.any_op failures(suppress) {
        ^bb1(%candidate: !transform.any_op):
          %fill, %partial, %combine, %loop = transform.structured.tile_reduction_using_for
              %candidate by tile_sizes = [0, $width]
            : (!transform.any_op)
            -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
          transform.structured.vectorize %partial vector_sizes [$rows, $width] : !transform.any_op
          transform.structured.vectorize %combine vector_sizes [$rows, $width] : !transform.any_op
        }
      }
      // Everything else of a 2-D block: $width-wide chunks of the last dim.
      %rest = transform.structured.match ops{["linalg.generic"]} in %block
        : (!transform.any_op) -> !transform.any_op
      transform.foreach %rest : !transform.any_op {
      ^bb0(%op: !transform.any_op):
        transform.sequence %op : !transform.any_op failures(suppress) {
        ^bb1(%candidate: !transform.any_op):
          %chunk, %loop = transform.structured.tile_using_for %candidate tile_sizes [0, $width]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          transform.structured.vectorize %chunk vector_sizes [$rows, $width] : !transform.any_op
        }
      }
    }
    // Keep accumulators in registers across their loops; lower what vectorization left.
    %loops = transform.structured.match interface{LoopLikeInterface} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.apply_licm to %loops : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loops : !transform.any_op
    transform.apply_patterns to %fused {
      transform.apply_patterns.vector.cast_away_vector_leading_one_dim
      transform.apply_patterns.vector.multi_reduction_flattening lowering_strategy = "innerreduction"
      transform.apply_patterns.vector.multi_reduction_unrolling lowering_strategy = "innerreduction"
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    %loops2 = transform.structured.match interface{LoopLikeInterface} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loops2 : !transform.any_op
    // Masked transfers (a last partial chunk) must be plain masked ops before bufferization.
    %lowered = transform.foreach %fused : !transform.any_op -> !transform.any_op {
    ^bb0(%function_3: !transform.any_op):
      %done_3 = transform.apply_registered_pass "lower-vector-mask" to %function_3
        : (!transform.any_op) -> !transform.any_op
      transform.yield %done_3 : !transform.any_op
    }
    transform.yield
  }
}
