// Reductions and losses (sum/mean/max/min/argmax over a dim, norms, losses to a scalar), in
// parallel blocks of outer rows, each op vectorized by its shape:
// 1. (before this script, in the descriptor) unit dims folded, element-wise producers fused
//    into their consumers (|x|, x^2, (p - t)^2 into the sum that reads them), and a reduction
//    over several trailing dims made one over a single dim (reduction-prologue.yaml);
// 2. the op writing each result, when its outer dim is parallel, is tiled by $rows outer rows as
//    an scf.forall with its producers fused into each block (a row's norm, then the row divided
//    by it, while the row is in cache);
// 3. a reduction over the last dim still outside any block (a loss's row sums: kbd sums a
//    long full reduction as row sums of blocks, then a sum of those) gets blocks of its own;
// 4. in each block, by the shape of the op:
//    - reduction over the middle dim of [p, r, p] or [p, r, p, p] (sum over dim 1 of a 3-D or
//      4-D tensor): one step of the reduced dim at a time, adding whole rows of the last dim
//      $width lanes at a time into the result row (contiguous reads; the result row stays in
//      cache);
//    - reduction over the last dim ([p, r]): $wide partial results per row, combined at the end;
//    - all-parallel ops of rank 2 to 4: $width-wide chunks of the last dim.
// An op a step does not apply to is left to the loop lowering (each step's failures are
// suppressed): argmax and argmin (their index is no combiner the vectorizer knows), the final
// combine of a loss's row sums, a reduction over the outer dim.
// Variables: rows (outer rows per block), width (vector lanes per chunk, a multiple of the
// host's), wide (partial results per row of a last-dim reduction: several registers).
module attributes {transform.with_named_sequence} {
  // Peels the last, partial iteration of a loop into a loop of its own, so that the full chunks
  // vectorize without masks; a loop with no partial iteration is left alone.
  transform.named_sequence @peel(%loop: !transform.any_op {transform.readonly}) {
    transform.sequence %loop : !transform.any_op failures(suppress) {
    ^bb0(%one: !transform.any_op):
      %for = transform.cast %one : !transform.any_op to !transform.op<"scf.for">
      %main, %rest = transform.loop.peel %for
        : (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)
    }
    transform.yield
  }

  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %one = transform.param.constant 1 : i64 -> !transform.param<i64>
    %rank2 = transform.param.constant 2 : i64 -> !transform.param<i64>
    %rank3 = transform.param.constant 3 : i64 -> !transform.param<i64>
    %rank4 = transform.param.constant 4 : i64 -> !transform.param<i64>
    %func = transform.structured.match ops{["func.func"]} in %root
      : (!transform.any_op) -> !transform.any_op
    // 2. Results: $rows outer rows per block, producers fused.
    %outputs = transform.structured.match ops{["bufferization.materialize_in_destination"]}
      in %root : (!transform.any_op) -> !transform.any_op
    transform.foreach %outputs : !transform.any_op {
    ^bb0(%output: !transform.any_op):
      transform.sequence %output : !transform.any_op failures(suppress) {
      ^bb1(%store: !transform.any_op):
        %last = transform.get_producer_of_operand %store[0]
          : (!transform.any_op) -> !transform.any_op
        %outer = transform.match.structured failures(propagate) %last
            : (!transform.any_op) -> !transform.any_op {
        ^bb2(%s: !transform.any_op):
          transform.match.structured.dim %s[0] {parallel} : !transform.any_op
          transform.match.structured.yield %s : !transform.any_op
        }
        %tiled, %forall = transform.structured.fuse %outer tile_sizes [$rows]
            {use_forall, apply_cleanup}
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        transform.annotate %forall "kbd.rows" : !transform.any_op
      }
    }
    transform.apply_cse to %func : !transform.any_op
    // 3. Last-dim reductions outside every block (all other dims parallel): blocks of their
    //    own, $rows rows of a rank-2 or rank-3 op, or of the second dim of a rank-4 one.
    %generics = transform.structured.match ops{["linalg.generic"]} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %generics : !transform.any_op {
    ^bb0(%op: !transform.any_op):
      transform.sequence %op : !transform.any_op failures(suppress) {
      ^bb1(%candidate: !transform.any_op):
        %parent = transform.get_parent_op %candidate {op_name = "scf.forall", allow_empty_results}
          : (!transform.any_op) -> !transform.any_op
        transform.match.operation_empty %parent : !transform.any_op
        %rows = transform.match.structured failures(propagate) %candidate
            : (!transform.any_op) -> !transform.any_op {
        ^bb2(%s: !transform.any_op):
          %rank = transform.match.structured.rank %s : (!transform.any_op) -> !transform.param<i64>
          transform.match.param.cmpi ge %rank, %rank2 : !transform.param<i64>
          transform.match.param.cmpi le %rank, %rank3 : !transform.param<i64>
          transform.match.structured.dim %s[0] {parallel} : !transform.any_op
          transform.match.structured.dim %s[-1] {reduction} : !transform.any_op
          transform.match.structured.dim %s[except(-1)] {parallel} : !transform.any_op
          transform.match.structured.yield %s : !transform.any_op
        }
        %block, %forall = transform.structured.tile_using_forall %rows tile_sizes [$rows]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        transform.annotate %forall "kbd.rows" : !transform.any_op
      }
    }
    %generics4 = transform.structured.match ops{["linalg.generic"]} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %generics4 : !transform.any_op {
    ^bb0(%op: !transform.any_op):
      transform.sequence %op : !transform.any_op failures(suppress) {
      ^bb1(%candidate: !transform.any_op):
        %parent = transform.get_parent_op %candidate {op_name = "scf.forall", allow_empty_results}
          : (!transform.any_op) -> !transform.any_op
        transform.match.operation_empty %parent : !transform.any_op
        %rows = transform.match.structured failures(propagate) %candidate
            : (!transform.any_op) -> !transform.any_op {
        ^bb2(%s: !transform.any_op):
          %rank = transform.match.structured.rank %s : (!transform.any_op) -> !transform.param<i64>
          transform.match.param.cmpi eq %rank, %rank4 : !transform.param<i64>
          transform.match.structured.dim %s[-1] {reduction} : !transform.any_op
          transform.match.structured.dim %s[except(-1)] {parallel} : !transform.any_op
          transform.match.structured.yield %s : !transform.any_op
        }
        %block, %forall = transform.structured.tile_using_forall %rows tile_sizes [1, $rows]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        transform.annotate %forall "kbd.rows" : !transform.any_op
      }
    }
    // 4. Each block's ops, by shape. `match ... in` takes one op at a time. Only the blocks
    //    made above (marked kbd.rows): their ops have at most $rows outer rows. A block another
    //    schedule made (a matmul's, with its partial tiles' fills) is not this script's.
    %blocks = transform.structured.match ops{["scf.forall"]} attributes{kbd.rows} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %blocks : !transform.any_op {
    ^bb0(%block: !transform.any_op):
      // Middle-dim reductions of 3-D ops: a row of the reduced dim at a time.
      %middle3 = transform.structured.match ops{["linalg.generic"]} in %block
        : (!transform.any_op) -> !transform.any_op
      transform.foreach %middle3 : !transform.any_op {
      ^bb0(%op: !transform.any_op):
        transform.sequence %op : !transform.any_op failures(suppress) {
        ^bb1(%candidate: !transform.any_op):
          %m = transform.match.structured failures(propagate) %candidate
              : (!transform.any_op) -> !transform.any_op {
          ^bb2(%s: !transform.any_op):
            %rank = transform.match.structured.rank %s
              : (!transform.any_op) -> !transform.param<i64>
            transform.match.param.cmpi eq %rank, %rank3 : !transform.param<i64>
            transform.match.structured.dim %s[0, 2] {parallel} : !transform.any_op
            transform.match.structured.dim %s[1] {reduction} : !transform.any_op
            %inits = transform.match.structured.num_inits %s
              : (!transform.any_op) -> !transform.param<i64>
            transform.match.param.cmpi eq %inits, %one : !transform.param<i64>
            transform.match.structured.yield %s : !transform.any_op
          }
          %row, %l1 = transform.structured.tile_using_for %m tile_sizes [0, 1, 0]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          %chunk, %l2 = transform.structured.tile_using_for %row tile_sizes [0, 0, $width]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          transform.annotate %chunk "kbd.chunk" : !transform.any_op
          transform.include @peel failures(propagate) (%l2) : (!transform.any_op) -> ()
          %chunks = transform.structured.match ops{["linalg.generic"]} attributes{kbd.chunk}
            in %block : (!transform.any_op) -> !transform.any_op
          transform.foreach %chunks : !transform.any_op {
          ^bb3(%c: !transform.any_op):
            transform.structured.vectorize %c vector_sizes [$rows, 1, $width] : !transform.any_op
          }
        }
      }
      // Middle-dim reductions of 4-D ops ([p, r, p, p]: RMS norm's mean over channels).
      %middle4 = transform.structured.match ops{["linalg.generic"]} in %block
        : (!transform.any_op) -> !transform.any_op
      transform.foreach %middle4 : !transform.any_op {
      ^bb0(%op: !transform.any_op):
        transform.sequence %op : !transform.any_op failures(suppress) {
        ^bb1(%candidate: !transform.any_op):
          %m = transform.match.structured failures(propagate) %candidate
              : (!transform.any_op) -> !transform.any_op {
          ^bb2(%s: !transform.any_op):
            %rank = transform.match.structured.rank %s
              : (!transform.any_op) -> !transform.param<i64>
            transform.match.param.cmpi eq %rank, %rank4 : !transform.param<i64>
            transform.match.structured.dim %s[0, 2, 3] {parallel} : !transform.any_op
            transform.match.structured.dim %s[1] {reduction} : !transform.any_op
            %inits = transform.match.structured.num_inits %s
              : (!transform.any_op) -> !transform.param<i64>
            transform.match.param.cmpi eq %inits, %one : !transform.param<i64>
            transform.match.structured.yield %s : !transform.any_op
          }
          %plane, %l1 = transform.structured.tile_using_for %m tile_sizes [0, 1, 0, 0]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          %row, %l2 = transform.structured.tile_using_for %plane tile_sizes [0, 0, 1, 0]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          %chunk, %l3 = transform.structured.tile_using_for %row tile_sizes [0, 0, 0, $width]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          transform.annotate %chunk "kbd.chunk" : !transform.any_op
          transform.include @peel failures(propagate) (%l3) : (!transform.any_op) -> ()
          %chunks = transform.structured.match ops{["linalg.generic"]} attributes{kbd.chunk}
            in %block : (!transform.any_op) -> !transform.any_op
          transform.foreach %chunks : !transform.any_op {
          ^bb3(%c: !transform.any_op):
            transform.structured.vectorize %c vector_sizes [$rows, 1, 1, $width]
              : !transform.any_op
          }
        }
      }
      // Last-dim reductions: $wide partial results per row, combined after the loop.
      %last = transform.structured.match ops{["linalg.generic"]} in %block
        : (!transform.any_op) -> !transform.any_op
      transform.foreach %last : !transform.any_op {
      ^bb0(%op: !transform.any_op):
        transform.sequence %op : !transform.any_op failures(suppress) {
        ^bb1(%candidate: !transform.any_op):
          %m = transform.match.structured failures(propagate) %candidate
              : (!transform.any_op) -> !transform.any_op {
          ^bb2(%s: !transform.any_op):
            %rank = transform.match.structured.rank %s
              : (!transform.any_op) -> !transform.param<i64>
            transform.match.param.cmpi eq %rank, %rank2 : !transform.param<i64>
            transform.match.structured.dim %s[0] {parallel} : !transform.any_op
            transform.match.structured.dim %s[1] {reduction} : !transform.any_op
            transform.match.structured.yield %s : !transform.any_op
          }
          %fill, %partial, %combine, %loop = transform.structured.tile_reduction_using_for
              %m by tile_sizes = [0, $wide]
            : (!transform.any_op)
            -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
          transform.annotate %partial "kbd.chunk" : !transform.any_op
          transform.include @peel failures(propagate) (%loop) : (!transform.any_op) -> ()
          %chunks = transform.structured.match ops{["linalg.generic"]} attributes{kbd.chunk}
            in %block : (!transform.any_op) -> !transform.any_op
          transform.foreach %chunks : !transform.any_op {
          ^bb3(%c: !transform.any_op):
            transform.structured.vectorize %c vector_sizes [$rows, $wide] : !transform.any_op
          }
          transform.structured.vectorize %combine vector_sizes [$rows, $wide] : !transform.any_op
        }
      }
      // Last-dim reductions of rank 3 and 4: one row at a time, $wide partial results.
      %last3 = transform.structured.match ops{["linalg.generic"]} in %block
        : (!transform.any_op) -> !transform.any_op
      transform.foreach %last3 : !transform.any_op {
      ^bb0(%op: !transform.any_op):
        transform.sequence %op : !transform.any_op failures(suppress) {
        ^bb1(%candidate: !transform.any_op):
          %m = transform.match.structured failures(propagate) %candidate
              : (!transform.any_op) -> !transform.any_op {
          ^bb2(%s: !transform.any_op):
            %rank = transform.match.structured.rank %s
              : (!transform.any_op) -> !transform.param<i64>
            transform.match.param.cmpi eq %rank, %rank3 : !transform.param<i64>
            transform.match.structured.dim %s[-1] {reduction} : !transform.any_op
            transform.match.structured.dim %s[except(-1)] {parallel} : !transform.any_op
            transform.match.structured.yield %s : !transform.any_op
          }
          %row, %l1, %l2 = transform.structured.tile_using_for %m tile_sizes [1, 1, 0]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op)
          %fill, %partial, %combine, %loop = transform.structured.tile_reduction_using_for
              %row by tile_sizes = [0, 0, $wide]
            : (!transform.any_op)
            -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
          transform.annotate %partial "kbd.chunk" : !transform.any_op
          transform.include @peel failures(propagate) (%loop) : (!transform.any_op) -> ()
          %chunks = transform.structured.match ops{["linalg.generic"]} attributes{kbd.chunk}
            in %block : (!transform.any_op) -> !transform.any_op
          transform.foreach %chunks : !transform.any_op {
          ^bb3(%c: !transform.any_op):
            transform.structured.vectorize %c vector_sizes [1, 1, $wide] : !transform.any_op
          }
          transform.structured.vectorize %combine vector_sizes [1, 1, $wide] : !transform.any_op
        }
      }
      %last4 = transform.structured.match ops{["linalg.generic"]} in %block
        : (!transform.any_op) -> !transform.any_op
      transform.foreach %last4 : !transform.any_op {
      ^bb0(%op: !transform.any_op):
        transform.sequence %op : !transform.any_op failures(suppress) {
        ^bb1(%candidate: !transform.any_op):
          %m = transform.match.structured failures(propagate) %candidate
              : (!transform.any_op) -> !transform.any_op {
          ^bb2(%s: !transform.any_op):
            %rank = transform.match.structured.rank %s
              : (!transform.any_op) -> !transform.param<i64>
            transform.match.param.cmpi eq %rank, %rank4 : !transform.param<i64>
            transform.match.structured.dim %s[-1] {reduction} : !transform.any_op
            transform.match.structured.dim %s[except(-1)] {parallel} : !transform.any_op
            transform.match.structured.yield %s : !transform.any_op
          }
          %row, %l1, %l2, %l3 = transform.structured.tile_using_for %m tile_sizes [1, 1, 1, 0]
            : (!transform.any_op)
            -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
          %fill, %partial, %combine, %loop = transform.structured.tile_reduction_using_for
              %row by tile_sizes = [0, 0, 0, $wide]
            : (!transform.any_op)
            -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
          transform.annotate %partial "kbd.chunk" : !transform.any_op
          transform.include @peel failures(propagate) (%loop) : (!transform.any_op) -> ()
          %chunks = transform.structured.match ops{["linalg.generic"]} attributes{kbd.chunk}
            in %block : (!transform.any_op) -> !transform.any_op
          transform.foreach %chunks : !transform.any_op {
          ^bb3(%c: !transform.any_op):
            transform.structured.vectorize %c vector_sizes [1, 1, 1, $wide] : !transform.any_op
          }
          transform.structured.vectorize %combine vector_sizes [1, 1, 1, $wide]
            : !transform.any_op
        }
      }
      // All-parallel ops: $width-wide chunks of the last dim, one row of each outer dim at a time.
      %parallel4 = transform.structured.match ops{["linalg.generic"]} in %block
        : (!transform.any_op) -> !transform.any_op
      transform.foreach %parallel4 : !transform.any_op {
      ^bb0(%op: !transform.any_op):
        transform.sequence %op : !transform.any_op failures(suppress) {
        ^bb1(%candidate: !transform.any_op):
          %m = transform.match.structured failures(propagate) %candidate
              : (!transform.any_op) -> !transform.any_op {
          ^bb2(%s: !transform.any_op):
            %rank = transform.match.structured.rank %s
              : (!transform.any_op) -> !transform.param<i64>
            transform.match.param.cmpi eq %rank, %rank4 : !transform.param<i64>
            transform.match.structured.dim %s[all] {parallel} : !transform.any_op
            transform.match.structured.yield %s : !transform.any_op
          }
          %plane, %l1 = transform.structured.tile_using_for %m tile_sizes [0, 1, 0, 0]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          %row, %l2 = transform.structured.tile_using_for %plane tile_sizes [0, 0, 1, 0]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          %chunk, %l3 = transform.structured.tile_using_for %row tile_sizes [0, 0, 0, $width]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          transform.annotate %chunk "kbd.chunk" : !transform.any_op
          transform.include @peel failures(propagate) (%l3) : (!transform.any_op) -> ()
          %chunks = transform.structured.match ops{["linalg.generic"]} attributes{kbd.chunk}
            in %block : (!transform.any_op) -> !transform.any_op
          transform.foreach %chunks : !transform.any_op {
          ^bb3(%c: !transform.any_op):
            transform.structured.vectorize %c vector_sizes [$rows, 1, 1, $width]
              : !transform.any_op
          }
        }
      }
      %parallel3 = transform.structured.match ops{["linalg.generic"]} in %block
        : (!transform.any_op) -> !transform.any_op
      transform.foreach %parallel3 : !transform.any_op {
      ^bb0(%op: !transform.any_op):
        transform.sequence %op : !transform.any_op failures(suppress) {
        ^bb1(%candidate: !transform.any_op):
          %m = transform.match.structured failures(propagate) %candidate
              : (!transform.any_op) -> !transform.any_op {
          ^bb2(%s: !transform.any_op):
            %rank = transform.match.structured.rank %s
              : (!transform.any_op) -> !transform.param<i64>
            transform.match.param.cmpi eq %rank, %rank3 : !transform.param<i64>
            transform.match.structured.dim %s[all] {parallel} : !transform.any_op
            transform.match.structured.yield %s : !transform.any_op
          }
          %row, %l1 = transform.structured.tile_using_for %m tile_sizes [0, 1, 0]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          %chunk, %l2 = transform.structured.tile_using_for %row tile_sizes [0, 0, $width]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          transform.annotate %chunk "kbd.chunk" : !transform.any_op
          transform.include @peel failures(propagate) (%l2) : (!transform.any_op) -> ()
          %chunks = transform.structured.match ops{["linalg.generic"]} attributes{kbd.chunk}
            in %block : (!transform.any_op) -> !transform.any_op
          transform.foreach %chunks : !transform.any_op {
          ^bb3(%c: !transform.any_op):
            transform.structured.vectorize %c vector_sizes [$rows, 1, $width] : !transform.any_op
          }
        }
      }
      %parallel2 = transform.structured.match ops{["linalg.generic"]} in %block
        : (!transform.any_op) -> !transform.any_op
      transform.foreach %parallel2 : !transform.any_op {
      ^bb0(%op: !transform.any_op):
        transform.sequence %op : !transform.any_op failures(suppress) {
        ^bb1(%candidate: !transform.any_op):
          %m = transform.match.structured failures(propagate) %candidate
              : (!transform.any_op) -> !transform.any_op {
          ^bb2(%s: !transform.any_op):
            %rank = transform.match.structured.rank %s
              : (!transform.any_op) -> !transform.param<i64>
            transform.match.param.cmpi eq %rank, %rank2 : !transform.param<i64>
            transform.match.structured.dim %s[all] {parallel} : !transform.any_op
            transform.match.structured.yield %s : !transform.any_op
          }
          %chunk, %loop = transform.structured.tile_using_for %m tile_sizes [0, $width]
            : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          transform.annotate %chunk "kbd.chunk" : !transform.any_op
          transform.include @peel failures(propagate) (%loop) : (!transform.any_op) -> ()
          %chunks = transform.structured.match ops{["linalg.generic"]} attributes{kbd.chunk}
            in %block : (!transform.any_op) -> !transform.any_op
          transform.foreach %chunks : !transform.any_op {
          ^bb3(%c: !transform.any_op):
            transform.structured.vectorize %c vector_sizes [$rows, $width] : !transform.any_op
          }
        }
      }
    }
    // Keep accumulators in registers across their loops; lower what vectorization left.
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
    %loops2 = transform.structured.match interface{LoopLikeInterface} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loops2 : !transform.any_op
    // Masked transfers (a last partial chunk) must be plain masked ops before bufferization.
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
