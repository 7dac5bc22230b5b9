"""A kernel's schedule family (`matmul`, `conv2d`, `element_wise`, ...) from the ops of its
exported graph: the family of its dominant op.

The graph is `torch.export`'s ATen graph before decompositions, so `linear`, `conv2d`,
`softmax` or `layer_norm` are still whole ops. The dominant op is the heavy op (convolutions and
matrix products, HEAVY) doing the most FLOPs, counted from the shapes recorded on the graph's
nodes; without heavy ops, the first of the other FAMILIES present. Products are told apart by
their operands: both batched is `batch_matmul`, a vector operand or a single output column is
`matvec`; attention (`scaled_dot_product_attention`) is `batch_matmul`, recurrent layers (GRU,
LSTM, RNN) `matmul`. A graph of nothing but element-wise ops is `element_wise`; one with an op
no family claims and no heavy op has no family (None).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import torch

# Family -> ATen op names (overload stripped), most dominant family first.
FAMILIES: dict[str, tuple[str, ...]] = {
    "conv3d": ("conv3d", "conv_transpose3d"),
    "conv2d": ("conv2d", "conv_transpose2d", "conv1d", "conv_transpose1d", "convolution"),
    "batch_matmul": ("bmm", "baddbmm", "scaled_dot_product_attention"),
    "matmul": ("mm", "addmm", "linear", "matmul", "einsum", "gru", "lstm", "rnn_tanh", "rnn_relu"),
    "matvec": ("mv", "addmv"),
    "pooling": ("max_pool1d", "max_pool2d", "max_pool3d", "max_pool1d_with_indices",
                "max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool1d", "avg_pool2d",
                "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
                "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d"),
    "softmax": ("softmax", "_softmax", "log_softmax", "_log_softmax"),
    "norm": ("layer_norm", "batch_norm", "group_norm", "instance_norm", "rms_norm"),
    "scan": ("cumsum", "cumprod"),
    "reduction": ("sum", "mean", "amax", "amin", "max", "min", "prod", "argmax", "argmin",
                  "linalg_vector_norm", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
                  "kl_div", "cross_entropy_loss", "nll_loss", "triplet_margin_loss",
                  "var", "std", "norm", "logsumexp"),
}  # fmt: skip
# Families whose ops are weighed by their FLOPs to find the dominant one.
HEAVY = ("conv3d", "conv2d", "batch_matmul", "matmul", "matvec")
# Ops that compute one output element from the same element of each input (or reshape).
ELEMENT_WISE = frozenset([
    "add", "sub", "mul", "div", "relu", "gelu", "silu", "tanh", "sigmoid", "exp", "log", "sqrt",
    "rsqrt", "abs", "neg", "pow", "clamp", "clamp_min", "clamp_max", "hardtanh", "hardsigmoid",
    "hardswish", "leaky_relu", "elu", "selu", "softplus", "mish", "where", "maximum", "minimum",
    "erf", "sin", "cos", "reciprocal", "sign", "floor", "ceil", "round", "square", "view",
    "reshape", "flatten", "unsqueeze", "squeeze", "expand", "contiguous", "clone", "to",
    "dropout", "alias", "detach", "lift_fresh_copy", "_to_copy",
])  # fmt: skip
_OP_FAMILY = {op: family for family, ops in FAMILIES.items() for op in ops}
# Recurrent layers (matmul family: their gates are products) -> gates per step.
_GATES = {"gru": 3, "lstm": 4, "rnn_tanh": 1, "rnn_relu": 1}


def classify(names: Iterable[str], flops: dict[str, int] | None = None) -> str | None:
    """The family of a graph with these op names, given the FLOPs of its heavy families."""
    present = {name.rstrip("_") for name in names}  # in-place relu_ is relu
    weighed = {family: n for family, n in (flops or {}).items() if n > 0}
    if weighed:
        return max(weighed, key=lambda family: (weighed[family], -HEAVY.index(family)))
    for family, ops in FAMILIES.items():
        if present & set(ops):
            return family
    if present and present <= ELEMENT_WISE:
        return "element_wise"
    return None


def family_of(model: torch.nn.Module, args: Sequence) -> str | None:
    """The schedule family of a model called with these arguments (real or meta tensors)."""
    ops = _ops(torch.export.export(model, tuple(args)))
    flops: dict[str, int] = {}
    for op in ops:
        family = _heavy_family(op)
        if family is not None:
            flops[family] = flops.get(family, 0) + _flops(op)
    return classify([op.name for op in ops], flops)


class _Op(NamedTuple):
    """One ATen op of the graph, with the shapes recorded on its node."""

    name: str  # overload stripped, e.g. `addmm`
    node: torch.fx.Node
    operands: list[tuple[int, ...]]  # shapes of its tensor arguments, in order
    out: tuple[int, ...] | None  # shape of its result, when a tensor


def _ops(exported) -> list[_Op]:
    found = []
    for node in exported.graph.nodes:
        if node.op == "call_function" and hasattr(node.target, "_schema"):
            name = node.target._schema.name.split("::", 1)[-1]
            operands = [s for s in map(_shape, node.args) if s is not None]
            found.append(_Op(name, node, operands, _result_shape(node)))
    return found


def _result_shape(node) -> tuple[int, ...] | None:
    """The shape of a node's result, or of its first result (a recurrent layer's output)."""
    meta = node.meta.get("val")
    if isinstance(meta, list | tuple) and meta and isinstance(meta[0], torch.Tensor):
        return tuple(meta[0].shape)
    return _shape(node)


def _shape(value) -> tuple[int, ...] | None:
    meta = getattr(value, "meta", {}).get("val")
    return tuple(meta.shape) if isinstance(meta, torch.Tensor) else None


def _heavy_family(op: _Op) -> str | None:
    """The family of a heavy op, refined by its operands' shapes."""
    family = _OP_FAMILY.get(op.name.rstrip("_"))
    if family not in HEAVY:
        return None
    tensors, out = op.operands, op.out
    if family == "conv2d" and len(tensors) >= 2 and len(tensors[1]) == 5:
        return "conv3d"  # a generic `convolution` with a 3-D kernel
    if op.name in ("matmul", "mm", "addmm", "linear") and len(tensors) >= 2:
        a, b = (tensors[1], tensors[2]) if op.name == "addmm" and len(tensors) >= 3 else tensors[:2]
        if len(a) >= 3 and len(b) >= 3:
            return "batch_matmul"
        if len(a) == 1 or len(b) == 1 or (out is not None and len(out) == 2 and out[-1] == 1):
            return "matvec"
    return family


