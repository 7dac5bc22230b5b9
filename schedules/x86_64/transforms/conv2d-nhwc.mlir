// Fast f32 2-D convolution in channels-last layout (linalg.conv_2d_nhwc_hwcf: what
// kbd-convs-channels-last makes of a convolution whose output rows are narrow and whose filters
// fill whole vectors), computed directly. The micro-kernel keeps a $reg_w x $reg_f tile of the
// output (output columns x filters) in registers across the whole reduction (kernel rows,
// kernel columns, input channels); each step loads $reg_f filter values per channel (contiguous in the
// [KH, KW, C, F] kernel) and multiplies them by $reg_w broadcast input values: $reg_w x
// $reg_f / lanes vector.fma per step. The vectors run along the filters, so a row of 20 output
// columns wastes no lanes, where conv2d.mlir's vectors along the row would use 20 of 32.
// Variables (set by the descriptor that uses this script):
//   block_oh     output rows per scf.forall iteration (the thread level: one image, all filters)
//   reg_w        output columns per register tile (any number: one broadcast each)
//   reg_f        filters per register tile (a multiple of the vector width)
//   reg_c        input channels per step of the reduction
// Output columns that $reg_w does not divide end in one narrower tile; filters that $reg_f does
// not divide end in tiles of 16 and 8 filters (then what remains), each peeled so that every
// tile is static.
// Runs on linalg-on-tensors, before bufferization.
module attributes {transform.with_named_sequence} {
  // Peels the last, partial iteration of each loop off into a loop of its own. Returns the
  // remainder loops; a loop with no partial iteration is left alone and has no remainder.
  transform.named_sequence @peel(%loops: !transform.any_op {transform.readonly})
      -> !transform.any_op {
    %rests = transform.foreach %loops : !transform.any_op -> !transform.any_op {
    ^bb0(%loop: !transform.any_op):
      %rest = transform.include @peel_one failures(suppress) (%loop)
        : (!transform.any_op) -> !transform.any_op
      transform.yield %rest : !transform.any_op
    }
    transform.yield %rests : !transform.any_op
  }

  // Fails (silenceably) when the loop has no partial iteration.
  transform.named_sequence @peel_one(%loop: !transform.any_op {transform.readonly})
      -> !transform.any_op {
    %for = transform.cast %loop : !transform.any_op to !transform.op<"scf.for">
    %main, %rest = transform.loop.peel %for
      : (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)
    transform.yield %rest : !transform.any_op
  }

  // The convolution left in each peeled remainder loop, tiled by `width` along its filters and
  // peeled again; returns the new remainder loops.
  transform.named_sequence @narrower(%rests: !transform.any_op {transform.readonly},
                                     %width: !transform.param<i64> {transform.readonly})
      -> !transform.any_op {
    %next = transform.foreach %rests : !transform.any_op -> !transform.any_op {
    ^bb0(%rest: !transform.any_op):
      %conv = transform.structured.match ops{["linalg.conv_2d_nhwc_hwcf"]} in %rest
        : (!transform.any_op) -> !transform.any_op
      %tile, %loop = transform.structured.tile_using_for %conv tile_sizes [0, 0, 0, %width]
        : (!transform.any_op, !transform.param<i64>) -> (!transform.any_op, !transform.any_op)
      %rest_loop = transform.include @peel failures(propagate) (%loop)
        : (!transform.any_op) -> !transform.any_op
      transform.yield %rest_loop : !transform.any_op
    }
    transform.yield %next : !transform.any_op
  }

  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %convs = transform.structured.match ops{["linalg.conv_2d_nhwc_hwcf"]} in %root
      : (!transform.any_op) -> !transform.any_op
    %func = transform.structured.match ops{["func.func"]} in %root
      : (!transform.any_op) -> !transform.any_op
    // Thread level: blocks of $block_oh output rows of one image, all filters.
    // Dims: n, oh, ow, f (parallel), kh, kw, c (reduction).
    %blocks = transform.foreach %convs : !transform.any_op -> !transform.any_op {
    ^bb0(%conv: !transform.any_op):
      %block, %forall = transform.structured.tile_using_forall %conv
          tile_sizes [1, $block_oh]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      transform.yield %block : !transform.any_op
    }
    // Register tiles: one output row, $reg_w columns x $reg_f filters, the whole reduction.
    %tiles, %loops:4 = transform.structured.tile_using_for %blocks
        tile_sizes [1, 1, $reg_w, $reg_f]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op,
                                !transform.any_op, !transform.any_op)
    // Filters left over: tiles of 16, then 8 (then what remains).
    %rest_f = transform.include @peel failures(propagate) (%loops#3)
      : (!transform.any_op) -> !transform.any_op
    %w16 = transform.param.constant 16 : i64 -> !transform.param<i64>
    %w8 = transform.param.constant 8 : i64 -> !transform.param<i64>
    %rest16 = transform.include @narrower failures(propagate) (%rest_f, %w16)
      : (!transform.any_op, !transform.param<i64>) -> !transform.any_op
    %rest8 = transform.include @narrower failures(propagate) (%rest16, %w8)
      : (!transform.any_op, !transform.param<i64>) -> !transform.any_op
    // Columns left over (peeled last: the copy it makes carries the filter tiles above).
    %rest_w = transform.include @peel failures(propagate) (%loops#2)
      : (!transform.any_op) -> !transform.any_op
    // Static tile sizes: a filter count below $reg_f leaves whole 16-filter tiles whose sizes
    // are min()s of the loop's index, which only the loops' bounds fold.
    transform.apply_patterns to %func {
      transform.apply_patterns.scf.for_loop_canonicalization
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    // Reduction loops inside each register tile, one step each: kh, kw, c; a step is one
    // output row and one kernel row: a 1-D convolution.
    %register_tiles = transform.structured.match ops{["linalg.conv_2d_nhwc_hwcf"]} in %root
      : (!transform.any_op) -> !transform.any_op
    // $reg_c input channels per step: the step's $reg_c x $reg_w broadcasts and $reg_c filter
    // loads are one straight run of FMAs, where one channel per step left LLVM shuffling the
    // $reg_w column pointers between registers on every step. Channels that $reg_c does not
    // divide end in one narrower step, peeled.
    %step, %reduction:3 = transform.structured.tile_using_for %register_tiles
        tile_sizes [0, 0, 0, 0, 1, 1, $reg_c]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op,
                                !transform.any_op)
    %rest_c = transform.include @peel failures(propagate) (%reduction#2)
      : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %func {
      transform.apply_patterns.scf.for_loop_canonicalization
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    %steps = transform.structured.match ops{["linalg.conv_2d_nhwc_hwcf"]} in %root
      : (!transform.any_op) -> !transform.any_op
    %step_1d = transform.structured.decompose %steps : (!transform.any_op) -> !transform.any_op
    transform.structured.vectorize %step_1d : !transform.any_op
    transform.apply_patterns to %func {
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
