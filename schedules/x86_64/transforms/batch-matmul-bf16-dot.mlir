// bf16 batched matmul on avx512_bf16's dot products: matmul-bf16-dot.mlir with a batch
// dimension in front (see there). A viewed as batch x M x K/2 x 2; B copied once into panels,
// batch x N/$reg_n x K/2 x $reg_n x 2; per batch and $block_m x $block_n block of C, in an
// scf.forall: C's zero fill, the product in K blocks and its element-wise epilogue, fused.
// Variables (set by the descriptor that uses this script):
//   block_m, block_n  rows and columns of C per scf.forall iteration (one batch each);
//                     block_n a multiple of reg_n
//   block_k           K block, in pairs of K
//   reg_m, reg_n      register tile: reg_n a multiple of 16 (the panel width), reg_m * reg_n / 16
//                     accumulators
//   pack_panels       panels of B per parallel block of the packing copy (one batch each)
// Applies to the linalg.batch_matmul ops `kbd-fold-bf16-widening-into-batch-matmul` marked
// kbd.bf16_dot, each with an element-wise epilogue marked kbd.bf16_dot_epilogue.
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %matmuls = transform.structured.match ops{["linalg.batch_matmul"]} attributes{kbd.bf16_dot}
        in %root : (!transform.any_op) -> !transform.any_op
    %func = transform.structured.match ops{["func.func"]} in %root
      : (!transform.any_op) -> !transform.any_op
    // Iterations (batch, m, panel, k/2, column of the panel, pair).
    %b_packs = transform.foreach %matmuls : !transform.any_op -> !transform.op<"linalg.pack"> {
    ^bb0(%matmul: !transform.any_op):
      %packed = transform.structured.pack %matmul packed_sizes = [0, 0, $reg_n, 2]
        : (!transform.any_op) -> !transform.op<"linalg.generic">
      %b_pack = transform.get_producer_of_operand %packed[1]
        : (!transform.op<"linalg.generic">) -> !transform.op<"linalg.pack">
      %product, %panels_pack, %none = transform.structured.pack_transpose %b_pack
          with_compute_op(%packed) outer_perm = [0, 2, 1]
        : (!transform.op<"linalg.pack">, !transform.op<"linalg.generic">)
          -> (!transform.op<"linalg.generic">, !transform.op<"linalg.pack">, !transform.any_op)
      transform.annotate %product "kbd.bf16_dot_packed" : !transform.op<"linalg.generic">
      transform.yield %panels_pack : !transform.op<"linalg.pack">
    }
    // A transposed B is packed from B itself.
    transform.apply_patterns to %func {
      transform.apply_patterns.tensor.fold_into_pack_and_unpack
    } : !transform.any_op
    // B's pack: a transposing copy (per batch, K/2 x 2 x panels x columns to panels x K/2 x columns x 2),
    // in parallel blocks of $pack_panels panels, 16 columns at a time.
    transform.foreach %b_packs : !transform.op<"linalg.pack"> {
    ^bb0(%pack: !transform.op<"linalg.pack">):
      %pad, %expand, %transpose = transform.structured.lower_pack %pack
        : (!transform.op<"linalg.pack">) -> (!transform.op<"tensor.pad">,
                                             !transform.op<"tensor.expand_shape">,
                                             !transform.op<"linalg.transpose">)
      %rows, %rows_forall = transform.structured.tile_using_forall %transpose
          tile_sizes [1, $pack_panels]
        : (!transform.op<"linalg.transpose">) -> (!transform.any_op, !transform.any_op)
      %piece, %piece_loops:4 = transform.structured.tile_using_for %rows
          tile_sizes [1, 1, 1, 16]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op,
                                  !transform.any_op, !transform.any_op)
      transform.structured.vectorize %piece vector_sizes [1, 1, 1, 16, 2] : !transform.any_op
    }
    // A's pack is a reshape (its identity transpose folds away).
    %packs = transform.structured.match ops{["linalg.pack"]} in %root
      : (!transform.any_op) -> !transform.op<"linalg.pack">
    transform.foreach %packs : !transform.op<"linalg.pack"> {
    ^bb0(%pack: !transform.op<"linalg.pack">):
      %pad, %expand, %transpose = transform.structured.lower_pack %pack
        : (!transform.op<"linalg.pack">) -> (!transform.op<"tensor.pad">,
                                             !transform.op<"tensor.expand_shape">,
                                             !transform.op<"linalg.transpose">)
    }
    // C's pack of its zero fill becomes a fill of the packed C, A's identity transpose folds.
    transform.apply_patterns to %func {
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    // Per block of C: the epilogue, C's unpack, the product and its fill, fused.
    %epilogues = transform.structured.match ops{["linalg.generic"]}
        attributes{kbd.bf16_dot_epilogue} in %root : (!transform.any_op) -> !transform.any_op
    %blocks = transform.foreach %epilogues : !transform.any_op -> !transform.any_op {
    ^bb0(%epilogue: !transform.any_op):
      %tiled, %forall = transform.structured.fuse %epilogue tile_sizes [1, $block_m, $block_n]
          {use_forall}
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      %block = transform.structured.match ops{["linalg.generic"]}
          attributes{kbd.bf16_dot_packed} in %forall : (!transform.any_op) -> !transform.any_op
      transform.yield %block : !transform.any_op
    }
    // Each block's unpack of C: a reshape.
    %unpacks = transform.structured.match ops{["linalg.unpack"]} in %root
      : (!transform.any_op) -> !transform.op<"linalg.unpack">
    transform.foreach %unpacks : !transform.op<"linalg.unpack"> {
    ^bb0(%unpack: !transform.op<"linalg.unpack">):
      %empty, %transpose, %collapse, %slice, %copy = transform.structured.lower_unpack %unpack
        : (!transform.op<"linalg.unpack">) -> (!transform.op<"tensor.empty">,
                                               !transform.op<"linalg.transpose">,
                                               !transform.op<"tensor.collapse_shape">,
                                               !transform.op<"tensor.extract_slice">,
                                               !transform.op<"linalg.copy">)
    }
    // Rows of A and C padded to whole register tiles (with zeros, where M is not a multiple of
    // $reg_m or a block is cut short), once per block, before its K loop (whose iterations then
    // carry the padded C): a folded no-op where they are whole already.
    %whole_rows, %pads, %copy_back = transform.structured.pad %blocks
        pad_to_multiple_of [$reg_m] {
          padding_values = [0.0 : bf16, 0.0 : bf16, 0.0 : f32], padding_dimensions = [1],
          copy_back_op = "none"
        } : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op)
    %k_blocks, %kloop = transform.structured.tile_using_for %whole_rows tile_sizes [0, 0, 0, $block_k]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    %tile, %loops:4 = transform.structured.tile_using_for %k_blocks
        tile_sizes [1, $reg_m, 1, 1]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op,
                                !transform.any_op, !transform.any_op)
    transform.structured.vectorize %tile vector_sizes [1, $reg_m, 1, 1, $reg_n, 2]
      : !transform.any_op
    transform.apply_patterns to %func {
      transform.apply_patterns.vector.lower_transpose lowering_strategy = "shuffle_1d"
      transform.apply_patterns.vector.reduction_to_contract
      transform.apply_patterns.vector.fold_arith_extension
      transform.apply_patterns.vector.transfer_permutation_patterns
    } : !transform.any_op
    // Keep the accumulator in registers across the k loop.
    %all_loops = transform.structured.match interface{LoopLikeInterface} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.apply_licm to %all_loops : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %all_loops : !transform.any_op
    transform.apply_patterns to %func {
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    transform.yield
  }
}