def _flops(op: _Op) -> int:
    """Twice the multiply-adds of a heavy op, from its shapes (0 when unknown)."""
    name, tensors, out = op.name, op.operands, op.out
    if out is None or not tensors:
        return 0
    if "conv" in name:
        if len(tensors) < 2:
            return 0
        data, weight = tensors[0], tensors[1]
        transposed = name == "convolution" and len(op.node.args) > 6 and op.node.args[6]
        if "transpose" in name or transposed:
            return 2 * math.prod(data) * math.prod(weight[1:])  # every input scatters a kernel
        return 2 * math.prod(out) * math.prod(weight[1:])
    if name in _GATES:  # a recurrent layer: its gates' products with the input and the state
        steps, width, hidden = math.prod(tensors[0][:-1]), tensors[0][-1], out[-1]
        return 2 * steps * _GATES[name] * hidden * (width + hidden)
    if name == "scaled_dot_product_attention" and len(tensors) >= 3:
        query, key, value = tensors[:3]  # softmax(Q K^T) V: two products per head
        return 2 * math.prod(query[:-1]) * key[-2] * (query[-1] + value[-1])
    operand = (
        tensors[1] if name in ("addmm", "baddbmm", "addmv") and len(tensors) > 1 else tensors[0]
    )
    return 2 * math.prod(out) * operand[-1]
