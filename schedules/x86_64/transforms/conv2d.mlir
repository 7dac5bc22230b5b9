// Fast f32 2-D convolution (linalg.conv_2d_nchw_fchw: torch's Conv2d with groups=1, and the
// transposed convolutions torch-mlir rewrites into one), computed directly, without an im2col
// buffer. The micro-kernel keeps a $reg_f x $reg_w tile of the output (filters x output columns)
// in registers across the whole reduction (input channels, kernel rows, kernel columns); each
// step broadcasts $reg_f filter values and multiplies them by one $reg_w-wide row of the input:
// $reg_f x $reg_w / lanes vector.fma per step, the matmul micro-kernel with K = C * KH * KW.
// Variables (set by the descriptor that uses this script):
//   block_oh     output rows per scf.forall iteration (the thread level: one image, all filters)
//   reg_f        filters per register tile (rows of broadcasts)
//   reg_w        output columns per register tile (a multiple of the vector width)
// Output widths that $reg_w does not divide end in narrower register tiles of 16, 8 and 4
// columns (then 1 to 3), peeled so that every tile has a static width that is a power of two:
// the conv vectorizer needs static shapes, and LLVM splits odd widths such as <24 x f32> into
// slow shuffles. Filters that $reg_f does not divide end in one narrower tile, peeled too.
// Strided convolutions are rewritten into stride-1 ones first (kbd-strided-convs-as-phases);
// depthwise ones are depthwise.mlir's; grouped ones are made one conv per group first
// (kbd-grouped-convs-as-convs).
// Runs on linalg-on-tensors, before bufferization.
module attributes {transform.with_named_sequence} {
  // Peels the last, partial iteration of each loop off into a loop of its own (bounds all
  // static, so canonicalization makes its tile shapes static). Returns the main loops and the
  // remainder loops; a loop with no partial iteration is left alone and has no remainder.
  transform.named_sequence @peel(%loops: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_op) {
    %mains, %rests = transform.foreach %loops : !transform.any_op
        -> !transform.any_op, !transform.any_op {
    ^bb0(%loop: !transform.any_op):
      %main, %rest = transform.include @peel_one failures(suppress) (%loop)
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      transform.yield %main, %rest : !transform.any_op, !transform.any_op
    }
    transform.yield %mains, %rests : !transform.any_op, !transform.any_op
  }

  // Fails (silenceably) when the loop has no partial iteration.
  transform.named_sequence @peel_one(%loop: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_op) {
    %for = transform.cast %loop : !transform.any_op to !transform.op<"scf.for">
    %main, %rest = transform.loop.peel %for
      : (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)
    transform.yield %main, %rest : !transform.any_op, !transform.any_op
  }

  // The convolution left in each peeled remainder loop, tiled by `width` along its output
  // columns and peeled again; returns the new remainder loops. Taken one at a time: `match`
  // needs a single op to search in, and a tile size given as a param applies to a single op.
  transform.named_sequence @narrower(%rests: !transform.any_op {transform.readonly},
                                     %width: !transform.param<i64> {transform.readonly})
      -> !transform.any_op {
    %next = transform.foreach %rests : !transform.any_op -> !transform.any_op {
    ^bb0(%rest: !transform.any_op):
      %conv = transform.structured.match ops{["linalg.conv_2d_nchw_fchw"]} in %rest
        : (!transform.any_op) -> !transform.any_op
      %tile, %loop = transform.structured.tile_using_for %conv tile_sizes [0, 0, 0, %width]
        : (!transform.any_op, !transform.param<i64>) -> (!transform.any_op, !transform.any_op)
      %main, %rest_loop = transform.include @peel failures(propagate) (%loop)
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      transform.yield %rest_loop : !transform.any_op
    }
    transform.yield %next : !transform.any_op
  }

