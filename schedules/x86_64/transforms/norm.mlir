// Norms (layer, group, instance and batch norm) as kbd decomposes them (kbd.worker.norms):
// two sums over rows of [R, K, B] blocks (the mean, then the squared deviations from it) and
// one element-wise pass with broadcast operands (x - mean) * scale + bias in the input's shape.
// 1. fuse element-wise producers into their consumers (the squared deviation into its sum);
// 2. each block sum ([p, p, r] with the reduced dim last): one (row, block) per scf.forall
//    iteration, $wide partial sums kept in registers along the block and combined at its end;
// 3. the op writing a result (all dims parallel): $rows outer rows per scf.forall iteration,
//    vectorized $width lanes of the last dim at a time (masked where the size is not a
//    multiple), for ranks 2 to 4.
// Everything else (per-row statistics: a few values per row) is left to the loop lowering.
// Variables: rows (outer rows per block of the result), width (vector lanes per step, a
// multiple of the host's), wide (partial sums per block sum: several registers).
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %func = transform.structured.match ops{["func.func"]} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %func {
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    // One function at a time: a registered pass takes exactly one payload op.
    %fused = transform.foreach %func : !transform.any_op -> !transform.any_op {
    ^bb0(%function_1: !transform.any_op):
      %done_1 = transform.apply_registered_pass "linalg-fuse-elementwise-ops" to %function_1
        : (!transform.any_op) -> !transform.any_op
      transform.yield %done_1 : !transform.any_op
    }
    // Block sums: rank 3, parallel, parallel, reduction.
    %generics = transform.structured.match ops{["linalg.generic"]} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %generics : !transform.any_op {
    ^bb0(%op: !transform.any_op):
      transform.sequence %op : !transform.any_op failures(suppress) {
      ^bb1(%candidate: !transform.any_op):
        %sum = transform.match.structured failures(propagate) %candidate
            : (!transform.any_op) -> !transform.any_op {
        ^bb2(%s: !transform.any_op):
          transform.match.structured.dim %s[0, 1] {parallel} : !transform.any_op
          transform.match.structured.dim %s[2] {reduction} : !transform.any_op
          transform.match.structured.yield %s : !transform.any_op
        }
        %row, %forall = transform.structured.tile_using_forall %sum tile_sizes [1, 1]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        %fill, %partial, %combine, %loop = transform.structured.tile_reduction_using_for
            %row by tile_sizes = [0, 0, $wide]
          : (!transform.any_op)
          -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
        transform.structured.vectorize %partial vector_sizes [1, 1, $wide] : !transform.any_op
        transform.structured.vectorize %combine vector_sizes [1, 1, $wide] : !transform.any_op
      }
    }
    // Results: $rows outer rows per block.
    %outputs = transform.structured.match ops{["bufferization.materialize_in_destination"]}
      in %root : (!transform.any_op) -> !transform.any_op
    transform.foreach %outputs : !transform.any_op {
    ^bb0(%output: !transform.any_op):
      transform.sequence %output : !transform.any_op failures(suppress) {
      ^bb1(%store: !transform.any_op):
        %last = transform.get_producer_of_operand %store[0]
          : (!transform.any_op) -> !transform.any_op
        %map = transform.match.structured failures(propagate) %last
            : (!transform.any_op) -> !transform.any_op {
        ^bb2(%s: !transform.any_op):
          transform.match.structured.dim %s[all] {parallel} : !transform.any_op
          transform.match.structured.yield %s : !transform.any_op
        }
        %block, %forall = transform.structured.tile_using_forall %map tile_sizes [$rows]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      }
    }
    %blocks = transform.structured.match ops{["scf.forall"]} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %blocks : !transform.any_op {
    ^bb0(%block: !transform.any_op):
      %generics4 = transform.structured.match ops{["linalg.generic"]} in %block
        : (!transform.any_op) -> !transform.any_op
      transform.foreach %generics4 : !transform.any_op {
      ^bb0(%op: !transform.any_op):
        transform.sequence %op : !transform.any_op failures(suppress) {
        ^bb1(%candidate: !transform.any_op):
          %plane, %l1 = transform.structured.tile_using_for %candidate
              tile_sizes [0, 1, 0, 0]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          %row, %l2 = transform.structured.tile_using_for %plane tile_sizes [0, 0, 1, 0]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          %chunk, %l3 = transform.structured.tile_using_for %row tile_sizes [0, 0, 0, $width]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          transform.structured.vectorize %chunk vector_sizes [$rows, 1, 1, $width]
            : !transform.any_op
        }
      }
      %generics3 = transform.structured.match ops{["linalg.generic"]} in %block
        : (!transform.any_op) -> !transform.any_op
      transform.foreach %generics3 : !transform.any_op {
      ^bb0(%op: !transform.any_op):
        transform.sequence %op : !transform.any_op failures(suppress) {
        ^bb1(%candidate: !transform.any_op):
          %row, %l1 = transform.structured.tile_using_for %candidate tile_sizes [0, 1, 0]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          %chunk, %l2 = transform.structured.tile_using_for %row tile_sizes [0, 0, $width]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          transform.structured.vectorize %chunk vector_sizes [$rows, 1, $width] : !transform.any_op
        }
      }
      %generics2 = transform.structured.match ops{["linalg.generic"]} in %block
        : (!transform.any_op) -> !transform.any_op
      transform.foreach %generics2 : !transform.any_op {
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
    ^bb0(%function_2: !transform.any_op):
      %done_2 = transform.apply_registered_pass "lower-vector-mask" to %function_2
        : (!transform.any_op) -> !transform.any_op
      transform.yield %done_2 : !transform.any_op
    }
    transform.yield
  }
}
