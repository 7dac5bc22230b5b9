// Tile every linalg.matmul into 32x32x32 blocks with scf.for loops (a transform-stage example).
// Runs on linalg-on-tensors, before bufferization; the tiles are lowered to loops later.
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %matmuls = transform.structured.match ops{["linalg.matmul"]} in %root
      : (!transform.any_op) -> !transform.any_op
    %tiled, %loops:3 = transform.structured.tile_using_for %matmuls tile_sizes [32, 32, 32]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op,
                                !transform.any_op)
    transform.yield
  }
}
