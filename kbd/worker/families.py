"""A kernel's schedule family (`matmul`, `conv2d`, `element_wise`, ...) from the ops of its
exported graph: the family of its dominant op, the first of FAMILIES present in the graph.

The graph is `torch.export`'s ATen graph before decompositions, so `linear`, `conv2d`,
`softmax` or `layer_norm` are still whole ops. A graph of nothing but element-wise ops is
`element_wise`; one with an op no family claims and no heavy op has no family (None).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

# Family -> ATen op names (overload stripped), most dominant family first.
FAMILIES: dict[str, tuple[str, ...]] = {
    "conv3d": ("conv3d", "conv_transpose3d"),
    "conv2d": ("conv2d", "conv_transpose2d", "conv1d", "conv_transpose1d", "convolution"),
    "batch_matmul": ("bmm", "baddbmm"),
    "matmul": ("mm", "addmm", "linear", "matmul", "einsum"),
    "matvec": ("mv", "addmv"),
    "softmax": ("softmax", "_softmax", "log_softmax", "_log_softmax"),
    "norm": ("layer_norm", "batch_norm", "group_norm", "instance_norm", "rms_norm"),
    "reduction": ("sum", "mean", "amax", "amin", "max", "min", "prod", "argmax", "argmin",
                  "var", "std", "norm", "cumsum", "cumprod", "logsumexp"),
}  # fmt: skip
# Ops that compute one output element from the same element of each input (or reshape).
ELEMENT_WISE = frozenset([
    "add", "sub", "mul", "div", "relu", "gelu", "silu", "tanh", "sigmoid", "exp", "log", "sqrt",
    "rsqrt", "abs", "neg", "pow", "clamp", "clamp_min", "clamp_max", "hardtanh", "hardsigmoid",
    "hardswish", "leaky_relu", "elu", "selu", "softplus", "mish", "where", "maximum", "minimum",
    "erf", "sin", "cos", "reciprocal", "sign", "floor", "ceil", "round", "square", "view",
    "reshape", "flatten", "unsqueeze", "squeeze", "expand", "contiguous", "clone", "to",
    "dropout", "alias", "detach", "lift_fresh_copy", "_to_copy",
])  # fmt: skip


def op_names(model: torch.nn.Module, args: Sequence) -> list[str]:
    """ATen op names (e.g. `linear`, overloads stripped) of the model's exported graph."""
    exported = torch.export.export(model, tuple(args))
    names = []
    for node in exported.graph.nodes:
        if node.op == "call_function" and hasattr(node.target, "_schema"):
            names.append(node.target._schema.name.split("::", 1)[-1])
    return names


def classify(names: Iterable[str]) -> str | None:
    """The family of a graph with these op names (see the module docstring)."""
    present = {name.rstrip("_") for name in names}  # in-place relu_ is relu
    for family, ops in FAMILIES.items():
        if present & set(ops):
            return family
    if present and present <= ELEMENT_WISE:
        return "element_wise"
    return None


def family_of(model: torch.nn.Module, args: Sequence) -> str | None:
    """The schedule family of a model called with these arguments."""
    return classify(op_names(model, args))