  // @narrower for 1-D convolutions (dims n, f, ow, c, kw).
  transform.named_sequence @narrower_1d(%rests: !transform.any_op {transform.readonly},
                                        %width: !transform.param<i64> {transform.readonly})
      -> !transform.any_op {
    %next = transform.foreach %rests : !transform.any_op -> !transform.any_op {
    ^bb0(%rest: !transform.any_op):
      %conv = transform.structured.match ops{["linalg.conv_1d_ncw_fcw"]} in %rest
        : (!transform.any_op) -> !transform.any_op
      %tile, %loop = transform.structured.tile_using_for %conv tile_sizes [0, 0, %width]
        : (!transform.any_op, !transform.param<i64>) -> (!transform.any_op, !transform.any_op)
      %main, %rest_loop = transform.include @peel failures(propagate) (%loop)
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      transform.yield %rest_loop : !transform.any_op
    }
    transform.yield %next : !transform.any_op
  }

  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %convs = transform.structured.match ops{["linalg.conv_2d_nchw_fchw"]} in %root
      : (!transform.any_op) -> !transform.any_op
    %func = transform.structured.match ops{["func.func"]} in %root
      : (!transform.any_op) -> !transform.any_op
    // Thread level: blocks of $block_oh output rows of one image, all filters.
    // Dims: n, f, oh, ow (parallel), c, kh, kw (reduction).
    %blocks = transform.foreach %convs : !transform.any_op -> !transform.any_op {
    ^bb0(%conv: !transform.any_op):
      %block, %forall = transform.structured.tile_using_forall %conv
          tile_sizes [1, 0, $block_oh]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      transform.yield %block : !transform.any_op
    }
    // Register tiles: $reg_f filters x one output row x $reg_w columns, the whole reduction.
    %tiles, %loops:4 = transform.structured.tile_using_for %blocks
        tile_sizes [1, $reg_f, 1, $reg_w]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op,
                                !transform.any_op, !transform.any_op)
    // Columns left over: tiles of 16, 8, then 4 columns (then what remains).
    %main_w, %rest = transform.include @peel failures(propagate) (%loops#3)
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    %w16 = transform.param.constant 16 : i64 -> !transform.param<i64>
    %w8 = transform.param.constant 8 : i64 -> !transform.param<i64>
    %w4 = transform.param.constant 4 : i64 -> !transform.param<i64>
    %rest16 = transform.include @narrower failures(propagate) (%rest, %w16)
      : (!transform.any_op, !transform.param<i64>) -> !transform.any_op
    %rest8 = transform.include @narrower failures(propagate) (%rest16, %w8)
      : (!transform.any_op, !transform.param<i64>) -> !transform.any_op
    %rest4 = transform.include @narrower failures(propagate) (%rest8, %w4)
      : (!transform.any_op, !transform.param<i64>) -> !transform.any_op
    // Filters left over (peeled last: the copy it makes carries the column tiles above).
    %main_f, %rest_f = transform.include @peel failures(propagate) (%loops#1)
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op)

    // 1-D convolutions (torch's conv1d and transposed conv1d; dims n, f, ow, c, kw), the same
    // way, one image per scf.forall iteration (a block of columns would not have static tiles).
    %convs_1d = transform.structured.match ops{["linalg.conv_1d_ncw_fcw"]} in %root
      : (!transform.any_op) -> !transform.any_op
    %blocks_1d = transform.foreach %convs_1d : !transform.any_op -> !transform.any_op {
    ^bb0(%conv: !transform.any_op):
      %block, %forall = transform.structured.tile_using_forall %conv tile_sizes [1]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      transform.yield %block : !transform.any_op
    }
    %tiles_1d, %loops_1d:3 = transform.structured.tile_using_for %blocks_1d
        tile_sizes [1, $reg_f, $reg_w]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op,
                                !transform.any_op)
    %main_w_1d, %rest_1d = transform.include @peel failures(propagate) (%loops_1d#2)
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    %rest16_1d = transform.include @narrower_1d failures(propagate) (%rest_1d, %w16)
      : (!transform.any_op, !transform.param<i64>) -> !transform.any_op
    %rest8_1d = transform.include @narrower_1d failures(propagate) (%rest16_1d, %w8)
      : (!transform.any_op, !transform.param<i64>) -> !transform.any_op
    %rest4_1d = transform.include @narrower_1d failures(propagate) (%rest8_1d, %w4)
      : (!transform.any_op, !transform.param<i64>) -> !transform.any_op
    %main_f_1d, %rest_f_1d = transform.include @peel failures(propagate) (%loops_1d#1)
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op)

    transform.apply_patterns to %func {
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    // Reduction loops inside each register tile, one step each: c, kw for the 1-D tiles...
    %register_tiles_1d = transform.structured.match ops{["linalg.conv_1d_ncw_fcw"]} in %root
      : (!transform.any_op) -> !transform.any_op
    %step_1d, %reduction_1d:2 = transform.structured.tile_using_for %register_tiles_1d
        tile_sizes [0, 0, 0, 1, 1]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op)
    // ... c, kh, kw for the 2-D ones, whose step is one output row and one kernel row: a 1-D
    // convolution.
    %register_tiles = transform.structured.match ops{["linalg.conv_2d_nchw_fchw"]} in %root
      : (!transform.any_op) -> !transform.any_op
    %step, %reduction:3 = transform.structured.tile_using_for %register_tiles
        tile_sizes [0, 0, 0, 0, 1, 1, 1]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op,
                                !transform.any_op)
    %step_2d = transform.structured.decompose %step : (!transform.any_op) -> !transform.any_op
    // Vectorized (the transposes to and from the vectorizer's (n, w, f) layout fold into the
    // contraction).
    transform.structured.vectorize %step_1d : !transform.any_op
    transform.structured.vectorize %step_2d : !transform.any_op
    transform.apply_patterns to %func {
      transform.apply_patterns.vector.reduction_to_contract
      transform.apply_patterns.vector.transfer_permutation_patterns
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    // Keep the output tile in registers across the reduction loops.
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
    transform.yield
  }
}
