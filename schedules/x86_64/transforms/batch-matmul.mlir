// Fast f32 batch_matmul: the matmul recipe (matmul.mlir) with the batch dim tiled by 1 at the
// thread level, so each scf.forall iteration is one M,N block of one matrix. Cache tiles, a
// register tile vectorized into an outer-product micro-kernel,
// contraction -> outer products -> vector.fma (BLIS style: $reg_m broadcast rows of A times one
// $reg_n-wide row of B, accumulated in $reg_m x $reg_n registers across the K loop).
// Variables (set by the descriptor that uses this script):
//   block_m, block_n  M,N block per scf.forall iteration (the thread level; B block in L2)
//   block_k           K block (A panel $reg_m x $block_k and B panel $block_k x $reg_n in L1)
//   reg_m, reg_n      register tile: reg_m * reg_n / lanes accumulators must fit the vector file
// Register tiles that do not divide a block are peeled off its M and N loops: the full tiles
// vectorize without masks, only the edges are masked.
// Runs on linalg-on-tensors, before bufferization; every linalg.batch_matmul with B stored
// K x N is tiled (B stored N x K: batch-matmul-transposed-b.mlir).
module attributes {transform.with_named_sequence} {
  // Peels the last, partial iteration of each loop into a loop of its own; a loop with no
  // partial iteration is left alone.
  transform.named_sequence @peel(%loops: !transform.any_op {transform.readonly}) {
    transform.foreach %loops : !transform.any_op {
    ^bb0(%loop: !transform.any_op):
      transform.include @peel_one failures(suppress) (%loop) : (!transform.any_op) -> ()
    }
    transform.yield
  }

  // Fails (silenceably) when the loop has no partial iteration.
  transform.named_sequence @peel_one(%loop: !transform.any_op {transform.readonly}) {
    %for = transform.cast %loop : !transform.any_op to !transform.op<"scf.for">
    %main, %rest = transform.loop.peel %for
      : (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)
    transform.yield
  }

  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %matmuls = transform.structured.match ops{["linalg.batch_matmul"]}
        attributes{indexing_maps = [affine_map<(b, m, n, k) -> (b, m, k)>,
                                    affine_map<(b, m, n, k) -> (b, k, n)>,
                                    affine_map<(b, m, n, k) -> (b, m, n)>]} in %root
      : (!transform.any_op) -> !transform.any_op
    %func = transform.structured.match ops{["func.func"]} in %root
      : (!transform.any_op) -> !transform.any_op
    // Thread / L2 level: M,N blocks as scf.forall (lowered to OpenMP or to a sequential loop).
    // Each block also initializes its own output tile (torch-mlir: a linalg.fill of zeros)
    // while it is in cache, instead of a pass of its own over the whole output before.
    %blocks = transform.foreach %matmuls : !transform.any_op -> !transform.any_op {
    ^bb0(%matmul: !transform.any_op):
      %init = transform.get_producer_of_operand %matmul[2]
        : (!transform.any_op) -> !transform.any_op
      %block, %forall = transform.structured.tile_using_forall %matmul
          tile_sizes [1, $block_m, $block_n]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      transform.structured.fuse_into_containing_op %init into %forall
        : (!transform.any_op, !transform.any_op) -> (!transform.any_op, !transform.any_op)
      transform.yield %block : !transform.any_op
    }
    // L1 level: K blocks.
    %kblocks, %kloop = transform.structured.tile_using_for %blocks tile_sizes [0, 0, 0, $block_k]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    // A block larger than its matrix (M under block_m, K under block_k) has sizes
    // min(block, rest): folded to constants here (a loop of one iteration goes), else every
    // tile below would have dynamic sizes and vectorize masked.
    transform.apply_patterns to %func {
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    %panels = transform.structured.match ops{["linalg.batch_matmul"]}
        attributes{indexing_maps = [affine_map<(b, m, n, k) -> (b, m, k)>,
                                    affine_map<(b, m, n, k) -> (b, k, n)>,
                                    affine_map<(b, m, n, k) -> (b, m, n)>]} in %root
      : (!transform.any_op) -> !transform.any_op
    // Register level: one reg_m x reg_n tile per step of k.
    %tile, %loops:4 = transform.structured.tile_using_for %panels tile_sizes [1, $reg_m, $reg_n, 1]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op,
                                !transform.any_op, !transform.any_op)
    // Partial register tiles peeled off (N inside each M step, then M), then every tile,
    // full or partial, vectorized.
    transform.include @peel failures(propagate) (%loops#2) : (!transform.any_op) -> ()
    transform.include @peel failures(propagate) (%loops#1) : (!transform.any_op) -> ()
    %tiles = transform.structured.match ops{["linalg.batch_matmul"]}
        attributes{indexing_maps = [affine_map<(b, m, n, k) -> (b, m, k)>,
                                    affine_map<(b, m, n, k) -> (b, k, n)>,
                                    affine_map<(b, m, n, k) -> (b, m, n)>]} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.foreach %tiles : !transform.any_op {
    ^bb0(%one: !transform.any_op):
      transform.structured.vectorize %one vector_sizes [1, $reg_m, $reg_n, 1]
          {create_named_contraction} : !transform.any_op
    }
    transform.apply_patterns to %func {
      transform.apply_patterns.vector.reduction_to_contract
      transform.apply_patterns.vector.transfer_permutation_patterns
    } : !transform.any_op
    // Keep the accumulator in registers across the k loop.
    %all_loops = transform.structured.match interface{LoopLikeInterface} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.apply_licm to %all_loops : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %all_loops : !transform.any_op
    transform.apply_patterns to %func {
      transform.apply_patterns.vector.cast_away_vector_leading_one_dim
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    transform.apply_patterns to %func {
      transform.apply_patterns.vector.lower_contraction lowering_strategy = "outerproduct"
      transform.apply_patterns.vector.lower_outerproduct
    } : !transform.any_op
    // Masked transfers (partial tiles) must be plain masked ops before bufferization.
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
